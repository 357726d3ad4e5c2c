"""PgQueuer driver: Queries.enqueue on an asyncpg connection (PgQueuer's primary driver) and a
QueueManager worker with one no-op entrypoint. In-flight jobs are capped at --concurrency, with a
dequeue batch of half that (PgQueuer requires max_concurrent_tasks >= 2 x batch_size);
--concurrency 0 runs PgQueuer's defaults (batch 10, no cap). --batch-size B sets the batch instead
(the async rows: PgQueuer's default batch, 10, capped at --concurrency / 2). Run with the peers'
venv python."""

from __future__ import annotations

import asyncio
import json

import asyncpg
import harness
from pgqueuer import AsyncpgDriver, Queries, QueueManager
from pgqueuer.models import Job


class Client:
    """One connection and one event loop for the conductor's enqueues."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.loop = asyncio.new_event_loop()
        self.q: Queries | None = None

    def __call__(self, coro_fn, *args):
        if self.q is None:
            conn = self.loop.run_until_complete(asyncpg.connect(self.dsn))
            self.q = Queries(AsyncpgDriver(conn))
        return self.loop.run_until_complete(coro_fn(self.q, *args))


async def setup(q: Queries) -> None:
    await q.install()


async def enqueue_each(q: Queries, n: int) -> None:
    for _ in range(n):
        await q.enqueue("noop", None)  # autocommit: each enqueue is its own transaction


async def enqueue_bulk(q: Queries, n: int) -> None:
    for start in range(0, n, 1000):
        k = min(1000, n - start)
        await q.enqueue(["noop"] * k, [None] * k, [0] * k)


async def enqueue_timed(q: Queries, k: int) -> None:
    await q.enqueue("noop", json.dumps({"k": k}).encode())


async def worker(dsn: str, concurrency: int, batch_size: int = 0) -> None:
    conn = await asyncpg.connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        if job.payload:
            harness.record_pickup(json.loads(job.payload)["k"])

    harness.mark_ready()
    if concurrency:
        batch = batch_size or max(1, concurrency // 2)
        await qm.run(batch_size=batch, max_concurrent_tasks=concurrency)
    else:
        await qm.run()


if __name__ == "__main__":
    a = harness.parse_args(__doc__)
    if a.role == "worker":
        asyncio.run(worker(a.dsn, a.concurrency, a.batch_size))
    else:
        run = Client(a.dsn)
        result = harness.run_conductor(
            a,
            __file__,
            {
                "setup": lambda: run(setup),
                "enqueue_each": lambda n: run(enqueue_each, n),
                "enqueue_bulk": lambda n: run(enqueue_bulk, n),
                "enqueue_timed": lambda k: run(enqueue_timed, k),
                "progress_sql": "SELECT count(*) FILTER (WHERE status = 'queued'),"
                f" {a.jobs} - count(*) FROM pgqueuer",
            },
        )
        harness.emit({"peer": "pgqueuer", **result})
