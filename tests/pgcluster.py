"""A throwaway PostgreSQL cluster of a test's (or benchmark's) own, which it may stop, kill and
restart without touching the shared service. initdb refuses to run as root: as root, every
command runs as the `postgres` user."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg


def pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    for folder in versions:
        if (folder / name).exists():
            return str(folder / name)
    raise FileNotFoundError(f"{name} not found; install PostgreSQL server binaries")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    def __init__(self, *, fsync: bool = True, settings: dict[str, str] | None = None) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="umt-pg-"))
        self.data = self.base / "data"
        self.log = self.base / "postgres.log"
        self.port = free_port()
        self.fsync = fsync
        self.settings = settings or {}
        self._as_postgres = os.geteuid() == 0

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = list(args)
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=120)

    def init(self) -> Cluster:
        if self._as_postgres:
            shutil.chown(self.base, "postgres", "postgres")
        self._run(
            pg_bin("initdb"),
            "-D",
            str(self.data),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
        )
        conf = {
            "port": str(self.port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.base}'",
            "fsync": "on" if self.fsync else "off",
            "max_connections": "200",
            "shared_buffers": "'128MB'",
            **self.settings,
        }
        with open(self.data / "postgresql.conf", "a") as f:
            f.writelines(f"{k} = {v}\n" for k, v in conf.items())
        return self

    def start(self) -> None:
        self._run(pg_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run(pg_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def restart(self) -> None:
        self._run(
            pg_bin("pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-m",
            "fast",
            "-w",
            "restart",
        )

    def url(self, db: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{db}"

    def connect(self, db: str = "postgres") -> psycopg.Connection:
        return psycopg.connect(self.url(db), autocommit=True)

    def createdb(self, name: str) -> str:
        with self.connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def wait_ready(self, timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                with self.connect():
                    return
            except psycopg.OperationalError:
                time.sleep(0.1)
        raise TimeoutError("throwaway PostgreSQL did not come up")

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)
