"""An operator's retry: a failed or canceled run goes back to `pending` for a fresh pass.

Completed steps stay completed (replay returns them); steps that failed for good run again
because their failure belongs to an earlier pass. With `from_step`, that step and every
attempt recorded after it are marked superseded: kept as history, ignored by replay, so they
run again; the facts their waits took are released for the reruns to take again. The run's
worker is cleared: the earlier pass's worker holds nothing (its attempts keep their worker).

A child run is retried only while its parent is unfinished (pending, running or waiting): a
finished parent awaits no child, so the child would run for nobody. The parent's own retry
is the way back: its fresh pass starts its children again.
"""

from __future__ import annotations

import json
import uuid

from django.db.models import Max

from .. import clock
from ..db import notify
from ..db.alias import atomic
from ..db.sql import execute, is_postgres, json_rows, p_dt, p_uuid, query
from ..exceptions import UnknownRunError, UnknownStepError
from ..models import Fact, StepAttempt, WorkflowRun
from ..states import FINISHED, RunStatus, current_pass
from . import claim_floor
from .outcomes import lock_parent, lock_parents

RETRYABLE = (RunStatus.FAILED, RunStatus.CANCELED)


def retry_run(
    run_id: uuid.UUID, *, from_step: str | None = None, reason: str = "", by: str = ""
) -> bool:
    """Failed or canceled -> pending, due now. False (nothing changed) for any other status,
    or for a child whose parent has finished (`retry_refusal` says why)."""
    with atomic():
        lock_parent(run_id)  # the order every run end takes: parent row, then the child's
        run = WorkflowRun.objects.select_for_update().filter(pk=run_id).first()
        if run is None:
            raise UnknownRunError(f"no run with id {run_id}")
        if _refusal(run) is not None:
            return False  # whatever from_step names: nothing is retried, so nothing is wrong
        steps = StepAttempt.objects.filter(run_id=run_id, superseded=False)
        first: int | None = None
        if from_step is not None:
            first = steps.filter(name=from_step).order_by("id").values_list("id", flat=True).first()
            if first is None:
                names = sorted(set(steps.values_list("name", flat=True)))
                raise UnknownStepError(
                    f"run {run_id} recorded no step {from_step!r}"
                    + (f"; its steps: {', '.join(names)}" if names else "; it recorded none")
                )
        if first is not None:
            later = steps.filter(id__gte=first)
            Fact.objects.filter(
                run_id=run_id, consumed_by__in=later.values_list("name", flat=True)
            ).update(consumed_by="")
            later.update(superseded=True)
        _send_back([run], reason=reason, by=by, from_step=from_step)
    return True


def retry_batch(run_ids: list[uuid.UUID], *, reason: str = "", by: str = "") -> list[uuid.UUID]:
    """engine.retry_runs' batch, in one transaction: each run `retry_run` would retry now is
    sent back as it does (without from_step); the ids of those."""
    with atomic():
        lock_parents(run_ids)  # parent rows first, as every run end takes them
        runs = list(
            WorkflowRun.objects.select_for_update()
            .filter(pk__in=run_ids, status__in=RETRYABLE)
            .order_by("pk")
        )
        parent_ids = {run.parent_run_id for run in runs if run.parent_run_id is not None}
        parents: dict[uuid.UUID | None, str] = dict(
            WorkflowRun.objects.filter(pk__in=parent_ids).values_list("pk", "status")
        )
        keep = [
            run
            for run in runs
            if why_not_retryable(run.status, run.parent_run_id, parents.get(run.parent_run_id))
            is None
        ]
        _send_back(keep, reason=reason, by=by, from_step=None)
    return [run.pk for run in keep]


def _send_back(runs: list[WorkflowRun], *, reason: str, by: str, from_step: str | None) -> None:
    """Failed or canceled -> pending, due now, in one statement for all `runs` (row locks
    held): a fresh workflow retry budget, the pass numbering carried on, the retry recorded."""
    if not runs:
        return
    now = clock.now()
    recorded = dict(
        StepAttempt.objects.filter(run_id__in=[run.pk for run in runs])
        .values("run_id")
        .annotate(p=Max("run_pass"))
        .values_list("run_id", "p")
    )
    entry = {"at": now.isoformat(), "by": by, "reason": reason, "from_step": from_step}
    postgres = is_postgres()
    rows = []
    for run in runs:
        retries = [*(run.retries or []), entry]
        rows.append(
            {
                "id": p_uuid(run.pk),
                "pass_offset": _passes_so_far(run, recorded.get(run.pk)),
                "retries": retries if postgres else json.dumps(retries),
            }
        )
    execute(
        query("retry_runs"),
        {"now": p_dt(now), "awaited": False, "rows": json_rows(rows)},
    )
    # Partitioned: a finished run of an old period is claimable again, below this process's
    # claim floor (the others' floors reach it within claim_floor.REFRESH_SECONDS).
    claim_floor.lower([run.pk for run in runs])
    for queue in sorted({run.queue for run in runs}):
        notify.wake_workers(queue)


def retry_refusal(run_id: uuid.UUID) -> str | None:
    """Why `retry_run` refuses the run as it is now, or None when it would retry it."""
    run = WorkflowRun.objects.filter(pk=run_id).first()
    if run is None:
        raise UnknownRunError(f"no run with id {run_id}")
    return _refusal(run)


def _refusal(run: WorkflowRun) -> str | None:
    parent_status = None
    if run.status in RETRYABLE and run.parent_run_id is not None:
        parent = WorkflowRun.objects.filter(pk=run.parent_run_id).values_list("status", flat=True)
        parent_status = parent.first()
    return why_not_retryable(run.status, run.parent_run_id, parent_status)


def why_not_retryable(
    status: str, parent_run_id: uuid.UUID | None, parent_status: str | None
) -> str | None:
    """The retry rule, from a run's status and its parent's (None: no parent)."""
    if status not in RETRYABLE:
        return f"the run is {status}: only a failed or canceled run can be"
    if parent_status in FINISHED:
        return f"its parent run {parent_run_id} is {parent_status}; retry the parent instead"
    return None


def _passes_so_far(run: WorkflowRun, recorded: int | None) -> int:
    """The number of the last pass that began (a failed run's `failures` counted it already;
    a canceled one's did not), or of the latest pass any attempt recorded (`recorded`) if that
    is higher."""
    this = current_pass(run.failures, run.pass_offset)  # the pass a claim would execute next
    began = this - 1 if run.status == RunStatus.FAILED else this
    return max(began, recorded or 0)
