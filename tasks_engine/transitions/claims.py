"""Creating, claiming and renewing runs."""

from __future__ import annotations

import functools
import json
import uuid
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models.base import ModelState

from .. import clock
from ..db import partitions
from ..db.alias import atomic, engine_alias
from ..db.sql import (
    Params,
    fetchall,
    is_postgres,
    json_rows,
    new_token_sql,
    p_dt,
    p_uuid,
    query,
    r_dt,
    r_uuid,
)
from ..models import WorkflowRun
from . import claim_floor, claim_mode, first_steps, queue_state
from ._common import RUN, Claimed, Lease, LeaseKey, Renewal


def _filters(pairs: list[tuple[str, int]], queues: list[str] | None) -> tuple[str, list[Any]]:
    """Only the (name, version) pairs a worker registered, and its queues: one parameter each,
    so a worker with many workflows does not send (and parse) hundreds of parameters a claim."""
    return _filters_for(tuple(pairs), tuple(queues or ()), is_postgres())


@functools.lru_cache(maxsize=64)
def _filters_for(
    pairs: tuple[tuple[str, int], ...], queues: tuple[str, ...], postgres: bool
) -> tuple[str, list[Any]]:
    # A worker claims with the same filters all its life: build them (and their text forms,
    # cheaper to send than arrays adapted value by value) once.
    keys = [f"{name}@{version}" for name, version in pairs]
    if postgres:
        sql = " AND task_name || '@' || version = ANY(%s::text[])"
        params: list[Any] = [_pg_array(keys)]
        if queues:
            sql += " AND queue = ANY(%s::text[])"
            params.append(_pg_array(list(queues)))
        return sql, params
    sql = " AND task_name || '@' || version IN (SELECT value FROM json_each(%s))"
    params = [json.dumps(keys)]
    if queues:
        sql += " AND queue IN (SELECT value FROM json_each(%s))"
        params.append(json.dumps(list(queues)))
    return sql, params


def _pg_array(values: list[str]) -> str:
    """A PostgreSQL text[] literal: every element quoted, quotes and backslashes escaped."""
    quoted = ('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values)
    return "{" + ",".join(quoted) + "}"


# -- claiming ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimRequest:
    """What a worker claims: up to `limit` runs of its (name, version) pairs and queues."""

    worker_id: str
    pairs: list[tuple[str, int]]
    queues: list[str] | None
    limit: int
    lease_seconds: float
    # Runs this worker holds (a slot still executes them): never reclaimed by their own
    # worker, even when an outage let their lease expire; the held entry and its renewals
    # stay with the attempt that runs.
    held: tuple[uuid.UUID, ...] = ()
    # (queue, places): how many more runs of each queue with a `worker_concurrency` this worker
    # may take now (its cap less the runs of the queue it holds). Only the guarded claim
    # takes runs of such a queue: it is a limited queue (claim_mode.limited_queues).
    worker_room: tuple[tuple[str, int], ...] = ()


def claim_ctes(
    req: ClaimRequest, now: datetime, *, exclude: list[uuid.UUID] | None = None
) -> tuple[str, dict[str, Any], Prestart]:
    """The claim as CTEs ending in `k`, the claimed rows (PostgreSQL: `claim_sources` and
    `claim_take`), then, once this worker guesses first steps, `ks`, the first steps it
    started (`claim_prestart`); its parameters; and the guesses it sent. The runs the worker
    holds, and `exclude`, are never reclaimed: the group commit claims in the statement that
    writes its own runs, and a row must not be updated twice in one statement."""
    sources, take = _claim_parts(req)
    text = f"{sources}, k AS ({take})"
    params = _claim_params(req, now, exclude)
    guesses_json, guesses = first_steps.published()
    if guesses:
        text += ", " + query("claim_prestart")
        params["first_steps"] = guesses_json
    return text, params, Prestart(guesses)


@dataclass(frozen=True)
class Prestart:
    """The first-step guesses a claim sent (first_steps.py); its `ks` CTE exists if any."""

    guesses: dict[str, str]

    @property
    def select(self) -> str:
        return prestarted_select(bool(self.guesses))

    def of(self, run: WorkflowRun, step_id: int | None) -> tuple[str, int] | None:
        if step_id is None:
            return None
        return self.guesses[first_steps.key(run.task_name, run.version)], int(step_id)


def prestarted_select(prestart: bool) -> str:
    """The claimed rows `k`, each followed by the id of the step attempt the claim started
    (`ks`; NULL without guesses): what `claimed_prestarted` reads."""
    started, join = prestarted_sql(prestart)
    return f"SELECT k.*, {started} FROM k{join}"


def claimed_prestarted(
    rows: list[tuple[Any, ...]], worker_id: str, prestart: Prestart
) -> list[Claimed]:
    """The runs of a claim's rows as `prestarted_select` returns them."""
    step_ids = [row[-1] for row in rows]
    return claimed_from_rows([row[:-1] for row in rows], worker_id, prestart, step_ids)


def prestarted_sql(prestart: bool) -> tuple[str, str]:
    """The column of a claimed row `k` that holds the id of the step attempt its claim started
    (`ks`, NULL without guesses), and the join it needs."""
    if prestart:
        return "ks.id", " LEFT JOIN ks ON ks.run_id = k.id"
    return "NULL::bigint", ""


def _claim_parts(req: ClaimRequest) -> tuple[str, str]:
    filters, paused = _claim_filters(req), paused_filter()
    floor = " " + query("claim_filter_floor") if partitions.unit() is not None else ""
    return query("claim_sources").format(filters=filters, paused=paused, floor=floor), query(
        "claim_take"
    ).format(columns=_COLUMNS, floor=floor)


def _claim_filters(req: ClaimRequest) -> str:
    """The worker's filters (`claim_filter_*`), named parameters `task_keys` and `queues`:
    the plain claim's and the guarded claim's alike, on both databases."""
    return filters_for(req.queues)


def filters_for(queues: list[str] | None) -> str:
    filters = " " + query("claim_filter_tasks")
    return filters + (" " + query("claim_filter_queues") if queues else "")


def paused_filter() -> str:
    """The claim's filter on paused queues (named parameter `paused`, which `_claim_params`
    always sends): none while no queue is paused, so the claim keeps its statement."""
    return " " + query("claim_filter_paused") if queue_state.paused() else ""


def paused_value(paused: frozenset[str]) -> str:
    names = sorted(paused)
    return _pg_array(names) if is_postgres() else json.dumps(names)


def _claim_params(
    req: ClaimRequest, now: datetime, exclude: list[uuid.UUID] | None = None
) -> dict[str, Any]:
    task_keys, queues = _filter_values(tuple(req.pairs), tuple(req.queues or ()), is_postgres())
    params = {
        "now": p_dt(now),
        "lease_until": p_dt(now + timedelta(seconds=req.lease_seconds)),
        "worker_id": req.worker_id,
        "limit": req.limit,
        "not_these": _ids_json([*req.held, *(exclude or ())]),
        "task_keys": task_keys,
        "queues": queues,
        "paused": paused_value(queue_state.paused()),
    }
    if (lowest := claim_floor.floor()) is not None:
        params["floor"] = lowest
    return params


@functools.lru_cache(maxsize=64)
def _filter_values(
    pairs: tuple[tuple[str, int], ...], queues: tuple[str, ...], postgres: bool
) -> tuple[str, str | None]:
    """A worker claims with the same filters all its life: their text forms (cheaper to send
    than arrays adapted value by value) are built once."""
    keys = [f"{name}@{version}" for name, version in pairs]
    if postgres:
        return _pg_array(keys), _pg_array(list(queues)) if queues else None
    return json.dumps(keys), json.dumps(list(queues)) if queues else None


def claim_update() -> str:
    """What a claim writes to each run it takes (the plain and the guarded claim alike).
    `due_at` (the claim-delay metric's start) is when the run became claimable: its
    `available_at`, except for a dead worker's run, whose lease expiry the leader set to the
    worker's last beat and whose `due_at` to the reap (`dead_workers.reap_dead_workers`); a
    running run's `due_at` is otherwise its claim's, before its lease expiry."""
    return (
        f"UPDATE {RUN} SET status = 'running', lease_token = {new_token_sql()}, worker_id = %s,"
        " attempts = attempts + 1, due_at = CASE WHEN status = 'running' AND due_at >"
        " available_at THEN due_at ELSE available_at END, available_at = %s, waiting_on = '',"
        " started_at = COALESCE(started_at, %s), updated_at = %s"
    )


def claim_update_params(req: ClaimRequest, now: datetime) -> list[Any]:
    t = p_dt(now)
    return [req.worker_id, p_dt(now + timedelta(seconds=req.lease_seconds)), t, t]


def claim_runs(
    worker_id: str,
    pairs: list[tuple[str, int]],
    queues: list[str] | None,
    limit: int,
    lease_seconds: float,
    held: tuple[uuid.UUID, ...] = (),
    worker_room: dict[str, int] | None = None,
) -> list[Claimed]:
    """Claim up to `limit` runs in one statement (see `claim_ctes`). `worker_room`: the
    places left under each queue's `worker_concurrency` in this worker (its cap when
    missing)."""
    if not pairs or limit <= 0:
        return []
    room = tuple(sorted(worker_room.items())) if worker_room else ()
    req = ClaimRequest(worker_id, pairs, queues, limit, lease_seconds, held, room)
    if claim_mode.guarded(pairs, queues):
        from .flow_claims import claim_guarded

        return claim_guarded(req)
    with _write_lock():  # SQLite: the lease starts once the write lock is held
        now = clock.now()
        if is_postgres():
            return _claim_pg(req, now)
        sql, params = claim_sql(req, now)
        return returning_claimed(sql, params, worker_id)


def _claim_pg(req: ClaimRequest, now: datetime) -> list[Claimed]:
    """The plain claim on PostgreSQL: one statement, which also starts the first steps this
    worker guesses (`Prestart`). Without guesses, its UPDATE ... RETURNING is the statement
    itself (`claim_sql`)."""
    if not first_steps.published()[1]:
        sql, plain = claim_sql(req, now)
        return claimed_from_rows(fetchall(sql, plain), req.worker_id)
    text, params, prestart = claim_ctes(req, now)
    rows = fetchall(f"WITH {text} {prestart.select}", params)
    return claimed_prestarted(rows, req.worker_id, prestart)


def claim_sql(req: ClaimRequest, now: datetime) -> tuple[str, dict[str, Any]]:
    """The plain claim statement (not guarded by flow control) and its parameters."""
    if is_postgres():
        # The UPDATE is the statement itself, not a CTE read by a SELECT (which materialises
        # its rows once more).
        sources, take = _claim_parts(req)
        return f"WITH {sources} {take}", _claim_params(req, now)
    filters, paused = _claim_filters(req), paused_filter()
    sql = query("claim").format(filters=filters, paused=paused, columns=_COLUMNS)
    return sql, _claim_params(req, now)


def returning_claimed(sql: str, params: Params, worker_id: str) -> list[Claimed]:
    """Run a claim's `UPDATE ... RETURNING` and lease what it returns."""
    if is_postgres():
        return claimed_from_rows(fetchall(sql, params), worker_id)
    # SQLite returns text for times and JSON: let Django convert them
    return _leases(list(WorkflowRun.objects.raw(sql, params)), worker_id)


def _ids_json(ids: list[uuid.UUID]) -> str:
    return json.dumps([str(i) if is_postgres() else p_uuid(i) for i in ids])


def claimed_from_rows(
    rows: list[tuple[Any, ...]],
    worker_id: str,
    prestart: Prestart | None = None,
    step_ids: list[int | None] | None = None,
) -> list[Claimed]:
    runs = [_run_from_row(row) for row in rows]
    if prestart is None or step_ids is None:
        return _leases(runs, worker_id)
    started = {r.pk: prestart.of(r, step_id) for r, step_id in zip(runs, step_ids, strict=True)}
    return _leases(runs, worker_id, started)


def _leases(
    runs: list[WorkflowRun],
    worker_id: str,
    started: dict[uuid.UUID, tuple[str, int] | None] | None = None,
) -> list[Claimed]:
    runs.sort(key=lambda r: (-r.priority, r.created_at))
    return [
        Claimed(
            Lease(r.pk, r_uuid(r.lease_token), worker_id, deadline_at=r.deadline_at),
            r,
            (started or {}).get(r.pk),
        )
        for r in runs
    ]


# What the executor needs of a claimed run; the claim returns it, so nothing is read twice.
CLAIM_COLUMNS = (
    "id",
    "task_name",
    "version",
    "queue",
    "status",
    "priority",
    "input",
    "trace_id",
    "attempts",
    "failures",
    "pass_offset",
    "worker_id",
    "lease_token",
    "available_at",
    "due_at",
    "deadline_at",
    "cancel_requested_at",
    "cancel_reason",
    "parent_run_id",
    "created_at",
    "started_at",
)
_COLUMNS = ", ".join(CLAIM_COLUMNS)


def _run_from_row(row: tuple[Any, ...]) -> WorkflowRun:
    """A WorkflowRun holding the claimed columns (the others load on access, as with
    `.only()`). Built directly: `Model.from_db` would run `__init__` for every field, a
    noticeable share of a no-op run's cost."""
    run = WorkflowRun.__new__(WorkflowRun)
    values = dict(zip(CLAIM_COLUMNS, row, strict=True))
    if isinstance(values["input"], str):
        values["input"] = json.loads(values["input"])
    run.__dict__.update(values)
    run._state = ModelState()
    run._state.adding = False
    run._state.db = engine_alias()
    return run


def anything_due_before(
    pairs: list[tuple[str, int]], queues: list[str] | None, horizon: datetime
) -> bool:
    """Whether a run this worker could claim becomes due before `horizon` (for --burst): a
    paused queue's runs are not, its running runs are."""
    if not pairs:
        return False
    task_keys, queue_names = _filter_values(tuple(pairs), tuple(queues or ()), is_postgres())
    paused = queue_state.paused()
    not_paused = query("claim_filter_paused").removeprefix("AND ")
    unpaused = f" AND (status = 'running' OR {not_paused})" if paused else ""
    sql = (
        f"SELECT 1 FROM {RUN} WHERE status IN ('pending', 'running', 'waiting')"
        f" AND available_at <= %(now)s{filters_for(queues)}{unpaused} LIMIT 1"
    )
    params = {"now": p_dt(horizon), "task_keys": task_keys, "queues": queue_names}
    params["paused"] = paused_value(paused)
    return bool(fetchall(sql, params))


def renew_leases(leases: list[Lease], lease_seconds: float) -> dict[LeaseKey, Renewal]:
    """One statement renews every lease a worker holds (`renew_leases`). The result is keyed by
    (run, lease token), as the leases are matched: a stale and a fresh lease of one run (a
    worker whose lease expired during an outage while its slot still executes, and the run's
    next attempt) are never confused. A lease missing from the result is lost; one whose row
    another transaction holds locked is still held but not extended (`Renewal.locked`, on
    PostgreSQL): the statement does not wait for it."""
    if not leases:
        return {}
    if is_postgres():
        rows_json = json_rows([{"run_id": x.run_id, "token": x.token} for x in leases])
    else:
        rows_json = json.dumps([[p_uuid(x.run_id), p_uuid(x.token)] for x in leases])
    with _write_lock():
        now = clock.now()  # after the lock: a renewal that waited for it still grants a full lease
        until = p_dt(now + timedelta(seconds=lease_seconds))
        rows = fetchall(query("renew_leases"), {"leases": rows_json, "until": until})
    return {
        (r_uuid(rid), r_uuid(token)): Renewal(
            cancel is not None, deadline is not None and r_dt(deadline) <= now, not renewed
        )
        for rid, token, cancel, deadline, renewed in rows
    }


def _write_lock() -> AbstractContextManager[Any]:
    """SQLite has one writer: its BEGIN IMMEDIATE waits for the write lock, so times computed
    inside the block (lease expiries) start when the write can actually happen. PostgreSQL
    needs no transaction for a single statement."""
    return nullcontext() if is_postgres() else atomic()
