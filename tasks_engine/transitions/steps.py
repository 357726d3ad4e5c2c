"""Step attempts: start, finish, and the deferred completion that rides on the next write."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NoReturn

from .. import clock
from ..exceptions import LeaseLostError, TaskCanceledError
from ..sql import (
    execute,
    fetchall,
    is_postgres,
    p_dt,
    p_json,
    p_uuid,
)
from ._common import STEP, WORK_KINDS, Lease, _fence, _fence_params, attempt_write, holds
from .group import GroupWrite

# -- steps ------------------------------------------------------------------------------------


@attempt_write
def close_interrupted_attempts(lease: Lease) -> int:
    """On reclaim: attempts a crashed holder left `running` become `abandoned` (and count)."""
    sql = f"""
        UPDATE {STEP} SET status = 'abandoned', counted = TRUE, finished_at = %s
        WHERE run_id = %s AND status = 'running' AND kind IN {WORK_KINDS}
          AND (lease_token IS NULL OR lease_token <> %s) AND {_fence()}
    """
    now = p_dt(clock.now())
    return execute(sql, [now, p_uuid(lease.run_id), p_uuid(lease.token), *_fence_params(lease)])


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
    now = clock.now()
    if lease.group is not None and kind == "function" and status == "running" and output is None:
        write = GroupWrite("start", lease, lease.deferred.take(), now, name, attempt, run_pass)
        try:
            return int(lease.group.submit(write))
        except LeaseLostError:
            _refused_start(lease, name)
    finished = p_dt(now) if status != "running" else None
    prefix, prefix_params = _with_deferred(lease)
    sql = f"""
        {prefix}
        INSERT INTO {STEP} (run_id, name, kind, status, attempt, run_pass, counted, output,
            error, worker_id, lease_token, wake_at, started_at, finished_at)
        SELECT %s, %s, %s, %s, %s, %s, TRUE, %s, %s, %s, %s, %s, %s, %s
        WHERE {_fence(unless_canceled=True)}
        RETURNING id
    """
    params = [*prefix_params, p_uuid(lease.run_id), name, kind, status, attempt, run_pass]
    params += [p_json(output), p_json(error), lease.worker_id, p_uuid(lease.token), p_dt(wake_at)]
    params.append(p_dt(now))
    params.append(finished)
    rows = fetchall(sql, params + _fence_params(lease))
    if not rows:
        _refused_start(lease, name)
    return int(rows[0][0])


def _refused_start(lease: Lease, name: str) -> NoReturn:
    if holds(lease):
        raise TaskCanceledError(f"run {lease.run_id} was canceled before step {name!r}")
    raise LeaseLostError(f"run {lease.run_id}: lease lost before step {name!r} started")


@attempt_write
def defer_step_completion(lease: Lease, step_id: int, output: Any) -> None:
    """Record a step as completed with the run's next write (see DeferredCompletion)."""
    previous = lease.deferred.put(step_id, output)
    if previous is not None:
        _send_completion(lease, previous)


@attempt_write
def flush_deferred(lease: Lease, older_than: float | None = None) -> None:
    """Send a deferred step completion now (before any write that cannot carry it)."""
    item = lease.deferred.take(older_than)
    if item is not None:
        try:
            _send_completion(lease, item)
        except BaseException:
            lease.deferred.restore(item)  # the run goes on: its next write must still carry it
            raise


def _send_completion(lease: Lease, item: tuple[int, Any, datetime]) -> None:
    step_id, output, finished_at = item
    _close_attempt(lease, step_id, "completed", output, None, finished_at)


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


def _with_deferred(lease: Lease) -> tuple[str, list[Any]]:
    """A CTE that completes the deferred step inside the caller's statement (PostgreSQL), or
    nothing after sending it on its own (SQLite has no data-modifying CTEs)."""
    item = lease.deferred.take()
    if item is None:
        return "", []
    if not is_postgres():
        _send_completion(lease, item)
        return "", []
    step_id, output, finished_at = item
    sql = (
        f"WITH deferred AS (UPDATE {STEP} SET status = 'completed', output = %s,"
        f" finished_at = %s WHERE id = %s AND status = 'running' AND {_fence()} RETURNING id)"
    )
    return sql, [p_json(output), p_dt(finished_at), step_id, *_fence_params(lease)]


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
