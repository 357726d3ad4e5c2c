"""Shared by the benchmarks: a throwaway PostgreSQL cluster (fsync on) and Django set-up."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")


@contextmanager
def database(name: str = "bench") -> Iterator[str]:
    """DATABASE_URL of a fresh database: on $BENCH_DATABASE_URL's server, else a throwaway
    cluster started for this run (fsync on: durability is not traded for speed)."""
    from tests.pgcluster import Cluster

    server = os.environ.get("BENCH_SERVER_URL")
    if server:
        import psycopg

        with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        yield f"{server}/{name}"
        return
    cluster = Cluster(fsync=True).init()
    cluster.start()
    try:
        yield cluster.createdb(name)
    finally:
        cluster.destroy()


def setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


LOG_DIR = ROOT / "bench" / "out"


def worker(url: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A `runworker` process; its output goes to bench/out/worker-*.log for diagnosis."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    path = LOG_DIR / f"worker-{time.time_ns()}.log"
    with open(path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "runworker", *args],
            env={**os.environ, "DATABASE_URL": url, "PYTHONUNBUFFERED": "1", **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    proc.log_path = path  # type: ignore[attr-defined]
    return proc


def wait_ready(proc: subprocess.Popen[bytes], *, listening: bool, timeout: float = 60.0) -> None:
    """Until the worker has started (and LISTENs, with NOTIFY on), then 1 s more."""
    marker = "listening for wake-ups" if listening else "worker started"
    path: Path = proc.log_path  # type: ignore[attr-defined]
    end = time.monotonic() + timeout
    while time.monotonic() < end and marker not in path.read_text(errors="replace"):
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited {proc.returncode}: see {path}")
        time.sleep(0.05)
    time.sleep(1.0)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def median(values: list[float]) -> float:
    return statistics.median(values)


class Timer:
    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start
