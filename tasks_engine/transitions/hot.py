"""The hot writes, each written once: a step's start, a step's deferred completion, a run's
completion. `steps.py` and `outcomes.py` build a `HotWrite` and hand it to the attempt's
`Writer`; every path ends here.

PostgreSQL: `write_group` puts any number of writes (and, under a backlog, the claim of the
runs that take over their slots) in one statement (queries/postgresql.sql); a group of one is a
direct write. SQLite, which has no data-modifying CTEs: `_write_sqlite`,
the deferred completions first, then the write (queries/sqlite.sql).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from django.db import connection

from .. import clock, flow
from ..exceptions import LeaseLostError
from ..sql import (
    execute,
    fetchall,
    is_postgres,
    json_rows,
    p_dt,
    p_json,
    p_uuid,
    query,
    r_uuid,
)
from ._common import Claimed, Completion, Lease, Writer
from .claims import CLAIM_COLUMNS, ClaimRequest, claim_ctes, claimed_from_rows
from .flow_claims import claim_guarded


@dataclass
class HotWrite:
    """One attempt's hot write; it carries the run's deferred step completions along.

    - "start": a step's fenced INSERT (refused once cancel is requested); `result` its id.
    - "complete": the run's completion; `result` True.
    - "deferred": the deferred completions alone (the heartbeat's flush); `result` True.

    A write whose fence fails gets `error = LeaseLostError`, a row the database refuses its
    error; the others of its group are not affected.
    """

    kind: Literal["start", "complete", "deferred"]
    lease: Lease
    deferred: tuple[Completion, ...]
    at: datetime
    name: str = ""  # the step's (start)
    step_kind: str = "function"
    status: str = "running"
    attempt: int = 0
    run_pass: int = 0
    output: Any = None  # the step's (a start that is already finished) or the run's (complete)
    step_error: Any = None
    wake_at: datetime | None = None
    unreached: tuple[str, ...] | list[str] = ()
    progress: dict[str, Any] | None = None
    result: Any = None
    error: BaseException | None = None
    detached: bool = False  # nobody waits for it: its slot went with it (worker/group_commit.py)

    def outcome(self) -> Any:
        """The result, or the write's error raised."""
        if self.error is not None:
            raise self.error
        return self.result


class DirectWriter:
    """Each write alone, on the caller's connection (and inside its transaction, if any)."""

    def send(self, write: HotWrite) -> None:
        write_alone(write)

    def hand_off(self, write: HotWrite) -> None:
        write_alone(write)
        write.outcome()  # nobody else would report it


DIRECT = DirectWriter()


def writer_for(lease: Lease) -> Writer:
    """The lease's writer; inside a transaction the caller's connection (a write there must
    commit with the rest of it, and must not wait on a row lock its own transaction holds)."""
    if lease.writer is None or connection.in_atomic_block:
        return DIRECT
    return lease.writer


def write_alone(write: HotWrite) -> None:
    if is_postgres():
        write_group([write])
    else:
        _write_sqlite(write)


def _settle(write: HotWrite) -> None:
    """The write's statement went through: its deferred completions are written (inside a
    transaction of the engine's, `DeferredCompletion.until_commit` puts them back if it rolls
    back)."""
    if write.error is None:
        write.lease.deferred.settle(write.deferred)


# -- PostgreSQL: any number of writes in one statement ------------------------------------------


def write_group(writes: list[HotWrite], claim: ClaimRequest | None = None) -> list[Claimed]:
    """Every write in one statement (`hot_deferred`, `hot_starts`, `hot_completes` in
    queries/postgresql.sql, for the parts the group holds); fills each write's result or
    error. A database error is raised (the caller decides what it means for the group).

    With `claim`, the same statement (and commit) claims the runs that take over the slots
    these completions free, and returns them: under a backlog a slot gets its next run without
    a round trip of its own. A claim that flow control guards (flow.py) is not part of the
    statement: it runs after the group committed, so the places the completions free are free
    for it."""
    if claim is not None and flow.guarded(claim.pairs, claim.queues):
        write_group(writes)
        return claim_after_group(claim)
    params = _rows(writes)
    pad = ", NULL" * (len(CLAIM_COLUMNS) - 1) if claim is not None else ""
    # Only the parts the group holds: at most eight statement texts, each prepared once.
    ctes: list[str] = []
    selects: list[str] = []
    if "deferred" in params:
        ctes.append(query("hot_deferred"))
    if "starts" in params:
        ctes.append(query("hot_starts"))
        selects.append(query("hot_started"))
    if "completes" in params:
        after = "".join(
            f" AND (SELECT count(*) FROM {cte}) >= 0"
            for cte, part in (("d", "deferred"), ("i", "starts"))
            if part in params
        )
        ctes.append(query("hot_completes").format(after=after))
        selects.append(query("hot_completed"))
    if "deferred" in params and any(w.kind == "deferred" for w in writes):
        selects.append(query("hot_deferred_written"))
    if claim is not None:
        claim_text, claim_params = claim_ctes(
            claim, clock.now(), exclude=[w.lease.run_id for w in writes]
        )
        ctes.append(claim_text)
        params.update(claim_params)
        # The claim's rows go first: UNION resolves the padding NULLs' types from them.
        selects.insert(0, "SELECT 'k', NULL::bigint, NULL::uuid, k.* FROM k")
    results = " UNION ALL ".join(selects).format(pad=pad)
    rows = fetchall(f"WITH {', '.join(ctes)} {results}", params)
    # Results are matched to writes by (run, lease token): a stale and a fresh lease of one
    # run may share a group, and only the fresh one's fence passes.
    started: dict[tuple[uuid.UUID, uuid.UUID], int] = {}
    completed: set[tuple[uuid.UUID, uuid.UUID]] = set()
    written: set[tuple[int, uuid.UUID]] = set()
    claimed_rows: list[tuple[Any, ...]] = []
    for row in rows:
        tag, step_id, token, run_id = row[:4]
        if tag == "k":
            claimed_rows.append(row[3:])
        elif tag == "i":
            started[(r_uuid(run_id), r_uuid(token))] = int(step_id)
        elif tag == "c":
            completed.add((r_uuid(run_id), r_uuid(token)))
        else:
            written.add((int(step_id), r_uuid(token)))
    for w in writes:
        key = (w.lease.run_id, w.lease.token)
        if w.kind == "start":
            w.result = started.get(key)
        elif w.kind == "complete":
            w.result = True if key in completed else None
        else:
            w.result = True if {(c.step_id, key[1]) for c in w.deferred} <= written else None
        if w.result is None:
            w.error = LeaseLostError(f"run {w.lease.run_id}: lease lost")
        _settle(w)
    return claimed_from_rows(claimed_rows, claim.worker_id) if claim is not None else []


def _rows(writes: list[HotWrite]) -> dict[str, Any]:
    """The row sets the group holds, one JSON parameter each."""
    deferred: list[dict[str, Any]] = []
    starts: list[dict[str, Any]] = []
    completes: list[dict[str, Any]] = []
    for w in writes:
        run_id, token = w.lease.run_id, w.lease.token
        for c in w.deferred:
            deferred.append(
                {
                    "step_id": c.step_id,
                    "output": c.output,
                    "finished_at": c.finished_at,
                    "run_id": run_id,
                    "token": token,
                }
            )
        if w.kind == "start":
            row = {
                "run_id": run_id,
                "name": w.name,
                "kind": w.step_kind,
                "status": w.status,
                "attempt": w.attempt,
                "run_pass": w.run_pass,
                "worker_id": w.lease.worker_id,
                "token": token,
                "started_at": w.at,
            }
            if w.status != "running":
                row["finished_at"] = w.at
            # A column a row leaves out is NULL: a function step's start sends none of these.
            for column, value in (("output", w.output), ("error", w.step_error)):
                if value is not None:
                    row[column] = value
            if w.wake_at is not None:
                row["wake_at"] = w.wake_at
            starts.append(row)
        elif w.kind == "complete":
            completes.append(
                {
                    "run_id": run_id,
                    "token": token,
                    "output": w.output,
                    "unreached": list(w.unreached),
                    "at": w.at,
                    "progress": w.progress,
                }
            )
    sets = {"deferred": deferred, "starts": starts, "completes": completes}
    return {name: json_rows(rows) for name, rows in sets.items() if rows}


def claim_after_group(claim: ClaimRequest) -> list[Claimed]:
    """The guarded claim after a group: the group's writes are committed, so a database error
    here must not be reported as theirs; the worker's loop claims again (and backs off)."""
    from ..outages import DB_ERRORS

    try:
        return claim_guarded(claim)
    except DB_ERRORS:
        return []


# -- SQLite: one write at a time ---------------------------------------------------------------


def _write_sqlite(w: HotWrite) -> None:
    lease = w.lease
    fence = {"run_id": p_uuid(lease.run_id), "token": p_uuid(lease.token)}
    deferred_ok = True
    for c in w.deferred:
        sent = {"step_id": c.step_id, "output": p_json(c.output)}
        sent["finished_at"] = p_dt(c.finished_at)
        if not execute(query("complete_deferred"), {**sent, **fence}):
            deferred_ok = deferred_ok and bool(
                fetchall(query("deferred_written"), {"step_id": c.step_id, **fence})
            )
    if w.kind == "start":
        rows = fetchall(
            query("start_step"),
            {
                **fence,
                "name": w.name,
                "kind": w.step_kind,
                "status": w.status,
                "attempt": w.attempt,
                "run_pass": w.run_pass,
                "output": p_json(w.output),
                "error": p_json(w.step_error),
                "worker_id": lease.worker_id,
                "wake_at": p_dt(w.wake_at),
                "started_at": p_dt(w.at),
                "finished_at": p_dt(w.at) if w.status != "running" else None,
            },
        )
        ok, w.result = bool(rows), int(rows[0][0]) if rows else None
    elif w.kind == "complete":
        done = execute(
            query("complete_run"),
            {
                **fence,
                "output": p_json(w.output),
                "unreached": p_json(list(w.unreached)),
                "at": p_dt(w.at),
                "progress": p_json(w.progress),
            },
        )
        ok, w.result = bool(done), True if done else None
    else:
        ok, w.result = deferred_ok, True if deferred_ok else None
    if not ok:
        w.error = LeaseLostError(f"run {lease.run_id}: lease lost")
    _settle(w)
