"""Worker rows: who is up, what it serves, what it holds.

Each `runworker` process keeps one `Worker` row, written by one upsert every `BEAT_SECONDS`
from its heartbeat thread (the thread that renews its leases: a worker whose leases cannot be
renewed should not look alive either). Beats are stamped with the database's clock, so workers
on hosts with skewed clocks compare fairly. A graceful stop deletes the row.

A worker whose beat is older than DEAD_WORKER_SECONDS is dead (`kill -9`, a lost host): the
leader's dead-worker service (`transitions.reap_dead_workers`: it writes run rows) sets its
runs' lease expiry to its last beat (and their `due_at` to the reap, for the claim-delay
metric), so the claim's expired-lease source takes them at once instead of at lease expiry,
and deletes the row. That is safe even for a worker that was only stalled: its writes are
fenced by the lease token, and a lease nobody took over is still its own (the heartbeat
renews it, and the next beat re-inserts the row).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from .. import clock
from ..conf import engine_settings
from ..db.sql import db_clock, db_now_sql, execute, p_dt, p_json
from ..models import Worker, WorkflowRun
from ..transitions.dead_workers import alive
from .run_groups import unfinished_groups
from .worker_process import WorkerProcess

WORKER = Worker._meta.db_table
UNFINISHED = ("pending", "running", "waiting")


def beat_seconds() -> float:
    """About every 2 s, and at least four beats per DEAD_WORKER_SECONDS."""
    return min(2.0, engine_settings().dead_worker_seconds / 4)


class Registration:
    """A worker process's row: `beat()` inserts or refreshes it, `remove()` deletes it."""

    def __init__(self, worker: WorkerProcess) -> None:
        self.worker = worker
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.started_at = clock.now()
        self._next = 0.0
        self._lock = threading.Lock()  # a beat in flight never lands after remove()
        self._removed = False

    def beat(self) -> None:
        """One statement: an upsert, so a row reaped while this worker was stalled comes back."""
        with self._lock:
            if not self._removed:
                self._beat()

    def _beat(self) -> None:
        w = self.worker
        now_sql, now_params = db_now_sql()
        execute(
            f"""INSERT INTO {WORKER} (id, host, pid, queues, tasks, concurrency, started_at,
                    last_heartbeat, runs_held)
                VALUES (%s, %s, %s, %s, %s, %s, %s, {now_sql}, %s)
                ON CONFLICT (id) DO UPDATE SET last_heartbeat = EXCLUDED.last_heartbeat,
                    runs_held = EXCLUDED.runs_held""",
            [
                w.id,
                self.host,
                self.pid,
                p_json(list(w.queues or [])),
                p_json([f"{n}@{v}" for n, v in w.pairs]),
                w.concurrency,
                p_dt(self.started_at),
                *now_params,
                len(w.held()),
            ],
        )
        self._next = time.monotonic() + beat_seconds()

    def beat_if_due(self, now: float) -> None:
        if now >= self._next:
            self.beat()

    def remove(self) -> None:
        with self._lock:
            self._removed = True
            Worker.objects.filter(pk=self.worker.id).delete()


# -- reading ----------------------------------------------------------------------------------


# The reading functions take `using`: the alias to read (the admin's read alias, a replica);
# None, the engine's.


def alive_since(using: str | None = None) -> datetime:
    """Workers that beat at or after this (database) time are alive."""
    return db_clock(using) - timedelta(seconds=engine_settings().dead_worker_seconds)


@dataclass(frozen=True)
class WorkerView:
    id: str
    host: str
    pid: int
    queues: list[str]
    tasks: list[str]
    concurrency: int
    started_at: datetime
    last_heartbeat: datetime
    runs_held: int
    alive: bool
    leader: bool
    runs: list[str]

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["started_at"] = self.started_at.isoformat()
        d["last_heartbeat"] = self.last_heartbeat.isoformat()
        return d


def list_workers() -> list[WorkerView]:
    """Every worker row (the dead ones until the leader reaps them), oldest first, with the
    runs each holds and which one is the maintenance leader."""
    from .leader import current_leader

    since = alive_since()
    leader = current_leader()
    rows = list(Worker.objects.order_by("started_at"))
    held: dict[str, list[str]] = {}
    for run_id, worker_id in WorkflowRun.objects.filter(
        status="running", worker_id__in=[w.id for w in rows]
    ).values_list("id", "worker_id"):
        held.setdefault(worker_id, []).append(str(run_id))
    return [
        WorkerView(
            id=w.id,
            host=w.host,
            pid=w.pid,
            queues=list(w.queues),
            tasks=list(w.tasks),
            concurrency=w.concurrency,
            started_at=w.started_at,
            last_heartbeat=w.last_heartbeat,
            runs_held=w.runs_held,
            alive=w.last_heartbeat >= since,
            leader=leader is not None and leader.worker_id == w.id,
            runs=sorted(held.get(w.id, [])),
        )
        for w in rows
    ]


def unserved_runs(
    live: list[tuple[list[str], list[str]]] | None = None, using: str | None = None
) -> list[dict[str, Any]] | None:
    """Unfinished runs whose (task, version) and queue no live worker serves, grouped:
    `[{"task", "version", "queue", "runs", "at_least"}]` (run_groups: counts past a bound are
    lower bounds). None when no worker is alive: then nothing is
    known about what the fleet serves (a deploy in progress, or workers not started yet).
    `live`: the live workers' filters, when the caller has read them already."""
    live = live_filters(using) if live is None else live
    if not live:
        return None
    return [
        {
            "task": g.task,
            "version": g.version,
            "queue": g.queue,
            "runs": g.runs,
            "at_least": g.at_least,
        }
        for g in unfinished_groups(using)
        if not any(serves(w, g.task, g.version, g.queue) for w in live)
    ]


def served(task: str, version: int, queue: str, using: str | None = None) -> bool | None:
    """Whether a live worker serves runs of (task, version) in `queue` (None: no worker alive)."""
    live = live_filters(using)
    if not live:
        return None
    return any(serves(w, task, version, queue) for w in live)


def live_filters(using: str | None = None) -> list[tuple[list[str], list[str]]]:
    """(queues, tasks) of every live worker."""
    rows = Worker.objects.using(using).filter(alive()).values_list("queues", "tasks")
    return [(list(q), list(t)) for q, t in rows]


def serves(worker: tuple[list[str], list[str]], task: str, version: int, queue: str) -> bool:
    queues, tasks = worker
    return f"{task}@{version}" in tasks and (not queues or queue in queues)
