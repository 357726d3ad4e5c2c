"""A PgBouncer of a test's (or benchmark's) own, in transaction mode, on a free port in front
of a throwaway cluster (tests/pgcluster.py). Debian's `pgbouncer` package; it refuses to run as
root, so as root it runs as the `postgres` user, like the cluster."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

from tests.pgcluster import Cluster, free_port

BINARY = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def version() -> tuple[int, ...]:
    """`pgbouncer --version`'s first line, 'PgBouncer 1.18.0', as (1, 18, 0). From 1.21 it can
    keep protocol-level prepared statements (max_prepared_statements); before, none."""
    out = subprocess.run([BINARY, "--version"], capture_output=True, text=True, check=True)
    return tuple(int(p) for p in out.stdout.split()[1].split("."))


class Bouncer:
    def __init__(self, cluster: Cluster, dbname: str, *, pool_size: int = 20) -> None:
        self.cluster = cluster
        self.dbname = dbname
        self.port = free_port()
        self.base = cluster.base / "pgbouncer"
        self.pool_size = pool_size
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.dbname}"

    def start(self) -> Bouncer:
        self.base.mkdir(exist_ok=True)
        (self.base / "userlist.txt").write_text('"postgres" ""\n')
        ini = self.base / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"{self.dbname} = host=127.0.0.1 port={self.cluster.port} dbname={self.dbname}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.base / 'userlist.txt'}\n"
            "pool_mode = transaction\n"
            "max_client_conn = 500\n"
            f"default_pool_size = {self.pool_size}\n"
            f"logfile = {self.base / 'pgbouncer.log'}\n"
            # psycopg and libpq send these at start-up; PgBouncer refuses unknown ones
            "ignore_startup_parameters = extra_float_digits,options\n"
        )
        cmd = [BINARY, str(ini)]
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres", "postgres")
            for f in self.base.iterdir():
                shutil.chown(f, "postgres", "postgres")
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        end = time.monotonic() + 30
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited: {self.log()}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.05)
        raise TimeoutError(f"pgbouncer did not listen: {self.log()}")

    def log(self) -> str:
        path = self.base / "pgbouncer.log"
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
