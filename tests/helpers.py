"""Test helpers: a controllable clock, an in-process drain, and real worker processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.db import connection

from tasks_engine import testing
from tasks_engine.testing import FakeClock

__all__ = [
    "ROOT",
    "SHORT_PERIODS",
    "FakeClock",
    "WorkerProcess",
    "database_url",
    "drain",
    "wait_for",
]

ROOT = Path(__file__).resolve().parent.parent

# The environment of worker processes whose test waits for the fleet to notice a death: a
# worker silent 4 s is dead (a beat each second) and a leader's lease lasts 3 s (renewed every
# 0.6 s), against the defaults' 10 s and 5 s (tests/settings.py reads them). Still a multiple
# of the beat and of the renewal, so a live worker or leader under load keeps its place.
SHORT_PERIODS = {"TEST_DEAD_WORKER_SECONDS": "4", "TEST_LEADER_LEASE_SECONDS": "3"}


def drain(
    fake: FakeClock | None = None,
    *,
    pairs: list[tuple[str, int]] | None = None,
    horizon: float = 120.0,
    limit: int = 500,
    worker_id: str = "test-worker",
) -> list[str]:
    """`tasks_engine.testing.drain`, jumping only over timers due within two minutes by
    default (retry backoffs, short sleeps): the project's tests say when they mean longer."""
    return testing.drain(fake, pairs=pairs, horizon=horizon, limit=limit, worker_id=worker_id)


# -- real processes ---------------------------------------------------------------------------


def database_url() -> str:
    s = connection.settings_dict
    if connection.vendor == "postgresql":
        user, host, port = s["USER"] or "postgres", s["HOST"] or "127.0.0.1", s["PORT"] or 5432
        return f"postgres://{user}@{host}:{port}/{s['NAME']}"
    return f"sqlite:///{s['NAME']}"


class WorkerProcess:
    def __init__(self, args: list[str], log_dir: Path, tag: str, extra_env: dict[str, str]):
        env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "WORKER_TAG": tag,
            "PYTHONUNBUFFERED": "1",
            **extra_env,
        }
        self.tag = tag
        self.log_path = log_dir / f"worker-{tag}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.send(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@contextmanager
def tmpfs(path: Path, size: str = "1m", *options: str) -> Iterator[Path]:
    """`path` made a filesystem of its own, a tmpfs of `size` (the machine's disks are never
    filled), unmounted at the end."""
    path.mkdir()
    opts = ",".join((f"size={size}", *options))
    subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)
