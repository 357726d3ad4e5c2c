"""DBOS driver: @DBOS.workflow / @DBOS.step on a PostgreSQL system database, one queue registered
with DBOS.register_queue (worker_concurrency = --concurrency, 10 ms polling: the default 1 s
would cap a worker at concurrency jobs per second), Queue.enqueue from a process that listens to
no queue, and worker processes that launch DBOS and wait. A no-op job is a workflow with one
step; the 10-step workflow runs ten steps. Run with the peers' venv python."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import harness
import psycopg
from dbos import DBOS, DBOSConfig, Queue

QUEUE = "bench"
POLL_S = 0.01


@DBOS.step()
def nothing(i: int = 0) -> int:
    return i


@DBOS.workflow()
def noop(k: int | None = None) -> None:
    if k is not None:
        harness.record_pickup(k)
    nothing()


@DBOS.workflow()
def ten_steps() -> int:
    return sum(nothing(i) for i in range(10))


def launch(dsn: str, *, listen: bool, concurrency: int) -> Queue:
    config: DBOSConfig = {
        "name": "bench",
        "system_database_url": dsn,
        "executor_id": f"bench-{os.getpid()}",  # worker_concurrency is per executor id
        "application_version": "bench",  # the same in the enqueuer and every worker
        "log_level": "WARNING",
    }
    DBOS(config=config)
    if not listen:
        DBOS.listen_queues([])
    DBOS.launch()
    return DBOS.register_queue(QUEUE, worker_concurrency=concurrency, polling_interval_sec=POLL_S)


class Conductor:
    def __init__(self, a) -> None:
        self.a = a
        self.queue: Queue

    def setup(self) -> None:
        self.queue = launch(self.a.dsn, listen=False, concurrency=self.a.concurrency)

    def close(self) -> None:
        DBOS.destroy()

    def enqueue_each(self, n: int, fn=noop) -> None:
        for _ in range(n):
            self.queue.enqueue(fn)  # one transaction each

    def enqueue_bulk(self, n: int, fn=noop) -> None:
        # DBOS has no batch enqueue: eight threads enqueue in parallel instead.
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda _: self.queue.enqueue(fn), range(n)))

    def enqueue_timed(self, k: int) -> None:
        self.queue.enqueue(noop, k)

    def steps(self, a, script: str) -> dict:
        singles = []
        procs = harness.spawn_workers(script, a, 1)
        try:
            harness.wait_ready(procs, a)
            time.sleep(1.0)
            with psycopg.connect(a.dsn, autocommit=True) as conn:
                for _ in range(5):
                    wid = self.queue.enqueue(ten_steps).workflow_id
                    while True:
                        row = conn.execute(
                            "SELECT status, updated_at - created_at FROM dbos.workflow_status"
                            " WHERE workflow_uuid = %s",
                            [wid],
                        ).fetchone()
                        if row is not None and row[0] == "SUCCESS":
                            singles.append(float(row[1]))
                            break
                        time.sleep(0.002)
                conn.execute("DELETE FROM dbos.workflow_status")
        finally:
            harness.stop_workers(procs, a)
        self.enqueue_bulk(a.jobs, ten_steps)
        procs = harness.spawn_workers(script, a, 1)
        try:
            _, seconds = harness.watch(a.dsn, progress_sql(a.jobs), a.jobs, procs)
        finally:
            harness.stop_workers(procs, a)
        return {
            "steps_per_s": round(a.jobs * 10 / seconds, 1),
            "single_run_ms_median": round(harness.median(singles), 1),
        }


def progress_sql(n: int) -> str:
    return (
        "SELECT count(*) FILTER (WHERE status = 'ENQUEUED'),"
        " count(*) FILTER (WHERE status IN ('SUCCESS', 'ERROR'))"
        f" FROM dbos.workflow_status WHERE queue_name = '{QUEUE}'"
    )


if __name__ == "__main__":
    a = harness.parse_args(__doc__)
    if a.role == "worker":
        launch(a.dsn, listen=True, concurrency=a.concurrency)
        harness.mark_ready()
        threading.Event().wait()
    else:
        c = Conductor(a)
        result = harness.run_conductor(
            a,
            __file__,
            {
                "setup": c.setup,
                "close": c.close,
                "enqueue_each": c.enqueue_each,
                "enqueue_bulk": c.enqueue_bulk,
                "enqueue_timed": c.enqueue_timed,
                "steps": c.steps,
                "progress_sql": progress_sql(a.jobs),
            },
        )
        harness.emit({"peer": "dbos", **result})
