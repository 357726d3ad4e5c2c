"""Answering enqueues: each new run is inserted, or answered by the run that holds its key.

`enqueue` and `enqueue_many` hand their checked runs to `answer`, which inserts them through
`transitions.create_runs` (one statement per chunk) and resolves those not inserted: an
idempotency key another run holds with the same input (that run, deduplicated; with another
input, `IdempotencyConflict`), or a queueing key that a queued run holds (that run). Items of
one call that repeat a key are answered by the first of them, as if enqueued one after the
other.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

from ..exceptions import IdempotencyConflict
from ..models import QUEUED, WorkflowRun
from .creating import NewRun, create_runs

# A key is taken by a row that a concurrent transaction may yet end (committed, the queued run
# claimed): the insert waits for it, and the lookup then finds the holder, or nothing and the
# insert is tried again.
TAKEN_TRIES = 5
CHUNK = 5000  # runs per INSERT
LOOKUP_CHUNK = 900  # keys per lookup: under SQLite's bound on a statement's parameters

Answer = tuple[uuid.UUID, bool]  # (run id, deduplicated)


def answer(task_name: str, runs: list[NewRun]) -> list[Answer]:
    """Insert `runs` (all of task `task_name`) and answer each: (run id, deduplicated)."""
    answers: list[Answer | None] = [None] * len(runs)
    repeats = _repeats(task_name, runs)
    todo = [i for i in range(len(runs)) if i not in repeats]
    for _ in range(TAKEN_TRIES):
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
        todo = [i for i in todo if answers[i] is None]
        if not todo:
            break
    if todo:
        raise RuntimeError(
            f"enqueue of {task_name}: a key stayed taken by runs that were gone when looked up"
            f" ({TAKEN_TRIES} tries)"
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
    repeats: dict[int, int] = {}
    for i, run in enumerate(runs):
        key, queueing = run.idempotency_key, run.queueing_key
        if key is not None and (j := first_with_key.get(key)) is not None:
            if runs[j].input_hash != run.input_hash:
                raise IdempotencyConflict(
                    f"idempotency key {key!r} of task {task_name!r} is given to inputs {j} and"
                    f" {i}, which differ"
                )
            repeats[i] = j
        elif queueing is not None and (j := first_queued.get(queueing)) is not None:
            repeats[i] = j
        else:
            if key is not None:
                first_with_key[key] = i
            if queueing is not None:
                first_queued[queueing] = i
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


def _chunks[T](items: list[T], size: int) -> Iterator[list[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
