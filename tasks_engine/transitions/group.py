"""Group commit: several slots' hot writes in one statement (see worker/group_commit.py)."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..exceptions import LeaseLostError
from ..sql import (
    fetchall,
    p_json,
    r_uuid,
)
from ._common import RUN, STEP, Lease

# -- group commit (PostgreSQL workers) ------------------------------------------------------


@dataclass
class GroupWrite:
    """One slot's hot write, sent with other slots' writes in one statement and one commit.

    `kind` is "start" (a function step's fenced INSERT; `result` becomes its id) or "complete"
    (the run's completion; `result` becomes True). Either carries the run's deferred step
    completion. A write whose fence fails gets `error = LeaseLostError`, like a direct write.
    """

    kind: str
    lease: Lease
    deferred: tuple[int, Any, datetime] | None
    at: datetime
    name: str = ""
    attempt: int = 0
    run_pass: int = 0
    output: Any = None
    unreached: list[str] = field(default_factory=list)
    progress: dict[str, Any] | None = None
    result: Any = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


def write_group(writes: list[GroupWrite]) -> None:
    """Every write of the group in one statement: deferred completions first, then step
    starts, then run completions (which reference the first two so that their fences lock the
    run rows before this statement replaces them). Fills each write's result or error."""
    fence = (
        "EXISTS (SELECT 1 FROM {run} r WHERE r.id = {v}.run_id AND r.lease_token = {v}.token"
        " AND r.status = 'running' FOR SHARE)"
    )
    ctes: list[str] = []
    params: list[Any] = []
    deferred = [w for w in writes if w.deferred is not None]
    starts = [w for w in writes if w.kind == "start"]
    completes = [w for w in writes if w.kind == "complete"]
    if deferred:
        rows = ", ".join(
            ["(%s::bigint, %s::jsonb, %s::timestamptz, %s::uuid, %s::uuid)"] * len(deferred)
        )
        for w in deferred:
            assert w.deferred is not None
            step_id, output, finished_at = w.deferred
            params += [step_id, p_json(output), finished_at, w.lease.run_id, w.lease.token]
        ctes.append(f"dv (step_id, output, finished_at, run_id, token) AS (VALUES {rows})")
        ctes.append(
            f"d AS (UPDATE {STEP} s SET status = 'completed', output = dv.output,"
            f" finished_at = dv.finished_at FROM dv WHERE s.id = dv.step_id"
            f" AND s.status = 'running' AND {fence.format(run=RUN, v='dv')} RETURNING s.id)"
        )
    if starts:
        rows = ", ".join(
            ["(%s::uuid, %s::text, %s::int, %s::int, %s::text, %s::uuid, %s::timestamptz)"]
            * len(starts)
        )
        for w in starts:
            params += [w.lease.run_id, w.name, w.attempt, w.run_pass, w.lease.worker_id]
            params += [w.lease.token, w.at]
        ctes.append(
            f"sv (run_id, name, attempt, run_pass, worker_id, token, started_at) AS (VALUES {rows})"
        )
        ctes.append(
            f"i AS (INSERT INTO {STEP} (run_id, name, kind, status, attempt, run_pass, counted,"
            f" worker_id, lease_token, started_at) SELECT sv.run_id, sv.name, 'function',"
            f" 'running', sv.attempt, sv.run_pass, TRUE, sv.worker_id, sv.token, sv.started_at"
            f" FROM sv WHERE {fence.format(run=RUN, v='sv')} RETURNING id, run_id)"
        )
    if completes:
        rows = ", ".join(
            ["(%s::uuid, %s::uuid, %s::jsonb, %s::jsonb, %s::timestamptz, %s::jsonb)"]
            * len(completes)
        )
        for w in completes:
            params += [w.lease.run_id, w.lease.token, p_json(w.output), p_json(w.unreached)]
            params += [w.at, p_json(w.progress)]
        after = "".join(
            f" AND (SELECT count(*) FROM {name}) >= 0"
            for name, present in (("d", deferred), ("i", starts))
            if present
        )
        ctes.append(f"cv (run_id, token, output, unreached, at, progress) AS (VALUES {rows})")
        ctes.append(
            f"c AS (UPDATE {RUN} r SET status = 'completed', output = cv.output,"
            f" unreached_steps = cv.unreached, finished_at = cv.at, updated_at = cv.at,"
            f" lease_token = NULL, available_at = NULL, waiting_on = '', error = NULL,"
            f" progress = COALESCE(cv.progress, r.progress) FROM cv WHERE r.id = cv.run_id"
            f" AND r.lease_token = cv.token AND r.status = 'running'{after} RETURNING r.id)"
        )
    selects = []
    if starts:
        selects.append("SELECT 'i', i.id, i.run_id FROM i")
    if completes:
        selects.append("SELECT 'c', NULL::bigint, c.id FROM c")
    if not selects:  # only deferred completions
        selects.append("SELECT 'd', d.id, NULL::uuid FROM d")
    sql = "WITH " + ", ".join(ctes) + " " + " UNION ALL ".join(selects)
    started: dict[uuid.UUID, int] = {}
    completed: set[uuid.UUID] = set()
    for tag, step_id, run_id in fetchall(sql, params):
        if tag == "i":
            started[r_uuid(run_id)] = int(step_id)
        elif tag == "c":
            completed.add(r_uuid(run_id))
    for w in writes:
        if w.kind == "start" and w.lease.run_id in started:
            w.result = started[w.lease.run_id]
        elif w.kind == "complete" and w.lease.run_id in completed:
            w.result = True
        elif w.kind in ("start", "complete"):
            w.error = LeaseLostError(f"run {w.lease.run_id}: lease lost")
