"""Acting on every run a filter matches: `cancel_runs` and `retry_runs`.

The matching runs are taken in batches of `BATCH`, in id order (keyset: each batch starts
after the last id of the one before, so no statement reads more than a batch's worth past
what it skips by the index), each batch in its own short transaction through the same
transitions as `cancel` and `retry_run` (`transitions.cancel_batch`, `transitions.retry_batch`).
A batch that meets a deadlock or SQLite's busy lock is tried again; what earlier batches
changed stays changed. The count returned is the runs that changed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import datetime

from django.db import OperationalError
from django.db.models import QuerySet

from .. import transitions
from ..db.sql import is_postgres
from ..engine import check_time
from ..models import WorkflowRun
from ..states import ACTIVE, RunStatus
from ..transitions.retry import RETRYABLE
from ..values import tags as run_tags
from ..values.serialization import check_reason
from ..values.text import check_text

BATCH = 500
BATCH_TRIES = 5
Progress = Callable[[int, int], None]  # (runs changed so far, runs looked at so far)
Changed = Callable[[list[uuid.UUID]], None]  # a committed batch's changed runs


def cancel_runs(
    *,
    task: str | None = None,
    status: str | None = None,
    queue: str | None = None,
    tags: dict[str, str] | None = None,
    created_before: datetime | None = None,
    reason: str | None = None,
    progress: Progress | None = None,
) -> int:
    """Cancel every unfinished run that matches (every filter given must match; at least one
    is required, else ValueError and nothing changes), as `cancel` does; how many changed.
    A running run already asked to stop is not counted again."""
    check_reason(reason)
    runs = matching(task=task, status=status, queue=queue, tags=tags, created_before=created_before)
    return cancel_queryset(runs, reason, progress=progress)


def retry_runs(
    *,
    task: str | None = None,
    status: str | None = None,
    queue: str | None = None,
    tags: dict[str, str] | None = None,
    created_before: datetime | None = None,
    reason: str | None = None,
    by: str = "",
    progress: Progress | None = None,
) -> int:
    """Retry every failed or canceled run that matches, as `retry_run` does (a child whose
    parent has finished is left alone); at least one filter, else ValueError; how many were
    retried. `by` names who retried, for each run's retry history."""
    check_reason(reason)
    runs = matching(task=task, status=status, queue=queue, tags=tags, created_before=created_before)
    return retry_queryset(runs, reason, by=by, progress=progress)


def cancel_queryset(
    runs: QuerySet[WorkflowRun],
    reason: str | None,
    *,
    progress: Progress | None = None,
    changed: Changed | None = None,
) -> int:
    """`cancel_runs` of the runs of a queryset the caller filtered (the admin's list):
    `changed(ids)` hears of each batch's canceled runs once it has committed."""
    check_reason(reason)
    active = runs.filter(status__in=list(ACTIVE))
    return _in_batches(
        active, lambda ids: transitions.cancel_batch(ids, reason or ""), progress, changed
    )


def retry_queryset(
    runs: QuerySet[WorkflowRun],
    reason: str | None,
    *,
    by: str = "",
    progress: Progress | None = None,
    changed: Changed | None = None,
) -> int:
    """`retry_runs` of the runs of a queryset the caller filtered (see `cancel_queryset`)."""
    check_reason(reason)
    retryable = runs.filter(status__in=list(RETRYABLE))
    return _in_batches(
        retryable,
        lambda ids: transitions.retry_batch(ids, reason=reason or "", by=by),
        progress,
        changed,
    )


def matching(
    *,
    task: str | None = None,
    status: str | None = None,
    queue: str | None = None,
    tags: dict[str, str] | None = None,
    created_before: datetime | None = None,
) -> QuerySet[WorkflowRun]:
    """The runs every given filter matches. ValueError (nothing is read) without any filter,
    or for one that is not valid."""
    if all(v is None for v in (task, status, queue, created_before)) and not tags:
        raise ValueError(
            "give at least one filter (task, status, queue, tags, created_before):"
            " acting on every run is not a bulk operation's default"
        )
    runs = WorkflowRun.objects.all()
    for what, value, longest in (("task", task, 200), ("queue", queue, 100)):
        if value is not None:
            check_text(what, value, longest, not_a_string=ValueError)
    if task is not None:
        runs = runs.filter(task_name=task)
    if queue is not None:
        runs = runs.filter(queue=queue)
    if status is not None:
        if status not in RunStatus.values:
            raise ValueError(f"unknown status {status!r}; one of {', '.join(RunStatus.values)}")
        runs = runs.filter(status=status)
    if created_before is not None:
        check_time("created_before", created_before)
        runs = runs.filter(created_at__lt=created_before)
    if tags is not None and not tags:
        raise ValueError("tags must name at least one pair")
    return run_tags.with_tags(runs, run_tags.check_tags(tags), postgres=is_postgres())


def _in_batches(
    runs: QuerySet[WorkflowRun],
    act: Callable[[list[uuid.UUID]], list[uuid.UUID]],
    progress: Progress | None,
    on_changed: Changed | None,
) -> int:
    changed = seen = 0
    after: uuid.UUID | None = None
    while True:
        page = runs if after is None else runs.filter(pk__gt=after)
        ids = list(page.order_by("pk").values_list("pk", flat=True)[:BATCH])
        if not ids:
            return changed
        done = _retrying(act, ids)
        if on_changed is not None and done:
            on_changed(done)
        changed += len(done)
        seen += len(ids)
        after = ids[-1]
        if progress is not None:
            progress(changed, seen)


def _retrying(
    act: Callable[[list[uuid.UUID]], list[uuid.UUID]], ids: list[uuid.UUID]
) -> list[uuid.UUID]:
    """One batch; a deadlock with a worker's write (or SQLite's busy lock) rolled it back
    whole, so it is tried again after a short pause."""
    for attempt in range(BATCH_TRIES):
        try:
            return act(ids)
        except OperationalError:
            if attempt == BATCH_TRIES - 1:
                raise
            time.sleep(0.05 * 2**attempt)
    raise AssertionError("unreachable")
