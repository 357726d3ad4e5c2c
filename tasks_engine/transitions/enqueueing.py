"""Answering enqueues: each new run is inserted, or answered by the run that holds its key.

`enqueue` and `enqueue_many` hand their checked runs to `answer`, which inserts them through
`transitions.create_runs` (one statement per chunk) and resolves those not inserted: an
idempotency key another run holds with the same input (that run, deduplicated; with another
input, `IdempotencyConflict`), a queueing key that a queued run holds (that run), or a
debounce key whose window's run is still queued (that run, given the new input and due time).
Items of one call that repeat a key are answered by the first of them, as if enqueued one
after the other (a debounce key's first item takes the last one's input). Runs whose workflow
says `on_limit="cancel_new"` or `"cancel_running"` go through key_limits.py.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

from .. import clock
from ..db.alias import atomic
from ..db.sql import fetchall, p_dt, p_json, query, r_uuid
from ..exceptions import IdempotencyConflict
from ..models import QUEUED, WorkflowRun
from . import key_limits
from .creating import NewRun, create_runs

# A key is taken by a row that a concurrent transaction may yet end (committed, the queued run
# claimed): the insert waits for it, and the lookup then finds the holder, or nothing and the
# insert is tried again.
TAKEN_TRIES = 5
# A debounce key's window run can be claimed between the insert that found it and the update
# that would extend it, at each try: under a stream of enqueues and claims of one key (a
# window of 0), every try makes progress fleet-wide, but this one may lose several in a row.
DEBOUNCE_TRIES = 50
CHUNK = 5000  # runs per INSERT
LOOKUP_CHUNK = 900  # keys per lookup: under SQLite's bound on a statement's parameters

Answer = tuple[uuid.UUID, bool]  # (run id, deduplicated)


def _one_statement(runs: list[NewRun]) -> bool:
    """Whether `answer` inserts every one of `runs` in one statement, or fails: none has a
    key another run may hold, nor a limit whose enqueue cancels runs, and they fit one
    INSERT. No savepoint is then needed to take a partial write back."""
    return len(runs) <= CHUNK and not any(map(_keyed, runs))


def _keyed(run: NewRun) -> bool:
    return (
        run.idempotency_key is not None
        or run.queueing_key is not None
        or run.debounce_key is not None
        or (run.on_limit != "queue" and run.concurrency_key is not None)
    )


def answer(task_name: str, runs: list[NewRun]) -> list[Answer]:
    """Insert `runs` (all of task `task_name`) and answer each: (run id, deduplicated). All
    or none: an error (an `IdempotencyConflict` found after an insert) writes nothing."""
    if _one_statement(runs):
        created = create_runs(runs)
        if len(created) == len(runs):
            return [(run.id, False) for run in runs]
        raise RuntimeError(f"enqueue of {task_name}: {len(created)} of {len(runs)} runs inserted")
    # Several statements (chunks, key look-ups) take back each other's writes on an error;
    # one run's single INSERT needs no savepoint.
    with atomic() if len(runs) > 1 else contextlib.nullcontext():
        strategic = [r for r in runs if r.on_limit != "queue" and r.concurrency_key is not None]
        if not strategic:
            return _answer(task_name, runs)
        with atomic():  # the keys' enqueues serialised until the cancels commit
            key_limits.lock_keys({r.concurrency_key for r in strategic if r.concurrency_key})
            answers = _answer(task_name, runs)
            created = {run_id for run_id, deduplicated in answers if not deduplicated}
            key_limits.apply_on_limit([r for r in strategic if r.id in created])
        return answers


def _answer(task_name: str, runs: list[NewRun]) -> list[Answer]:
    answers: list[Answer | None] = [None] * len(runs)
    repeats = _repeats(task_name, runs)
    todo = [i for i in range(len(runs)) if i not in repeats]
    tries = DEBOUNCE_TRIES if any(r.debounce_key is not None for r in runs) else TAKEN_TRIES
    for _ in range(tries):
        for chunk in _chunks(todo, CHUNK):
            created = create_runs([runs[i] for i in chunk])
            for i in chunk:
                if runs[i].id in created:
                    answers[i] = (runs[i].id, False)
        todo = [i for i in todo if answers[i] is None]
        if not todo:
            break
        _held_by_idempotency_key(task_name, runs, todo, answers)
        _held_by_queueing_key(runs, todo, answers)
        _held_by_debounce_key(task_name, runs, todo, answers)
        todo = [i for i in todo if answers[i] is None]
        if not todo:
            break
    if todo:
        raise RuntimeError(
            f"enqueue of {task_name}: a key stayed taken by runs that were gone when looked up"
            f" ({tries} tries)"
        )
    for i, first in repeats.items():
        found = answers[first]
        assert found is not None
        answers[i] = (found[0], True)
    return [a for a in answers if a is not None]


def _repeats(task_name: str, runs: list[NewRun]) -> dict[int, int]:
    """The items of one call that repeat an earlier item's key -> that earlier item.
    IdempotencyConflict, before anything is written, for an idempotency key repeated with
    another input."""
    first_with_key: dict[str, int] = {}
    first_queued: dict[str, int] = {}
    first_debounced: dict[str, int] = {}
    repeats: dict[int, int] = {}
    for i, run in enumerate(runs):
        key, queueing, debounced = run.idempotency_key, run.queueing_key, run.debounce_key
        if key is not None and (j := first_with_key.get(key)) is not None:
            if runs[j].input_hash != run.input_hash:
                raise IdempotencyConflict(
                    f"idempotency key {key!r} of task {task_name!r} is given to inputs {j} and"
                    f" {i}, which differ"
                )
            repeats[i] = j
        elif queueing is not None and (j := first_queued.get(queueing)) is not None:
            repeats[i] = j
        elif debounced is not None and (j := first_debounced.get(debounced)) is not None:
            repeats[i] = j
            # the last one's input
            runs[j].input, runs[j].input_hash = run.input, run.input_hash
            runs[j].input_json = run.input_json
        else:
            if key is not None:
                first_with_key[key] = i
            if queueing is not None:
                first_queued[queueing] = i
            if debounced is not None:
                first_debounced[debounced] = i
    return repeats


def _held_by_idempotency_key(
    task_name: str, runs: list[NewRun], todo: list[int], answers: list[Answer | None]
) -> None:
    keys = {i: key for i in todo if (key := runs[i].idempotency_key) is not None}
    held: dict[str | None, tuple[uuid.UUID, str]] = {}
    for chunk in _chunks(sorted(set(keys.values())), LOOKUP_CHUNK):
        rows = WorkflowRun.objects.filter(task_name=task_name, idempotency_key__in=chunk)
        for key, pk, digest in rows.values_list("idempotency_key", "pk", "input_hash"):
            held[key] = (pk, digest)
    for i, key in keys.items():
        found = held.get(key)
        if found is None:
            continue
        if found[1] != runs[i].input_hash:
            raise IdempotencyConflict(
                f"idempotency key {key!r} of task {task_name!r} is taken by"
                f" run {found[0]} with a different input"
            )
        answers[i] = (found[0], True)


def _held_by_queueing_key(
    runs: list[NewRun], todo: list[int], answers: list[Answer | None]
) -> None:
    """The queued runs holding the queueing keys (run_queueing_key_unique's rows)."""
    keys = {
        i: key for i in todo if answers[i] is None and (key := runs[i].queueing_key) is not None
    }
    holders: dict[str | None, uuid.UUID] = {}
    for chunk in _chunks(sorted(set(keys.values())), LOOKUP_CHUNK):
        rows = WorkflowRun.objects.filter(queueing_key__in=chunk, **QUEUED)
        holders.update(rows.values_list("queueing_key", "pk"))
    for i, key in keys.items():
        holder = holders.get(key)
        if holder is not None:
            answers[i] = (holder, True)


def _held_by_debounce_key(
    task_name: str, runs: list[NewRun], todo: list[int], answers: list[Answer | None]
) -> None:
    """The queued run of each debounce key's window, given the enqueue's input and its due
    time pushed back (`debounce_extend`: to `debounce` from now, at most its debounce_until).
    The update finds the run only while it is still queued: under the row lock (PostgreSQL;
    SQLite has one writer), so a run a claim took meanwhile is left alone, and the enqueue
    inserts the next window's run on its next try."""
    for i in todo:
        run = runs[i]
        if answers[i] is not None or run.debounce_key is None or run.debounce is None:
            continue
        now = clock.now()
        params = {
            "input": p_json(run.input),
            "input_hash": run.input_hash,
            "version": run.version,
            "due": p_dt(now + run.debounce),
            "now": p_dt(now),
            "task_name": task_name,
            "key": run.debounce_key,
        }
        found = fetchall(query("debounce_extend"), params)
        if found:
            answers[i] = (r_uuid(found[0][0]), True)


def _chunks[T](items: list[T], size: int) -> Iterator[list[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
