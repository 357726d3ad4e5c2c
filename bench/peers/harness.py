"""What every peer driver shares: the command line, a fresh database, worker processes,
watching a drain from outside, pickup-latency records and worker RSS sampling.

A driver is one script that is both the conductor (``--mode ...``) and, re-run by itself with
``--role worker``, the worker. Only psycopg and the standard library are used here, so this
runs in the peers' virtual environment.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

LAT_FILE = "BENCH_LATENCY_FILE"
READY_FILE = "BENCH_READY_FILE"


def parse_args(description: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--dsn", required=True, help="database URL; the database is recreated")
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--processes", type=int, default=1)
    p.add_argument(
        "--batch-size",
        type=int,
        default=0,
        help="jobs fetched per dequeue, for a peer that has the setting (0: the driver's rule)",
    )
    p.add_argument(
        "--mode", choices=["enqueue", "enqueue_bulk", "drain", "latency", "steps"], default="drain"
    )
    p.add_argument("--gap", type=float, default=0.02, help="latency: seconds between enqueues")
    p.add_argument(
        "--max-seconds",
        type=float,
        default=0,
        help="drain: measure at most this long after the first job leaves the queue (0: all)",
    )
    p.add_argument("--role", choices=["main", "worker"], default="main", help=argparse.SUPPRESS)
    p.add_argument("--keep-db", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args()


def fresh_database(dsn: str) -> None:
    """Drop and create the database named in ``dsn`` (through the server's `postgres` db)."""
    parts = urlsplit(dsn)
    name = parts.path.lstrip("/")
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def emit(result: dict[str, Any]) -> None:
    print(json.dumps(result), flush=True)


# -- workers ---------------------------------------------------------------------------------


def spawn_workers(
    script: str, a: argparse.Namespace, n: int, env: dict[str, str] | None = None
) -> list[subprocess.Popen[bytes]]:
    """Start ``n`` worker processes of ``script``; each writes a ready marker when set up."""
    procs = []
    for i in range(n):
        cmd = [sys.executable, script, "--role", "worker", "--dsn", a.dsn, "--mode", a.mode]
        cmd += ["--concurrency", str(a.concurrency), "--jobs", str(a.jobs)]
        cmd += ["--batch-size", str(a.batch_size)]
        penv = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        penv[READY_FILE] = f"{ready_base(a)}.{i}"
        Path(penv[READY_FILE]).unlink(missing_ok=True)
        log = open(f"{ready_base(a)}.{i}.log", "wb")  # noqa: SIM115 - lives as long as the child
        procs.append(
            subprocess.Popen(cmd, env=penv, stdout=log, stderr=subprocess.STDOUT, stdin=None)
        )
    return procs


def ready_base(a: argparse.Namespace) -> str:
    return f"/tmp/bench-peer-{os.getpid()}-{a.mode}"


def mark_ready() -> None:
    """Called by a worker once it is connected and about to wait for jobs."""
    path = os.environ.get(READY_FILE)
    if path:
        Path(path).write_text(str(os.getpid()))


def wait_ready(procs: list[subprocess.Popen[bytes]], a: argparse.Namespace, timeout=60) -> None:
    end = time.monotonic() + timeout
    for i, p in enumerate(procs):
        marker = Path(f"{ready_base(a)}.{i}")
        while not marker.exists():
            if p.poll() is not None:
                raise RuntimeError(f"worker exited ({p.returncode}): {worker_log_tail(a, i)}")
            if time.monotonic() > end:
                raise TimeoutError("worker did not get ready")
            time.sleep(0.01)


def worker_log_tail(a: argparse.Namespace, i: int, lines: int = 5) -> str:
    try:
        text = Path(f"{ready_base(a)}.{i}.log").read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join(text.strip().splitlines()[-lines:])


def stop_workers(procs: list[subprocess.Popen[bytes]], a: argparse.Namespace) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    end = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    for i in range(len(procs)):
        for suffix in ("", ".log"):
            Path(f"{ready_base(a)}.{i}{suffix}").unlink(missing_ok=True)


# -- watching a drain --------------------------------------------------------------------------


def watch(
    dsn: str,
    sql: str | Callable[[], tuple[int, int]],
    n: int,
    procs: list[subprocess.Popen[bytes]],
    timeout: float = 600,
    max_seconds: float = 0,
) -> tuple[int, float]:
    """Poll ``sql`` (returning: still queued, finished; or a function returning them, for a
    peer whose queue is not in PostgreSQL) every 10 ms; (jobs finished, seconds) from the first
    job leaving the queue to the last one finishing, as seen in the database (each event placed
    mid-way between the poll that saw it and the one before). With ``max_seconds``, stop
    counting that long after the first job left the queue."""
    t0 = None
    end = time.monotonic() + timeout
    with contextlib.ExitStack() as stack:
        if callable(sql):
            poll = sql
        else:
            conn = stack.enter_context(psycopg.connect(dsn, autocommit=True))

            def poll() -> tuple[int, int]:
                row = conn.execute(sql).fetchone()
                assert row is not None, sql
                return row[0], row[1]

        last = time.perf_counter()
        while True:
            queued, finished = poll()
            now = time.perf_counter()
            if t0 is None and queued < n:
                t0 = (last + now) / 2
            if finished >= n and t0 is not None:
                return n, max((last + now) / 2 - t0, now - last)
            if max_seconds and t0 is not None and now - t0 >= max_seconds:
                return finished, now - t0
            if time.monotonic() > end:
                raise TimeoutError(f"only {finished}/{n} finished")
            if all(p.poll() is not None for p in procs):
                raise RuntimeError(f"workers exited with {finished}/{n} finished")
            last = now
            time.sleep(0.01)


class RssSampler:
    """Peak VmRSS (MiB) of each process tree rooted at the given pids, sampled every 50 ms."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.peak: dict[int, float] = dict.fromkeys(pids, 0.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in self.pids:
                self.peak[pid] = max(self.peak[pid], tree_rss_mib(pid))
            self._stop.wait(0.05)

    def max_mib(self) -> float:
        return round(max(self.peak.values(), default=0.0), 1)


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            out += [int(c) for c in task.read_text().split()]
    return out


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def tree_rss_mib(pid: int) -> float:
    return rss_mib(pid) + sum(tree_rss_mib(c) for c in children(pid))


# -- pickup latency ----------------------------------------------------------------------------


def latency_file(a: argparse.Namespace) -> Path:
    return Path(f"{ready_base(a)}.latency")


def record_pickup(k: int) -> None:
    """In a job, first thing: append "k wall-clock-start" (the enqueuer has job k's commit
    time; bench/ours/bench_jobs records our engine's jobs the same way)."""
    path = os.environ.get(LAT_FILE)
    if path:
        now = time.time()
        with open(path, "a") as f:
            f.write(f"{k} {now:.6f}\n")


def latency_result(
    a: argparse.Namespace, committed: dict[int, float], timeout: float = 30
) -> dict[str, Any]:
    """p50/p99 of (job k's own start - the time its enqueue's commit returned), ms."""
    path = latency_file(a)
    end = time.monotonic() + timeout
    started: dict[str, str] = {}
    while time.monotonic() < end:
        started = dict(x.split() for x in path.read_text().splitlines()) if path.exists() else {}
        if len(started) >= len(committed):
            break
        time.sleep(0.05)
    path.unlink(missing_ok=True)
    if len(started) < len(committed):
        raise TimeoutError(f"only {len(started)}/{len(committed)} jobs started")
    values = [(float(started[str(k)]) - t) * 1000 for k, t in committed.items()]
    return {"p50_ms": round(percentile(values, 50), 2), "p99_ms": round(percentile(values, 99), 2)}


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def median(values: list[float]) -> float:
    return statistics.median(values)


def run_conductor(a: argparse.Namespace, script: str, peer: dict[str, Any]) -> dict[str, Any]:
    """The conductor's part of every mode, given the peer's own operations:

    ``setup()``: install the schema; ``enqueue_each(n)``: n enqueues, one transaction each;
    ``enqueue_bulk(n)``: n jobs queued however the peer batches best; ``enqueue_timed(k)``: one
    job (its own transaction) whose payload carries k, for its record_pickup(k);
    ``progress_sql``: (still queued, finished), or ``progress()`` returning them;
    optional: ``steps(a, script)`` for the 10-step workflow, ``worker_env``, ``close()``,
    ``concurrency`` (what the worker really runs at, when it has no such setting).
    """
    if not a.keep_db:
        fresh_database(a.dsn)
    try:
        peer["setup"]()
        return _conduct(a, script, peer)
    finally:
        if "close" in peer:
            peer["close"]()


def _conduct(a: argparse.Namespace, script: str, peer: dict[str, Any]) -> dict[str, Any]:
    base = {"mode": a.mode, "jobs": a.jobs}
    env = peer.get("worker_env", {})
    if a.mode == "enqueue":
        t = time.perf_counter()
        peer["enqueue_each"](a.jobs)
        return {**base, "per_s": round(a.jobs / (time.perf_counter() - t), 1)}
    if a.mode == "enqueue_bulk":  # the peer's batch enqueue (bench/enqueue_many.py)
        t = time.perf_counter()
        peer["enqueue_bulk"](a.jobs)
        return {**base, "per_s": round(a.jobs / (time.perf_counter() - t), 1)}
    if a.mode == "drain":
        peer["enqueue_bulk"](a.jobs)
        procs = spawn_workers(script, a, a.processes, env)
        try:
            with RssSampler([p.pid for p in procs]) as rss:
                progress = peer.get("progress") or peer["progress_sql"]
                done, seconds = watch(a.dsn, progress, a.jobs, procs, max_seconds=a.max_seconds)
        finally:
            stop_workers(procs, a)
        return {
            **base,
            "processes": a.processes,
            "concurrency": peer.get("concurrency", a.concurrency),
            "finished": done,
            "per_s": round(done / seconds, 1),
            "rss_mib": rss.max_mib(),
        }
    if a.mode == "latency":
        latency_file(a).unlink(missing_ok=True)
        procs = spawn_workers(script, a, 1, {**env, LAT_FILE: str(latency_file(a))})
        try:
            wait_ready(procs, a)
            time.sleep(1.0)  # idle, as bench/engine.py leaves its worker before enqueueing
            committed: dict[int, float] = {}
            for k in range(a.jobs):
                peer["enqueue_timed"](k)
                committed[k] = time.time()  # the enqueue returned: its commit is acknowledged
                time.sleep(a.gap)
            return {**base, **latency_result(a, committed)}
        finally:
            stop_workers(procs, a)
    if a.mode == "steps" and "steps" in peer:
        return {**base, **peer["steps"](a, script)}
    raise SystemExit(f"mode {a.mode} is not supported by this peer")
