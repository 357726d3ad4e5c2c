"""Run outcomes: complete, fail, requeue, park, cancel, wake; and a parent's wake-up."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db.models import DateTimeField, Value
from django.db.models.functions import Coalesce

from .. import clock
from ..db import notify
from ..db.alias import atomic
from ..db.sql import execute, fetchall, is_postgres, p_dt, p_json, p_uuid
from ..exceptions import DeadlineExceededError, LeaseLostError
from ..models import StepAttempt, Worker, WorkflowRun
from ..states import ACTIVE, RunStatus
from ..values.serialization import encode_error
from ._common import RUN, STEP, Lease, attempt_write, holds
from .dead_workers import alive
from .hot import HotWrite, write_alone, writer_for
from .steps import _close_running_attempts, flush_deferred

# -- run outcomes -----------------------------------------------------------------------------


def _cas_run(
    lease: Lease,
    assignments: str,
    params: list[Any],
    *,
    condition: str = "",
    progress: dict[str, Any] | None = None,
) -> int:
    """Compare-and-set on the run row, after the deferred step completions (rare here: the
    steps' starts and the run's completion carry them). With `condition`, a held run that does
    not meet it is left as it is and 0 is returned. `progress`: the handler's last report, not
    yet written (the heartbeat's flush cannot write it once the run is let go)."""
    flush_deferred(lease)
    if progress is not None:
        assignments, params = f"{assignments}, progress = %s", [*params, p_json(progress)]
    sql = (
        f"UPDATE {RUN} SET {assignments}, updated_at = %s"
        f" WHERE id = %s AND lease_token = %s{condition}"
    )
    full = [*params, p_dt(clock.now()), p_uuid(lease.run_id), p_uuid(lease.token)]
    changed = execute(sql, full)
    if not changed and not (condition and holds(lease)):
        raise LeaseLostError(f"run {lease.run_id}: lease lost")
    return changed


@attempt_write
def complete_run(
    lease: Lease,
    output: Any,
    unreached: list[str],
    *,
    has_parent: bool = False,
    progress: dict[str, Any] | None = None,
    ended: Callable[[str | None], None] | None = None,
) -> str:
    """Running -> completed. The handler returned, so every attempt of this pass is closed.
    The last progress the handler reported (not yet flushed by the heartbeat) goes along.
    Without a parent it is the run's last write, handed off to the writer (the slot does not
    wait for it); a child's completion also wakes its parent, in one transaction. `ended` is
    told the status written, once it is: "completed", or "canceled" when a cancel committed
    first; None if, handed off, it failed (a write that raises instead is not reported).

    Past the run's deadline (the lease's `deadline_at`, at the time the completion would be
    written) the run fails with DeadlineExceededError instead: the handler returned after the
    deadline, before a heartbeat aborted it. Returns "failed" then (`ended` is not told: the
    caller records the failure), else "completed"."""
    at = clock.now()
    if lease.deadline_at is not None and at >= lease.deadline_at:
        error = encode_error(DeadlineExceededError("deadline passed"))
        fail_run(lease, error, has_parent=has_parent, progress=progress)
        return "failed"
    write = HotWrite("complete", lease, lease.deferred.pending(), at)
    write.output, write.unreached, write.progress = output, unreached, progress
    write.ended = ended
    if not has_parent:
        writer_for(lease).hand_off(write)
        return "completed"
    with lease.deferred.until_commit(), atomic():
        lock_parent(lease.run_id)
        write_alone(write)
        write.outcome()
        wake_parent(lease.run_id)
    return "completed"


@attempt_write
def fail_run(
    lease: Lease,
    error: dict[str, Any],
    *,
    has_parent: bool = False,
    progress: dict[str, Any] | None = None,
) -> None:
    # A cancel that committed first wins, as over a completion (hot_completes): the run ends
    # canceled, its error kept for the record.
    _end_run(
        lease,
        "status = CASE WHEN cancel_requested_at IS NULL THEN 'failed' ELSE 'canceled' END,"
        " error = %s, failures = failures + 1, finished_at = %s,"
        " lease_token = NULL, available_at = NULL, waiting_on = ''",
        [p_json(error), p_dt(clock.now())],
        has_parent=has_parent,
        children_reason=f"parent run {lease.run_id} failed",
        progress=progress,
    )


def _end_run(
    lease: Lease,
    assignments: str,
    params: list[Any],
    *,
    has_parent: bool,
    children_reason: str | None = None,
    progress: dict[str, Any] | None = None,
) -> None:
    """The one way a run ends but completing: lock the parent first (see lock_parent),
    compare-and-set the run, close attempts still open, cancel children still unfinished
    (`children_reason`: a failed or canceled run leaves none behind), wake the parent waiting
    on it; all in one transaction."""
    with lease.deferred.until_commit(), atomic():
        if has_parent:
            lock_parent(lease.run_id)
        _cas_run(lease, assignments, params, progress=progress)
        _close_running_attempts(lease, counted=False)
        if children_reason is not None:
            cancel_children(lease.run_id, children_reason)
        if has_parent:
            wake_parent(lease.run_id)


@attempt_write
def requeue_run(
    lease: Lease,
    available_at: datetime,
    *,
    error: dict[str, Any] | None = None,
    count_failure: bool = False,
    interrupted_count: bool = False,
    failed_step: tuple[int, dict[str, Any]] | None = None,
    progress: dict[str, Any] | None = None,
) -> None:
    """Back to `pending`: step retry backoff, workflow retry, or a graceful hand-back."""
    with lease.deferred.until_commit(), atomic():
        _cas_run(
            lease,
            "status = 'pending', lease_token = NULL, available_at = %s, waiting_on = '',"
            " failures = failures + %s, error = COALESCE(%s, error)",
            [p_dt(available_at), 1 if count_failure else 0, p_json(error)],
            progress=progress,
        )
        if failed_step is not None:
            step_id, step_error = failed_step
            execute(
                f"UPDATE {STEP} SET status = 'failed', error = %s, finished_at = %s"
                f" WHERE id = %s AND status = 'running'",
                [p_json(step_error), p_dt(clock.now()), step_id],
            )
        _close_running_attempts(lease, counted=interrupted_count, work_only=True)


@attempt_write
def park_run(
    lease: Lease,
    waiting_on: str,
    wake_at: datetime | None,
    deadline: datetime | None,
    progress: dict[str, Any] | None = None,
) -> bool:
    """Running -> waiting, unless cancel was requested (then False, and nothing changes: the
    holder ends the run canceled). One statement: a cancel that commits first is seen by its
    condition, one that commits later finds the run waiting and cancels it there. The wake
    time is capped by the deadline so the run fails on time."""
    if deadline is not None and (wake_at is None or deadline < wake_at):
        wake_at = deadline
    return bool(
        _cas_run(
            lease,
            "status = 'waiting', lease_token = NULL, available_at = %s, waiting_on = %s",
            [p_dt(wake_at), waiting_on],
            condition=" AND cancel_requested_at IS NULL",
            progress=progress,
        )
    )


@attempt_write
def cancel_running_run(lease: Lease, *, has_parent: bool = False) -> None:
    """The holder of a canceled run ends it and closes whatever attempt was in flight."""
    _end_run(
        lease,
        "status = 'canceled', finished_at = %s, lease_token = NULL, available_at = NULL,"
        " waiting_on = ''",
        [p_dt(clock.now())],
        has_parent=has_parent,
        children_reason=f"parent run {lease.run_id} canceled",
    )


def cancel_idle_run(run: WorkflowRun, reason: str) -> None:
    """Pending or waiting (or running with no live holder: `_holders_gone`) -> canceled, its
    attempts left running closed as abandoned, uncounted. The caller holds the row lock."""
    cancel_idle_runs([run], reason)


def cancel_idle_runs(runs: list[WorkflowRun], reason: str) -> None:
    """`cancel_idle_run` of several runs in one statement each for runs and attempts."""
    now = clock.now()
    ids = [run.pk for run in runs]
    WorkflowRun.objects.filter(pk__in=ids, status__in=list(ACTIVE)).update(
        status="canceled",
        cancel_requested_at=Coalesce("cancel_requested_at", Value(now, DateTimeField())),
        cancel_reason=reason,
        finished_at=now,
        updated_at=now,
        available_at=None,
        lease_token=None,
        waiting_on="",
    )
    StepAttempt.objects.filter(run_id__in=ids, status="running").update(
        status="abandoned", counted=False, finished_at=now
    )
    for run in runs:
        if run.parent_run_id is not None:
            wake_parent(run.pk)


def cancel_active(run: WorkflowRun, reason: str) -> None:
    """Cancel an unfinished run whose row lock the caller holds, and its children: a pending or
    waiting run ends now; a running one is asked to stop (its holder ends it)."""
    cancel_all_active([run], reason)


def cancel_all_active(runs: list[WorkflowRun], reason: str) -> None:
    """`cancel_active` of several runs whose row locks the caller holds, a statement for all of
    them at each step (engine.cancel passes one, cancel_runs a batch)."""
    gone = _holders_gone([run for run in runs if run.status == RunStatus.RUNNING])
    asked = [run for run in runs if run.status == RunStatus.RUNNING and run.pk not in gone]
    idle = [run for run in runs if run.status != RunStatus.RUNNING or run.pk in gone]
    if asked:
        request_cancels(asked, reason)
        for queue in sorted({run.queue for run in asked}):
            notify.wake_workers(queue, cancel=True)
    if idle:
        cancel_idle_runs(idle, reason)
    cancel_children_of([run.pk for run in runs], reason)


def cancel_batch(run_ids: list[uuid.UUID], reason: str) -> list[uuid.UUID]:
    """engine.cancel_runs' batch, in one transaction: each run still unfinished (and not a
    running run already asked to stop) is canceled as `engine.cancel` does; the ids of those."""
    with atomic():
        lock_parents(run_ids)  # parent rows before their children's, as every run end takes them
        runs = [
            run
            for run in WorkflowRun.objects.select_for_update()
            .filter(pk__in=run_ids, status__in=list(ACTIVE))
            .order_by("pk")
            if run.status != RunStatus.RUNNING or run.cancel_requested_at is None
        ]
        cancel_all_active(runs, reason)
    return [run.pk for run in runs]


def _holders_gone(runs: list[WorkflowRun]) -> set[uuid.UUID]:
    """The running runs that no live worker holds: their worker is dead (its beat is older than
    DEAD_WORKER_SECONDS: its runs are anyone's to reclaim), or gone (reaped) with the lease
    expired. A cancel request would wait for a claim to end such a run, and when no live worker
    serves the run's (task, version) and queue (a version a deploy retired) none ever comes:
    the run stayed `running` with the request for good. The lease is taken from it (its token
    cleared), so a holder that was only partitioned writes nothing more."""
    holders = {run.worker_id for run in runs if run.worker_id}
    if not runs:
        return set()
    known = set(Worker.objects.filter(pk__in=holders).values_list("pk", flat=True))
    live = set(Worker.objects.filter(alive(), pk__in=holders).values_list("pk", flat=True))
    now = clock.now()
    gone = set()
    for run in runs:
        if run.worker_id in known:
            if run.worker_id not in live:
                gone.add(run.pk)
        elif run.available_at is not None and run.available_at <= now:
            gone.add(run.pk)
    return gone


ORPHAN_BATCH = 100


def end_orphaned_cancels() -> int:
    """The leader's service: end, as `canceled`, the running runs whose cancel was requested
    while a worker still held them and whose holder has died since (`_holders_gone`; the lease
    expired). A claim would end them, but none comes when no live worker serves the run's
    (task, version) or queue: a deploy that retired a version while a killed worker held a
    run of it left the run `running`, with the request, for good. Returns how many ended."""
    live = Worker.objects.filter(alive()).values("pk")
    ids = list(
        WorkflowRun.objects.filter(
            status=RunStatus.RUNNING,
            cancel_requested_at__isnull=False,
            available_at__lte=clock.now(),
        )
        .exclude(worker_id__in=live)
        .order_by("available_at")
        .values_list("pk", flat=True)[:ORPHAN_BATCH]
    )
    ended = 0
    for run_id in ids:
        with atomic():
            lock_parent(run_id)  # parent row, then the child's, as every run end takes them
            run = WorkflowRun.objects.select_for_update().filter(pk=run_id).first()
            if (
                run is not None
                and run.status == RunStatus.RUNNING
                and run.cancel_requested_at is not None
                and _holders_gone([run])
            ):
                cancel_idle_run(run, run.cancel_reason)
                ended += 1
    return ended


def cancel_children(run_id: uuid.UUID, reason: str) -> None:
    """Cancel every unfinished child of a run (parent's row locked first, then the child's)."""
    cancel_children_of([run_id], reason)


def cancel_children_of(run_ids: list[uuid.UUID], reason: str) -> None:
    """Cancel every unfinished child of these runs; without a reason, each child's says which
    parent was canceled."""
    children = list(
        WorkflowRun.objects.select_for_update()
        .filter(parent_run_id__in=run_ids, status__in=list(ACTIVE))
        .order_by("pk")
    )
    if reason or not children:
        if children:
            cancel_all_active(children, reason)
        return
    for parent_id in sorted({child.parent_run_id for child in children}, key=str):
        siblings = [child for child in children if child.parent_run_id == parent_id]
        cancel_all_active(siblings, f"parent run {parent_id} canceled")


def request_cancel(run: WorkflowRun, reason: str) -> None:
    """Running: record the request; the holder sees it at its next heartbeat (or NOTIFY)."""
    request_cancels([run], reason)


def request_cancels(runs: list[WorkflowRun], reason: str) -> None:
    now = clock.now()
    WorkflowRun.objects.filter(
        pk__in=[run.pk for run in runs], cancel_requested_at__isnull=True
    ).update(cancel_requested_at=now, cancel_reason=reason, updated_at=now)


def wake_run(run: WorkflowRun) -> None:
    """Waiting -> pending, due now (a fact or child result arrived). Caller holds the row lock."""
    now = clock.now()
    WorkflowRun.objects.filter(pk=run.pk, status="waiting").update(
        status="pending", available_at=now, waiting_on="", updated_at=now
    )


@attempt_write
def set_progress(lease: Lease, progress: dict[str, Any]) -> None:
    WorkflowRun.objects.filter(pk=lease.run_id, lease_token=lease.token).update(progress=progress)


def lock_parents(child_ids: list[uuid.UUID]) -> None:
    """`lock_parent` of a batch of runs, in id order (two batches lock in the same order)."""
    if not (is_postgres() and child_ids):
        return
    parents = WorkflowRun.objects.filter(pk__in=child_ids, parent_run__isnull=False)
    locked = WorkflowRun.objects.select_for_update().filter(pk__in=parents.values("parent_run_id"))
    list(locked.order_by("pk").values_list("pk", flat=True))


def lock_parent(child_id: uuid.UUID) -> None:
    """Before a child's end is written: lock its parent's row, which a parent about to park
    on this child holds while it reads the child's status. Whichever takes the lock second
    sees the other's commit, so the parent either finds the child finished or gets woken.
    (Waking alone is not enough: an UPDATE that finds the parent still running locks nothing.)
    Lock order: parent before child, as cancel's cascade does."""
    if is_postgres():
        fetchall(
            f"SELECT 1 FROM {RUN} WHERE id = (SELECT parent_run_id FROM {RUN} WHERE id = %s)"
            " FOR UPDATE",
            [p_uuid(child_id)],
        )


def pend_paused_timers(queues: list[str], batch: int = 1000) -> int:
    """Waiting -> pending, due now: runs of the paused `queues` whose timer (sleep, timeout,
    deadline) is due. No claim takes them while their queue is paused; they wait as pending
    and are claimed, by priority, once it is resumed. At most `batch` runs (the leader's
    next round takes the rest); returns how many."""
    if not queues:
        return 0
    now = clock.now()
    with atomic():
        ids = list(
            WorkflowRun.objects.filter(
                status="waiting", available_at__lte=now, queue__in=queues
            ).values_list("pk", flat=True)[:batch]
        )
        return WorkflowRun.objects.filter(pk__in=ids, status="waiting").update(
            status="pending", waiting_on="", updated_at=now
        )


def wake_parent(child_id: uuid.UUID) -> None:
    """A child finished: wake its parent if it waits on this child (same transaction)."""
    now = clock.now()
    rows = fetchall(
        f"UPDATE {RUN} SET status = 'pending', available_at = %s, waiting_on = '', updated_at = %s"
        f" WHERE id = (SELECT parent_run_id FROM {RUN} WHERE id = %s)"
        f" AND status = 'waiting' AND waiting_on = %s RETURNING queue",
        [p_dt(now), p_dt(now), p_uuid(child_id), f"child:{child_id}"],
    )
    for (queue,) in rows:
        notify.wake_workers(queue)
