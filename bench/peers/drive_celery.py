"""Celery driver: Celery on Redis (a redis-server of its own on a free port, started by the
conductor and stopped after), `task_acks_late=True`, the worker on its defaults (the prefork
pool, concurrency = the number of CPUs, prefetch multiplier 4) unless --concurrency N > 0.
`--processes N` starts N worker instances (`celery worker`, each with its own pool).

Enqueue is `noop.delay()`, one publish per call (Redis has no transactions to speak of: each
publish is acknowledged when redis-server has it in memory; its defaults keep no journal, only
a snapshot now and then, so an acknowledged job is not on disk as ours and PgQueuer's are).
A drain counts a job finished when it has left both the queue and the unacked set (with
acks_late a job is acked after it ran): nothing is written per job for the count. `--dsn` is
taken for the harness's sake (a PostgreSQL database is created and unused). Run with the peers'
venv python."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Any

import harness
import redis
from celery import Celery, signals

BROKER_ENV = "BENCH_CELERY_BROKER"
QUEUE = "celery"

app = Celery("bench_celery", broker=os.environ.get(BROKER_ENV, "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_acks_late=True,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="noop")
def noop(k: int | None = None) -> None:
    if k is not None:
        harness.record_pickup(k)


@signals.worker_ready.connect
def _ready(**_: Any) -> None:
    harness.mark_ready()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Redis:
    """A redis-server on its defaults but its port, and its directory: a temporary one."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="bench-celery-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise SystemExit("redis-server not found (apt-get install redis-server)")
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)
        end = time.monotonic() + 10
        while True:
            with contextlib.suppress(redis.ConnectionError):
                if client.ping():
                    return
            if time.monotonic() > end:
                raise TimeoutError("redis-server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def enqueue_each(n: int) -> None:
    for _ in range(n):
        noop.delay()


def enqueue_bulk(n: int) -> None:
    with app.producer_or_acquire() as producer:
        for _ in range(n):
            noop.apply_async(producer=producer)


def progress(url: str, n: int) -> Any:
    client = redis.Redis.from_url(url)

    def still_queued_and_finished() -> tuple[int, int]:
        pipe = client.pipeline(transaction=False)
        pipe.llen(QUEUE)
        pipe.hlen("unacked")
        queued, unacked = pipe.execute()
        return int(queued), n - int(queued) - int(unacked)

    return still_queued_and_finished


def worker(concurrency: int) -> None:
    name = f"w{os.getpid()}@%h"
    argv = ["worker", "--loglevel=WARNING", "-n", name]
    if concurrency:
        argv += ["--concurrency", str(concurrency)]
    app.worker_main(argv)


if __name__ == "__main__":
    a = harness.parse_args(__doc__)
    if a.role == "worker":
        worker(a.concurrency)
    else:
        server = Redis()
        app.conf.broker_url = server.url
        result = harness.run_conductor(
            a,
            __file__,
            {
                "setup": server.start,
                "close": server.stop,
                "enqueue_each": enqueue_each,
                "enqueue_bulk": enqueue_bulk,
                "enqueue_timed": lambda k: noop.delay(k),
                "progress": progress(server.url, a.jobs),
                "worker_env": {BROKER_ENV: server.url},
                "concurrency": a.concurrency or os.cpu_count(),
            },
        )
        harness.emit({"peer": "celery", **result})
