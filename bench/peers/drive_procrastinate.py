"""Procrastinate driver: an App on a PsycopgConnector, one async no-op task deferred with
defer_async (batch_defer_async to fill the queue), and App.run_worker_async at --concurrency with
its defaults otherwise (LISTEN/NOTIFY on). Run with the peers' venv python."""

from __future__ import annotations

import asyncio

import harness
from procrastinate import App, PsycopgConnector


def make_app(dsn: str) -> App:
    app = App(connector=PsycopgConnector(conninfo=dsn))

    @app.task(name="noop")
    async def noop(k: int | None = None) -> None:
        if k is not None:
            harness.record_pickup(k)

    return app


class Client:
    """One open App and one event loop for the conductor."""

    def __init__(self, dsn: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.app = make_app(dsn)
        self.opened = False

    def __call__(self, coro_fn, *args):
        if not self.opened:
            self.loop.run_until_complete(self.app.open_async())
            self.opened = True
        return self.loop.run_until_complete(coro_fn(self.app, *args))

    def close(self) -> None:
        if self.opened:
            self.loop.run_until_complete(self.app.close_async())
        self.loop.close()


async def setup(app: App) -> None:
    await app.schema_manager.apply_schema_async()


async def enqueue_each(app: App, n: int) -> None:
    task = app.tasks["noop"]
    for _ in range(n):
        await task.defer_async()  # one transaction each


async def enqueue_bulk(app: App, n: int) -> None:
    task = app.tasks["noop"]
    for start in range(0, n, 1000):
        await task.batch_defer_async(*[{} for _ in range(min(1000, n - start))])


async def enqueue_timed(app: App, k: int) -> None:
    await app.tasks["noop"].defer_async(k=k)


async def worker(dsn: str, concurrency: int) -> None:
    app = make_app(dsn)
    async with app.open_async():
        harness.mark_ready()
        await app.run_worker_async(concurrency=concurrency)


if __name__ == "__main__":
    a = harness.parse_args(__doc__)
    if a.role == "worker":
        asyncio.run(worker(a.dsn, a.concurrency))
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
                "close": run.close,
                "progress_sql": "SELECT count(*) FILTER (WHERE status = 'todo'), count(*)"
                " FILTER (WHERE status IN ('succeeded', 'failed')) FROM procrastinate_jobs",
            },
        )
        harness.emit({"peer": "procrastinate", **result})
