"""Fault tests run against a throwaway PostgreSQL cluster they may restart, stop or starve."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.helpers import ROOT
from tests.pgcluster import Cluster, pg_bin


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    try:
        pg_bin("initdb")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    c = Cluster(fsync=False).init()
    c.start()
    yield c
    c.destroy()


class FaultDb:
    """A fresh, migrated database on the throwaway cluster, plus helpers to drive it."""

    def __init__(self, cluster: Cluster, tmp: Path) -> None:
        self.cluster = cluster
        self.name = f"fault_{uuid.uuid4().hex[:8]}"
        self.url = cluster.createdb(self.name)
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        self.manage("migrate", "--verbosity", "0")

    def env(self, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "DATABASE_URL": self.url,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONUNBUFFERED": "1",
            **extra,
        }

    def manage(self, *args: str) -> str:
        out = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    def enqueue(self, task: str, input: str = "{}") -> str:
        import json

        return json.loads(self.manage("tasks", "enqueue", task, "--input", input, "--json"))[
            "run_id"
        ]

    def worker(self, *args: str, tag: str = "w") -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{tag}.log", "wb")  # noqa: SIM115 - lives with the process
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "runworker", *args],
            cwd=ROOT,
            env=self.env(WORKER_TAG=tag),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def log(self, tag: str) -> str:
        return (self.tmp / f"{tag}.log").read_text(errors="replace")

    def query(self, sql: str, *params: object) -> list[tuple]:
        for _ in range(50):
            try:
                with psycopg.connect(self.url, autocommit=True) as conn:
                    return conn.execute(sql, params).fetchall()
            except psycopg.OperationalError:
                import time

                time.sleep(0.2)
        raise RuntimeError("fault database unreachable")

    def scalar(self, sql: str, *params: object) -> object:
        return self.query(sql, *params)[0][0]

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def fault_db(cluster: Cluster, tmp_path: Path) -> Iterator[FaultDb]:
    db = FaultDb(cluster, tmp_path)
    yield db
    db.close()
