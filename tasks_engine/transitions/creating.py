"""Creating runs: the one statement that inserts pending runs, one of them or thousands.

`enqueue` and `enqueue_many` both write through `create_runs`: every row goes in one INSERT
whose rows come from one JSON parameter (PostgreSQL `json_to_recordset`, SQLite `json_each`),
and on PostgreSQL the same statement NOTIFYs idle workers (delivered at commit), once per
queue. On PostgreSQL the JSON holds only the columns that differ between the runs (an
enqueue_many's ids, inputs and hashes): the others are parameters, sent and parsed once, and
the inputs' JSON text is the one their hashes were taken of (`NewRun.input_json`), not
written again. A single run (every `enqueue`) goes in as plain values instead: the same
columns and conflict clause, without building and parsing a JSON document for one row,
which cost a single enqueue about a fifth of its time inside a transaction (measured in
docs/guides/many-runs.md, "Measured").
"""

from __future__ import annotations

import functools
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from operator import attrgetter
from typing import Any

from .. import clock
from ..db import notify, partitions
from ..db.alias import atomic
from ..db.sql import execute, fetchall, is_postgres, json_rows, p_dt, p_json, p_uuid, r_uuid
from . import claim_mode
from ._common import RUN


@dataclass
class NewRun:
    """A pending run to insert: its columns, already checked (engine.enqueue)."""

    task_name: str
    version: int
    queue: str
    priority: int
    input: Any
    input_hash: str
    trace_id: str
    idempotency_key: str | None = None
    available_at: datetime | None = None
    deadline_at: datetime | None = None
    deadline_after: timedelta | None = None  # without deadline_at: created + this
    parent_run_id: uuid.UUID | None = None
    parent_step: str = ""
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    queueing_key: str | None = None
    tags: dict[str, str] | None = None
    # Debounce: due `debounce` after its enqueue, and at most `debounce_max` after it (the cap
    # later enqueues of its window keep: debounce_until).
    debounce_key: str | None = None
    debounce: timedelta | None = None
    debounce_max: timedelta | None = None
    on_limit: str = "queue"  # what its enqueue does when its concurrency key is full
    rate_key: str | None = None
    rate_limit: str = ""
    id: uuid.UUID = field(default_factory=clock.new_run_id)  # time-ordered: clock says why
    # The input's canonical JSON text when known (enqueue_many): sent as it is.
    input_json: str | None = None


_COLUMNS = (
    ("id", "uuid"),
    ("task_name", "text"),
    ("version", "integer"),
    ("queue", "text"),
    ("priority", "integer"),
    ("input", "jsonb"),
    ("idempotency_key", "text"),
    ("input_hash", "text"),
    ("trace_id", "text"),
    ("available_at", "timestamptz"),
    ("deadline_at", "timestamptz"),
    ("parent_run_id", "uuid"),
    ("parent_step", "text"),
    ("concurrency_key", "text"),
    ("concurrency_limit", "integer"),
    ("queueing_key", "text"),
    ("tags", "jsonb"),
    ("debounce_key", "text"),
    ("debounce_until", "timestamptz"),
    ("rate_key", "text"),
    ("rate_limit", "text"),
)
_NAMES = ", ".join(name for name, _ in _COLUMNS)


@functools.cache
def _statement(conflict: str, postgres: bool, single: bool, guard: str = "") -> str:
    if single:  # one run: its values as parameters, in _COLUMNS' order
        values = ", ".join("%s" for _ in _COLUMNS)
        return f"""
        INSERT INTO {RUN} ({_NAMES}, status, attempts, failures, worker_id, waiting_on,
            cancel_reason, unreached_steps, created_at, updated_at)
        VALUES ({values}, 'pending', 0, 0, '', '', '', '[]', %s, %s){conflict}
        RETURNING id, queue
    """
    if postgres:
        values = ", ".join(f"r.{name}" for name, _ in _COLUMNS)
        rows = "json_to_recordset(%s::json) AS r(" + ", ".join(
            f"{name} {kind}" for name, kind in _COLUMNS
        )
        source = f"{rows}){guard}"
    else:
        values = ", ".join(f"r.value ->> '$.{name}'" for name, _ in _COLUMNS)
        source = "json_each(%s) AS r WHERE true"  # WHERE: ON CONFLICT would read as a join's ON
    return f"""
        INSERT INTO {RUN} ({_NAMES}, status, attempts, failures, worker_id, waiting_on,
            cancel_reason, unreached_steps, created_at, updated_at)
        SELECT {values}, 'pending', 0, 0, '', '', '', '[]', %s, %s
        FROM {source}{conflict}
        RETURNING id, queue
    """


def _conflict(runs: list[NewRun], *, partitioned: bool = False) -> str:
    if partitioned or any(r.queueing_key is not None or r.debounce_key is not None for r in runs):
        # any of the keys may be the one taken
        return " ON CONFLICT DO NOTHING"
    if any(r.idempotency_key is not None for r in runs):
        return (
            " ON CONFLICT (task_name, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"
        )
    return ""


def create_runs(runs: list[NewRun]) -> set[uuid.UUID]:
    """Insert pending runs on the caller's connection (and transaction) in one statement; the
    ids of those inserted. A run whose idempotency key is taken, or whose queueing key a queued
    run holds, is not inserted (the caller looks up who holds it)."""
    if not runs:
        return set()
    now = clock.now()
    postgres = is_postgres()
    single = len(runs) == 1
    if postgres and _conflict(runs) and partitions.unit() is not None:
        created = _create_keyed_partitioned(runs, now)
    elif postgres and not single:
        created = _create_many_pg(runs, now)
    else:
        created = _create(runs, now, postgres, single)
    if created and any(r.rate_key is not None for r in runs):
        claim_mode.note_rate_keyed()
    if created and any(r.concurrency_key is not None for r in runs):
        claim_mode.note_keyed()
    return created


# Keyed runs on partitioned tables (db/partitions/): a unique index holds within one partition
# only, and two enqueues of one key made around a period's end insert into two. Each key is
# locked for the transaction first (sorted, in one statement: no deadlock between enqueues of
# several keys), so enqueues of one key take turns; the INSERT, whose snapshot is taken after
# the lock, then skips a run whose key a committed run already holds, in any partition. The
# partitions' own unique indexes still back this within a period (the conflict clause: with no
# target, as a target needs an index of the parent).
_LOCK_KEYS = (
    "SELECT pg_advisory_xact_lock(h) FROM (SELECT DISTINCT hashtextextended(k, 0) AS h"
    " FROM unnest(%s::text[]) AS k ORDER BY h) AS s"
)
_QUEUED = "x.status = 'pending' AND x.started_at IS NULL AND x.retries IS NULL"  # models.QUEUED
_KEY_FREE = (
    f" WHERE NOT EXISTS (SELECT 1 FROM {RUN} x WHERE x.task_name = r.task_name"
    " AND x.idempotency_key = r.idempotency_key)"
    f" AND NOT EXISTS (SELECT 1 FROM {RUN} x WHERE x.queueing_key = r.queueing_key"
    f" AND {_QUEUED})"
    f" AND NOT EXISTS (SELECT 1 FROM {RUN} x WHERE x.task_name = r.task_name"
    f" AND x.debounce_key = r.debounce_key AND {_QUEUED})"
)


def run_key_locks(runs: list[NewRun]) -> list[str]:
    """The advisory lock names of the runs' keys (the unique keys of models.WorkflowRun)."""
    names = set()
    for r in runs:
        if r.idempotency_key is not None:
            names.add(json.dumps(["idempotency", r.task_name, r.idempotency_key]))
        if r.queueing_key is not None:
            names.add(json.dumps(["queueing", r.queueing_key]))
        if r.debounce_key is not None:
            names.add(json.dumps(["debounce", r.task_name, r.debounce_key]))
    return sorted(names)


def lock_run_keys(names: list[str]) -> None:
    """Hold these keys until the transaction ends (PostgreSQL advisory locks)."""
    execute(_LOCK_KEYS, [names])


def _create_keyed_partitioned(runs: list[NewRun], now: datetime) -> set[uuid.UUID]:
    with atomic(savepoint=False):
        lock_run_keys(run_key_locks(runs))
        return _create(runs, now, postgres=True, single=False, guard=_KEY_FREE)


def _create(
    runs: list[NewRun], now: datetime, postgres: bool, single: bool, guard: str = ""
) -> set[uuid.UUID]:
    sql = _statement(_conflict(runs, partitioned=bool(guard)), postgres, single, guard)
    if single:
        params = [*_values(runs[0], now), p_dt(now), p_dt(now)]
    else:
        params = [p_dt(now), p_dt(now), json_rows([_row(r, now, postgres) for r in runs])]
    if postgres and notify.enabled():
        sql = f"WITH created AS ({sql}) SELECT id, pg_notify(%s, queue) FROM created"
        params.append(notify.CHANNEL)
    return {r_uuid(row[0]) for row in fetchall(sql, params)}


def _deadline(run: NewRun, now: datetime) -> datetime | None:
    if run.deadline_at is None and run.deadline_after is not None:
        return now + run.deadline_after
    return run.deadline_at


def _values(run: NewRun, now: datetime) -> list[Any]:
    """A single run's parameters, in _COLUMNS' order: `_row`'s values (one definition of what
    a run's columns hold), the absent ones NULL."""
    row = _row(run, now, postgres=True)
    return [
        p_json(row.get(name))
        if name == "input" or (kind == "jsonb" and name in row)
        else row.get(name)
        for name, kind in _COLUMNS
    ]


def _row(run: NewRun, now: datetime, postgres: bool) -> dict[str, Any]:
    """A run's columns as the statement's JSON reads them. Absent, not null, where there is no
    value: PostgreSQL would read a JSON null into a jsonb column as the JSON value null."""
    deadline_at = _deadline(run, now)
    row: dict[str, Any] = {
        "id": p_uuid(run.id),
        "task_name": run.task_name,
        "version": run.version,
        "queue": run.queue,
        "priority": run.priority,
        "input_hash": run.input_hash,
        "trace_id": run.trace_id,
        "parent_step": run.parent_step,
        "available_at": p_dt(run.available_at or now),
        "rate_limit": run.rate_limit,
    }
    if run.debounce is not None:
        row["available_at"] = p_dt(now + run.debounce)
    # SQLite stores JSON as Django writes it (json.dumps), and reads `->>` of a JSON string as
    # its text: the document goes in as that text.
    row["input"] = run.input if postgres else json.dumps(run.input)
    if run.tags:
        row["tags"] = run.tags if postgres else json.dumps(run.tags)
    optional = {
        "idempotency_key": run.idempotency_key,
        "deadline_at": p_dt(deadline_at),
        "parent_run_id": p_uuid(run.parent_run_id),
        "concurrency_key": run.concurrency_key,
        "concurrency_limit": run.concurrency_limit,
        "queueing_key": run.queueing_key,
        "debounce_key": run.debounce_key,
        "debounce_until": p_dt(now + run.debounce_max) if run.debounce_max else None,
        "rate_key": run.rate_key,
    }
    row.update((k, v) for k, v in optional.items() if v is not None)
    return row


# The many-runs statement on PostgreSQL: a column whose value is the same for every run is one
# parameter of it, the others come from the JSON document, whose rows hold only them. What
# each column is made of, to tell (by identity first: the runs of one enqueue_many share their
# common values); its JSON as the document writes it.
_MADE_OF: dict[str, tuple[str, ...]] = {
    **{name: (name,) for name, _ in _COLUMNS},
    # Inputs told apart by their hash, of their canonical JSON: {"a": 1} == {"a": True} in
    # Python, not as stored.
    "input": ("input_hash", "input_json"),
    "available_at": ("available_at", "debounce"),
    "deadline_at": ("deadline_at", "deadline_after"),
    "debounce_until": ("debounce_max",),
}


def _text(value: Any) -> str:
    return "null" if value is None else encode_basestring(value)


def _number(value: Any) -> str:
    return "null" if value is None else str(value)


def _moment(value: Any) -> str:
    return "null" if value is None else f'"{value}"'


def _document(value: Any) -> str:
    return "null" if value is None else json.dumps(value, separators=(",", ":"))


_JSON_OF: dict[str, Any] = {"text": _text, "integer": _number, "timestamptz": _moment}


def _fragments(name: str, kind: str, runs: list[NewRun], now: datetime) -> list[str]:
    """Column `name` of every run as JSON text."""
    if name == "id":
        return [f'"{r.id.hex}"' for r in runs]
    if name == "input":
        return [r.input_json or _document(r.input) for r in runs]
    if name == "tags":
        return [_document(r.tags or None) for r in runs]
    if kind == "uuid":
        return [
            _text(None if r.parent_run_id is None else str(p_uuid(r.parent_run_id))) for r in runs
        ]
    if name in ("available_at", "deadline_at", "debounce_until"):
        return [_moment(_row(r, now, postgres=True).get(name)) for r in runs]
    return [_JSON_OF[kind](v) for v in map(attrgetter(name), runs)]


def _create_many_pg(runs: list[NewRun], now: datetime) -> set[uuid.UUID]:
    """Insert runs in one statement whose JSON document holds only the columns that differ
    between them (an enqueue_many's ids, inputs and hashes, often nothing else). Without a
    conflict clause every run is inserted or the statement fails, so nothing is read back;
    idle workers are woken with one NOTIFY per queue."""
    first, count = runs[0], len(runs)
    varying = tuple(
        (name, kind)
        for name, kind in _COLUMNS
        if any(
            list(map(attrgetter(a), runs)).count(getattr(first, a)) != count for a in _MADE_OF[name]
        )
    )
    conflict = _conflict(runs)
    wake = notify.enabled()
    sql = _many_statement(varying, conflict, wake)
    row = _row(first, now, postgres=True)
    params: list[Any] = []
    for name, kind in _COLUMNS:
        if (name, kind) in varying:
            continue
        value = row.get(name)
        if name == "input":
            value = first.input_json or _document(value)
        elif kind == "jsonb":
            value = _document(value) if value is not None else None
        params.append(value)
    template = "{" + ",".join(f'"{name}":%s' for name, _ in varying) + "}"
    columns = [_fragments(name, kind, runs, now) for name, kind in varying]
    document = "[" + ",".join([template % parts for parts in zip(*columns, strict=True)]) + "]"
    params += [p_dt(now), p_dt(now), document]
    if wake:
        params.append(notify.CHANNEL)
    if not conflict:
        if wake:
            fetchall(sql, params)
        else:
            execute(sql, params)
        return {r.id for r in runs}
    return {r_uuid(found[0]) for found in fetchall(sql, params) if found[0] is not None}


@functools.cache
def _many_statement(varying: tuple[tuple[str, str], ...], conflict: str, wake: bool) -> str:
    names = {name for name, _ in varying}
    values = ", ".join(
        (f"NULLIF(r.{name}, 'null'::jsonb)" if name == "tags" else f"r.{name}")
        if name in names
        else f"%s::{kind}"
        for name, kind in _COLUMNS
    )
    record = ", ".join(f"{name} {kind}" for name, kind in varying)
    returning = " RETURNING id, queue" if conflict else " RETURNING queue"
    insert = f"""
        INSERT INTO {RUN} ({_NAMES}, status, attempts, failures, worker_id, waiting_on,
            cancel_reason, unreached_steps, created_at, updated_at)
        SELECT {values}, 'pending', 0, 0, '', '', '', '[]', %s::timestamptz, %s::timestamptz
        FROM json_to_recordset(%s::json) AS r({record}){conflict}"""
    if not wake:
        return insert + (" RETURNING id" if conflict else "")
    woken = "SELECT pg_notify(%s, q) FROM (SELECT DISTINCT queue AS q FROM created) d"
    if not conflict:
        return f"WITH created AS ({insert}{returning}) {woken}"
    return (
        f"WITH created AS ({insert}{returning}), woken AS ({woken})"
        " SELECT id FROM created UNION ALL SELECT NULL FROM woken"
    )
