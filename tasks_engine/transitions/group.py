"""Group commit: several slots' hot writes in one statement (see worker/group_commit.py)."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .. import clock, flow
from ..exceptions import LeaseLostError
from ..sql import (
    fetchall,
    json_rows,
    r_uuid,
)
from ._common import RUN, STEP, Claimed, Lease
from .claims import CLAIM_COLUMNS, ClaimRequest, claim_statement, claimed_from_rows
from .flow_claims import claim_guarded


# A row set from `json_to_recordset` has no statistics (the planner guesses 100 rows): spelling
# the join key as `= ANY(ARRAY(...))` as well keeps the lookup on the primary key, instead of a
# scan of the table that grows with it.
def _by_key(column: str, rows: str, key: str) -> str:
    return f"{column} = ANY(ARRAY(SELECT {key} FROM {rows})) AND {column} = {rows}.{key}"


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
    detached: bool = False  # nobody waits for it (worker/group_commit.py)
    done: threading.Event | None = None  # set when committed (the waiting slot's own event)


def write_group(writes: list[GroupWrite], claim: ClaimRequest | None = None) -> list[Claimed]:
    """Every write of the group in one statement: deferred completions first, then step
    starts, then run completions (which reference the first two so that their fences lock the
    run rows before this statement replaces them). Fills each write's result or error.

    With `claim`, the same statement (and commit) claims the runs that take over the slots
    these completions free, and returns them: under a backlog a slot gets its next run without
    a round trip of its own. Each part's rows travel as arrays, so the statement's text (and
    its prepared plan) does not depend on how many writes the group holds.

    A claim that flow control guards (flow.py) is not part of the statement: it runs after the
    group committed, so the places the completions free are free for it."""
    if claim is not None and flow.guarded(claim.pairs, claim.queues):
        write_group(writes)
        return claim_after_group(claim)
    fence = (
        "EXISTS (SELECT 1 FROM {run} r WHERE r.id = {v}.run_id AND r.lease_token = {v}.token"
        " FOR SHARE)"
    )
    # No step starts once cancel is requested (the holder then ends the run canceled).
    start_fence = fence.replace(" FOR SHARE", " AND r.cancel_requested_at IS NULL FOR SHARE")
    ctes: list[str] = []
    params: list[Any] = []
    deferred = [w for w in writes if w.deferred is not None]
    starts = [w for w in writes if w.kind == "start"]
    completes = [w for w in writes if w.kind == "complete"]
    if deferred:
        rows = []
        for w in deferred:
            assert w.deferred is not None
            step_id, output, finished_at = w.deferred
            rows.append(
                {
                    "step_id": step_id,
                    "output": output,
                    "finished_at": finished_at,
                    "run_id": w.lease.run_id,
                    "token": w.lease.token,
                }
            )
        params.append(json_rows(rows))
        ctes.append(
            "dv AS (SELECT * FROM json_to_recordset(%s::json) AS t (step_id bigint,"
            " output jsonb, finished_at timestamptz, run_id uuid, token uuid))"
        )
        ctes.append(
            f"d AS (UPDATE {STEP} s SET status = 'completed', output = dv.output,"
            f" finished_at = dv.finished_at FROM dv WHERE {_by_key('s.id', 'dv', 'step_id')}"
            f" AND s.status = 'running' AND {fence.format(run=RUN, v='dv')} RETURNING s.id)"
        )
    if starts:
        rows = [
            {
                "run_id": w.lease.run_id,
                "name": w.name,
                "attempt": w.attempt,
                "run_pass": w.run_pass,
                "worker_id": w.lease.worker_id,
                "token": w.lease.token,
                "started_at": w.at,
            }
            for w in starts
        ]
        params.append(json_rows(rows))
        ctes.append(
            "sv AS (SELECT * FROM json_to_recordset(%s::json) AS t (run_id uuid, name text,"
            " attempt int, run_pass int, worker_id text, token uuid, started_at timestamptz))"
        )
        ctes.append(
            f"i AS (INSERT INTO {STEP} (run_id, name, kind, status, attempt, run_pass, counted,"
            f" worker_id, lease_token, started_at) SELECT sv.run_id, sv.name, 'function',"
            f" 'running', sv.attempt, sv.run_pass, TRUE, sv.worker_id, sv.token, sv.started_at"
            f" FROM sv WHERE {start_fence.format(run=RUN, v='sv')}"
            f" RETURNING id, run_id, lease_token)"
        )
    if completes:
        rows = [
            {
                "run_id": w.lease.run_id,
                "token": w.lease.token,
                "output": w.output,
                "unreached": w.unreached,
                "at": w.at,
                "progress": w.progress,
            }
            for w in completes
        ]
        params.append(json_rows(rows))
        after = "".join(
            f" AND (SELECT count(*) FROM {name}) >= 0"
            for name, present in (("d", deferred), ("i", starts))
            if present
        )
        ctes.append(
            "cv AS (SELECT * FROM json_to_recordset(%s::json) AS t (run_id uuid, token uuid,"
            " output jsonb, unreached jsonb, at timestamptz, progress jsonb))"
        )
        ctes.append(
            f"c AS (UPDATE {RUN} r SET status = 'completed', output = cv.output,"
            f" unreached_steps = cv.unreached, finished_at = cv.at, updated_at = cv.at,"
            f" lease_token = NULL, available_at = NULL, waiting_on = '', error = NULL,"
            f" progress = COALESCE(cv.progress, r.progress)"
            f" FROM cv WHERE {_by_key('r.id', 'cv', 'run_id')}"
            f" AND r.lease_token = cv.token{after} RETURNING r.id, cv.token)"
        )
    pad = ""
    if claim is not None:
        claim_ctes, update, claim_params = claim_statement(
            claim, clock.now(), exclude=[w.lease.run_id for w in writes]
        )
        ctes += [claim_ctes, f"k AS ({update})"]
        params += claim_params
        pad = ", NULL" * (len(CLAIM_COLUMNS) - 1)
    # The claim's rows go first: UNION resolves the padding NULLs' types from them.
    # Rows: (tag, step id, lease token, run id or the claimed run's columns). Results are
    # matched to writes by (run, lease token): a stale and a fresh lease of one run may share a
    # group, and only the fresh one's fence passes.
    selects = ["SELECT 'k', NULL::bigint, NULL::uuid, k.* FROM k"] if claim is not None else []
    if starts:
        selects.append(f"SELECT 'i', i.id, i.lease_token, i.run_id{pad} FROM i")
    if completes:
        selects.append(f"SELECT 'c', NULL::bigint, c.token, c.id{pad} FROM c")
    if not starts and not completes:  # only deferred completions
        selects.append(f"SELECT 'd', d.id, NULL::uuid, NULL::uuid{pad} FROM d")
    sql = "WITH " + ", ".join(ctes) + " " + " UNION ALL ".join(selects)
    started: dict[tuple[uuid.UUID, uuid.UUID], int] = {}
    completed: set[tuple[uuid.UUID, uuid.UUID]] = set()
    claimed_rows: list[tuple[Any, ...]] = []
    for row in fetchall(sql, params):
        tag, step_id, token, run_id = row[:4]
        if tag == "i":
            started[(r_uuid(run_id), r_uuid(token))] = int(step_id)
        elif tag == "c":
            completed.add((r_uuid(run_id), r_uuid(token)))
        elif tag == "k":
            claimed_rows.append(row[3:])
    for w in writes:
        key = (w.lease.run_id, w.lease.token)
        if w.kind == "start" and key in started:
            w.result = started[key]
        elif w.kind == "complete" and key in completed:
            w.result = True
        elif w.kind in ("start", "complete"):
            w.error = LeaseLostError(f"run {w.lease.run_id}: lease lost")
    return claimed_from_rows(claimed_rows, claim.worker_id) if claim is not None else []


def claim_after_group(claim: ClaimRequest) -> list[Claimed]:
    """The guarded claim after a group: the group's writes are committed, so a database error
    here must not be reported as theirs; the worker's loop claims again (and backs off)."""
    from ..outages import DB_ERRORS

    try:
        return claim_guarded(claim)
    except DB_ERRORS:
        return []
