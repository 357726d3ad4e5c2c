"""Step attempts: start, finish, and the deferred completion that rides on the next write
(the hot writes themselves are in hot.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NoReturn

from .. import clock
from ..db.sql import execute, p_dt, p_json, p_uuid
from ..exceptions import LeaseLostError, TaskCanceledError
from ._common import STEP, WORK_KINDS, Lease, _fence, _fence_params, attempt_write, holds
from .hot import HotWrite, writer_for

# -- steps ------------------------------------------------------------------------------------


@attempt_write
def close_interrupted_attempts(lease: Lease) -> int:
    """On reclaim: attempts an earlier holder left `running` become `abandoned`. They count
    against the step's retries (a step that kills its worker must not loop) unless this very
    worker left them: it is alive, so what cut them short was an outage that outlasted the
    lease, never the step (a worker id is new on every process start, so a crashed and
    restarted worker does count its attempts)."""
    sql = f"""
        UPDATE {STEP} SET status = 'abandoned', counted = (worker_id <> %s), finished_at = %s
        WHERE run_id = %s AND status = 'running' AND kind IN {WORK_KINDS}
          AND (lease_token IS NULL OR lease_token <> %s) AND {_fence()}
    """
    now = p_dt(clock.now())
    params = [lease.worker_id, now, p_uuid(lease.run_id), p_uuid(lease.token)]
    return execute(sql, [*params, *_fence_params(lease)])


@attempt_write
def drop_prestarted_step(lease: Lease, step_id: int) -> int:
    """Delete the first step's attempt a claim started on a wrong guess
    (first_steps.py), still `running` under this attempt's token: no body ever ran for
    it."""
    sql = f"DELETE FROM {STEP} WHERE id = %s AND status = 'running' AND lease_token = %s"
    return execute(sql, [step_id, p_uuid(lease.token)])


@attempt_write
def start_step(
    lease: Lease,
    name: str,
    kind: str,
    attempt: int,
    run_pass: int,
    *,
    status: str = "running",
    output: Any = None,
    error: Any = None,
    wake_at: datetime | None = None,
) -> int:
    """A fenced INSERT of the step's attempt, which no attempt may make once cancel is
    requested: then it raises TaskCanceledError and writes nothing (the run's holder ends it
    canceled), so a cancel reaches every step, sleep and wait that would begin after it."""
    write = HotWrite("start", lease, lease.deferred.pending(), clock.now(), name, kind, status)
    write.attempt, write.run_pass, write.wake_at = attempt, run_pass, wake_at
    write.output, write.step_error = output, error
    writer_for(lease).send(write)
    if isinstance(write.error, LeaseLostError):
        _refused_start(lease, name)
    return int(write.outcome())


def _refused_start(lease: Lease, name: str) -> NoReturn:
    if holds(lease):
        raise TaskCanceledError(f"run {lease.run_id} was canceled before step {name!r}")
    raise LeaseLostError(f"run {lease.run_id}: lease lost before step {name!r} started")


def defer_step_completion(lease: Lease, step_id: int, output: Any) -> None:
    """Record a step as completed with the run's next write (see DeferredCompletion)."""
    lease.deferred.put(step_id, output)


@attempt_write
def flush_deferred(lease: Lease, older_than: float | None = None) -> None:
    """Send the deferred step completions now (before any write that cannot carry them)."""
    pending = lease.deferred.pending(older_than)
    if pending:
        write = HotWrite("deferred", lease, pending, clock.now())
        writer_for(lease).send(write)
        write.outcome()


def _close_attempt(
    lease: Lease, step_id: int, status: str, output: Any, error: Any, finished_at: datetime
) -> None:
    sql = f"""
        UPDATE {STEP} SET status = %s, output = %s, error = %s, finished_at = %s
        WHERE id = %s AND status = 'running' AND {_fence()}
    """
    params = [status, p_json(output), p_json(error), p_dt(finished_at), step_id]
    if not execute(sql, params + _fence_params(lease)):
        raise LeaseLostError(f"run {lease.run_id}: lease lost before step {step_id} finished")


@attempt_write
def finish_step(
    lease: Lease, step_id: int, status: str, *, output: Any = None, error: Any = None
) -> None:
    flush_deferred(lease)
    _close_attempt(lease, step_id, status, output, error, clock.now())


def _close_running_attempts(lease: Lease, *, counted: bool, work_only: bool = False) -> None:
    kinds = f" AND kind IN {WORK_KINDS}" if work_only else ""
    execute(
        f"UPDATE {STEP} SET status = 'abandoned', counted = %s, finished_at = %s"
        f" WHERE run_id = %s AND status = 'running'{kinds}",
        [counted, p_dt(clock.now()), p_uuid(lease.run_id)],
    )
