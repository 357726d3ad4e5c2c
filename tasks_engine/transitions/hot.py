"""The hot writes, each written once: a step's start, a step's deferred completion, a run's
completion. `runtime/step_api.py` and `outcomes.py` build a `HotWrite` and hand it to the attempt's
`Writer`; every path ends here.

PostgreSQL: `write_group` puts any number of writes (and, under a backlog, the claim of the
runs that take over their slots) in one statement; a lone start or completion is a scalar
statement of its own (`_write_single`); both are built by hot_sql.py from one definition of
each part in queries/postgresql.sql. SQLite, which has no data-modifying CTEs: `_write_sqlite`,
the deferred completions first, then the write (queries/sqlite.sql); `write_group_sqlite` puts
any number of them in one transaction (an async worker's group writer on SQLite).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from django.db import DatabaseError

from .. import clock
from ..db.alias import atomic, connection
from ..db.sql import execute, fetchall, is_postgres, json_rows, p_dt, p_json, p_uuid, query, r_uuid
from ..exceptions import LeaseLostError
from . import claim_mode, hot_sql
from ._common import Claimed, Completion, Lease, Writer
from .claims import ClaimRequest, claim_ctes, claimed_from_rows
from .flow_claims import claim_guarded


@dataclass
class HotWrite:
    """One attempt's hot write; it carries the run's deferred step completions along.

    - "start": a step's fenced INSERT (refused once cancel is requested); `result` its id.
    - "complete": the run's completion; `result` the status it wrote: "completed", or
      "canceled" when a cancel committed first. `ended` (if given) is told it once written,
      or None when a detached one failed (`dropped`: nobody else hears of it).
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
    ended: Callable[[str | None], None] | None = None  # a completion's: the status it wrote

    def outcome(self) -> Any:
        """The result, or the write's error raised."""
        if self.error is not None:
            raise self.error
        return self.result

    def dropped(self) -> None:
        """A detached write failed (its `error` set) and its run is dropped: `ended` is told
        None, as nobody waits for the write to raise its error; once (the group writer's
        death drops what it held, which may include a write it dropped already)."""
        ended, self.ended = self.ended, None
        if ended is not None:
            ended(None)


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
        if write.ended is not None:
            write.ended(write.result)


# -- PostgreSQL: one write, or any number in one statement --------------------------------------


def write_group(writes: list[HotWrite], claim: ClaimRequest | None = None) -> list[Claimed]:
    """Every write in one statement (hot_sql.group_statement: the parts the group holds);
    fills each write's result or error. A database error is raised (the caller decides what
    it means for the group). A lone start or completion is a direct write
    (`_write_single`).

    With `claim`, the same statement (and commit) claims the runs that take over the slots
    these completions free, and returns them: under a backlog a slot gets its next run without
    a round trip of its own. A claim that flow control guards (claim_mode.py) is not part of the
    statement: it runs after the group committed, so the places the completions free are free
    for it."""
    if claim is not None and claim_mode.guarded(claim.pairs, claim.queues):
        write_group(writes)
        return claim_after_group(claim)
    if claim is None and len(writes) == 1 and writes[0].kind != "deferred":
        _write_single(writes[0])
        return []
    params = _rows(writes)
    parts = tuple(part for part in PARTS if part in params)
    claim_text, prestart = None, None
    if claim is not None:
        claim_text, claim_params, prestart = claim_ctes(
            claim, clock.now(), exclude=[w.lease.run_id for w in writes]
        )
        params.update(claim_params)
    written = "deferred" in params and any(w.kind == "deferred" for w in writes)
    statement = hot_sql.group_statement(
        parts, written, claim_text, prestart is not None and bool(prestart.guesses)
    )
    # A group with nothing to write and no claim (deferred writes whose completions were all
    # settled) sends nothing: its statement would be an empty WITH.
    rows = fetchall(statement, params) if parts or claim_text is not None else []
    # Results are matched to writes by (run, lease token): a stale and a fresh lease of one
    # run may share a group, and only the fresh one's fence passes.
    started: dict[tuple[uuid.UUID, uuid.UUID], int] = {}
    completed: dict[tuple[uuid.UUID, uuid.UUID], str] = {}
    done: set[tuple[int, uuid.UUID]] = set()
    claimed_rows: list[tuple[Any, ...]] = []
    prestarted: list[int | None] = []
    for row in rows:
        tag, step_id, token, run_id = row[:4]
        if tag == "k":
            claimed_rows.append(row[3:])
            prestarted.append(step_id)
        elif tag == "i":
            started[(r_uuid(run_id), r_uuid(token))] = int(step_id)
        elif tag == "c":
            completed[(r_uuid(run_id), r_uuid(token))] = "canceled" if step_id else "completed"
        else:
            done.add((int(step_id), r_uuid(token)))
    for w in writes:
        key = w.lease.key
        if w.kind == "start":
            w.result = started.get(key)
        elif w.kind == "complete":
            w.result = completed.get(key)
        else:
            w.result = True if {(c.step_id, key[1]) for c in w.deferred} <= done else None
        if w.result is None:
            w.error = LeaseLostError(f"run {w.lease.run_id}: lease lost")
        _settle(w)
    if claim is None:
        return []
    return claimed_from_rows(claimed_rows, claim.worker_id, prestart, prestarted)


PARTS: tuple[hot_sql.Part, ...] = ("deferred", "starts", "completes")


def _write_single(w: HotWrite) -> None:
    """A start or a completion alone (with the deferred completions it carries): its columns
    bound as parameters (hot_sql.single_statement), not through JSON rows."""
    params: dict[str, Any] = {}
    if len(w.deferred) == 1:
        params.update(hot_sql.bind("deferred", _deferred_row(w, w.deferred[0])))
    elif w.deferred:
        params["deferred"] = json_rows([_deferred_row(w, c) for c in w.deferred])
    part: hot_sql.Part = "starts" if w.kind == "start" else "completes"
    params.update(hot_sql.bind(part, _start_row(w) if part == "starts" else _complete_row(w)))
    rows = fetchall(hot_sql.single_statement(part, len(w.deferred)), params)
    if not rows:
        w.error = LeaseLostError(f"run {w.lease.run_id}: lease lost")
    else:
        w.result = int(rows[0][0]) if part == "starts" else str(rows[0][2])
    _settle(w)


def _deferred_row(w: HotWrite, c: Completion) -> dict[str, Any]:
    return {
        "step_id": c.step_id,
        "output": c.output,
        "finished_at": c.finished_at,
        "run_id": w.lease.run_id,
        "token": w.lease.token,
    }


def _start_row(w: HotWrite) -> dict[str, Any]:
    """A start's columns (hot_starts_columns); one it leaves out is NULL: a function step's
    start sends none of output, error, wake_at and finished_at."""
    row = {
        "run_id": w.lease.run_id,
        "name": w.name,
        "kind": w.step_kind,
        "status": w.status,
        "attempt": w.attempt,
        "run_pass": w.run_pass,
        "worker_id": w.lease.worker_id,
        "token": w.lease.token,
        "started_at": w.at,
    }
    if w.status != "running":
        row["finished_at"] = w.at
    for column, value in (("output", w.output), ("error", w.step_error)):
        if value is not None:
            row[column] = value
    if w.wake_at is not None:
        row["wake_at"] = w.wake_at
    return row


def _complete_row(w: HotWrite) -> dict[str, Any]:
    """A run completion's columns (hot_completes_columns)."""
    return {
        "run_id": w.lease.run_id,
        "token": w.lease.token,
        "output": w.output,
        "unreached": list(w.unreached),
        "at": w.at,
        "progress": w.progress,
    }


def _rows(writes: list[HotWrite]) -> dict[str, Any]:
    """The row sets the group holds, one JSON parameter each."""
    sets: dict[str, list[dict[str, Any]]] = {"deferred": [], "starts": [], "completes": []}
    for w in writes:
        sets["deferred"].extend(_deferred_row(w, c) for c in w.deferred)
        if w.kind == "start":
            sets["starts"].append(_start_row(w))
        elif w.kind == "complete":
            sets["completes"].append(_complete_row(w))
    return {name: json_rows(rows) for name, rows in sets.items() if rows}


def claim_after_group(claim: ClaimRequest) -> list[Claimed]:
    """The guarded claim after a group: the group's writes are committed, so a database error
    here must not be reported as theirs; the worker's loop claims again (and backs off)."""
    from ..db.outages import DB_ERRORS

    try:
        return claim_guarded(claim)
    except DB_ERRORS:
        return []


# -- SQLite: one write at a time ---------------------------------------------------------------


def write_group_sqlite(writes: list[HotWrite]) -> None:
    """SQLite: every write in one transaction (BEGIN IMMEDIATE: one commit, one sync of the
    WAL for the lot), each in a savepoint of its own, so that a write whose fence fails
    (LeaseLostError) or whose row the database refuses fails alone, as in a PostgreSQL group.
    Each is settled (its deferred completions, its `ended`) once the transaction committed. A
    database error at the BEGIN or the COMMIT is raised: the caller fails the whole group."""
    with atomic():
        for w in writes:
            try:
                with atomic():
                    _sqlite_statements(w)
            except DatabaseError as exc:
                w.result, w.error = None, exc
    for w in writes:
        _settle(w)


def _write_sqlite(w: HotWrite) -> None:
    _sqlite_statements(w)
    _settle(w)


def _sqlite_statements(w: HotWrite) -> None:
    """The write's statements (each fenced); `result`, or `error` when its fence failed."""
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
        done = fetchall(
            query("complete_run"),
            {
                **fence,
                "output": p_json(w.output),
                "unreached": p_json(list(w.unreached)),
                "at": p_dt(w.at),
                "progress": p_json(w.progress),
            },
        )
        ok, w.result = bool(done), str(done[0][0]) if done else None
    else:
        ok, w.result = deferred_ok, True if deferred_ok else None
    if not ok:
        w.error = LeaseLostError(f"run {lease.run_id}: lease lost")
