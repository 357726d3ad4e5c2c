"""Shared by the benchmarks: a throwaway PostgreSQL cluster (fsync on) and Django set-up.

$BENCH_CODE_ROOT (default: this checkout) is the tree whose engine is measured: bench/run_all.py
--baseline points it at a `git worktree` of another commit. That tree comes first on sys.path
and on the workers' PYTHONPATH, ahead of the editable install (whose finder is consulted after
sys.path), and its manage.py starts the workers; bench/ours (the benchmark's own settings and
jobs) is on the path for both trees."""

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


CODE_ROOT = Path(os.environ.get("BENCH_CODE_ROOT") or ROOT).resolve()
OURS_APP = ROOT / "bench" / "ours"
sys.path[:0] = [str(CODE_ROOT), str(OURS_APP)]
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(CODE_ROOT), str(OURS_APP), *filter(None, [os.environ.get("PYTHONPATH")])]
)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")


def engine_code() -> str:
    """The directory of the tasks_engine package this process imported."""
    import tasks_engine

    return str(Path(tasks_engine.__file__).resolve().parent)


@contextmanager
def database(name: str = "bench", settings: dict[str, str] | None = None) -> Iterator[str]:
    """DATABASE_URL of a fresh database: on $BENCH_DATABASE_URL's server, else a throwaway
    cluster started for this run (fsync on: durability is not traded for speed) with
    `settings` in its postgresql.conf."""
    from tests.pgcluster import Cluster

    server = os.environ.get("BENCH_SERVER_URL")
    if server:
        import psycopg

        with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        yield f"{server}/{name}"
        return
    cluster = Cluster(fsync=True, settings=settings).init()
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
            [sys.executable, str(CODE_ROOT / "manage.py"), "runworker", *args],
            env={
                **os.environ,
                "DATABASE_URL": url,
                "PYTHONUNBUFFERED": "1",
                "BENCH_WORKER": "1",
                **(env or {}),
            },
            cwd=CODE_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    proc.log_path = path  # type: ignore[attr-defined]
    return proc


def worker_code(proc: subprocess.Popen[bytes]) -> str | None:
    """The tasks_engine directory a worker started by worker() logged (bench_jobs does)."""
    path: Path = proc.log_path  # type: ignore[attr-defined]
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("bench: tasks_engine from "):
            return str(Path(line.split(" from ", 1)[1]).resolve().parent)
    return None


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
