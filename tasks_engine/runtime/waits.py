"""Steps that wait without holding a worker: durable sleep, facts and child runs.

Each wait is a step attempt that is `running` while armed and `completed` (or `failed`) once
resolved; the run parks as `waiting` in between and a fact, a child's end or a timer wakes it.
Each is observed (metrics, span) from its armed attempt to its outcome, by the claim that
resolves it; a claim that parks it observes nothing (step_observer.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .. import clock, transitions
from ..db.alias import atomic
from ..engine import enqueue
from ..exceptions import FactTimeoutError, StepTimeoutError, Suspend, TaskCanceledError
from ..models import WorkflowRun
from ..states import FINISHED, RunStatus, StepKind, StepStatus
from ..transitions import Parking
from ..values.durations import MAX_SECONDS, duration_seconds
from ..values.serialization import encode_error, rebuild_error, to_jsonable
from .history import Attempt, StepRecord
from .step_base import StepBase
from .step_observer import observed_step
from .step_timeouts import timeout_seconds

if TYPE_CHECKING:
    from ..definitions import Workflow


class WaitSteps(StepBase):
    def _arm(
        self, key: str, kind: str, rec: StepRecord | None, *, guarded: bool = False, **fields: Any
    ) -> Attempt:
        armed = rec.armed if rec is not None else None
        if armed is not None:
            return armed
        if not guarded:
            self._guard()
        attempt_no = rec.next_attempt if rec else 1
        step_id = self._start(key, kind, attempt_no, **fields)
        armed = Attempt(
            step_id,
            StepStatus.RUNNING,
            self._s.run_pass,
            True,
            fields.get("output"),
            None,
            fields.get("wake_at"),
        )
        self._remember(key, kind, armed)
        return armed

    def _resolve(self, armed: Attempt, *, output: Any = None, error: BaseException | None = None):
        lease = self._s.lease
        if error is None:
            transitions.finish_step(lease, armed.id, StepStatus.COMPLETED, output=output)
            armed.status, armed.output = StepStatus.COMPLETED, output
        else:
            err = _terminal(error)
            transitions.finish_step(lease, armed.id, StepStatus.FAILED, error=err)
            armed.status, armed.error = StepStatus.FAILED, err

    # -- sleep --------------------------------------------------------------------------------

    def sleep(self, name: str, duration: timedelta | float) -> None:
        """Durable timer: the run parks as `waiting` and holds no worker until it is due.
        `duration`: seconds or a timedelta, 0 (done at once) up to MAX_DURATION; anything else
        raises TypeError or ValueError here, before anything is recorded."""
        seconds = duration_seconds(duration, "sleep duration", zero_ok=True)
        begun = self._begin(name, StepKind.SLEEP)
        if begun.replayed:
            return
        key, rec = begun.key, begun.record
        wake_at = clock.now() + timedelta(seconds=seconds)
        armed = self._arm(key, StepKind.SLEEP, rec, wake_at=wake_at)  # keeps an armed wake time
        assert armed.wake_at is not None
        with observed_step(self._ctx, key, StepKind.SLEEP):
            if clock.now() >= armed.wake_at:
                self._resolve(armed)
                return
            self._ctx.raise_if_canceled()
            progress = self._s.progress_to_carry()
            if not transitions.park_run(
                self._s.lease, f"sleep:{key}", armed.wake_at, self._s.deadline_at, progress
            ):
                self._s.progress_not_carried(progress)
                self._canceled()
            raise Suspend(f"sleeping until {armed.wake_at.isoformat()}")

    # -- facts --------------------------------------------------------------------------------

    def wait_for_fact(
        self,
        name: str,
        *,
        timeout: timedelta | float | None = None,
        check: Callable[[], Any] | None = None,
        check_interval: timedelta | float = 30,
    ) -> Any:
        """Return the payload of the oldest fact `name` that no earlier wait of this run took.
        `timeout` (0: only a fact already there) and `check_interval` (more than 0) are
        seconds or timedeltas up to MAX_DURATION; anything else raises TypeError or ValueError
        here, before anything is recorded."""
        seconds = None if timeout is None else duration_seconds(timeout, "timeout", zero_ok=True)
        interval = duration_seconds(check_interval, "check_interval")
        begun = self._begin(name, StepKind.FACT_WAIT)
        if begun.replayed:
            return begun.value
        key, rec = begun.key, begun.record
        deadline = clock.now() + timedelta(seconds=seconds) if seconds is not None else None
        # The armed length is kept: a later pass may be called with only the time left.
        armed = self._arm(
            key,
            StepKind.FACT_WAIT,
            rec,
            wake_at=deadline,
            output={"fact": name, "timeout": seconds},
        )
        lease = self._s.lease
        with observed_step(self._ctx, key, StepKind.FACT_WAIT):
            while True:
                taken, payload = transitions.take_fact(lease, armed.id, key, name)
                if taken:
                    armed.status, armed.output = StepStatus.COMPLETED, payload
                    return payload
                if check is not None and (result := check()) is not None:
                    result = to_jsonable(result)
                    self._resolve(armed, output=result)
                    return result
                if armed.wake_at is not None and clock.now() >= armed.wake_at:
                    length = _armed_timeout(armed, seconds)
                    err = FactTimeoutError(f"no fact {name!r} arrived within {length} seconds")
                    self._resolve(armed, error=err)
                    raise err
                self._ctx.raise_if_canceled()
                wake = armed.wake_at
                if check is not None:
                    next_check = clock.now() + timedelta(seconds=interval)
                    wake = next_check if wake is None else min(wake, next_check)
                self._park_unless(
                    f"fact:{name}", wake, lambda: transitions.fact_available(lease.run_id, name)
                )

    # -- child runs ---------------------------------------------------------------------------

    def run_child(
        self,
        workflow_or_name: Workflow | str,
        input: Any = None,
        *,
        name: str,
        queue: str | None = None,
        timeout: timedelta | float | None = None,
    ) -> Any:
        """Start a child run and wait for its output; its failure is raised here. With
        `timeout`, a child that has not finished by then is canceled and StepTimeoutError is
        raised here (checkpointed: replay raises it again)."""
        seconds = timeout_seconds(timeout, limit=MAX_SECONDS)  # a wake time: bounded
        begun = self._begin(name, StepKind.CHILD)
        if begun.replayed:
            return begun.value
        key, rec = begun.key, begun.record
        lease = self._s.lease
        armed = rec.armed if rec is not None else None
        if armed is None:
            self._guard()  # outside the transaction: a hand-back must not roll back with it
            give_up_at = clock.now() + timedelta(seconds=seconds) if seconds else None
            with transitions.outage_guard("run_child"), atomic():
                if transitions.lock_for_child(lease):
                    self._canceled()
                armed = self._arm(key, StepKind.CHILD, rec, guarded=True, wake_at=give_up_at)
                child_id = _start_child(
                    workflow_or_name,
                    input,
                    idempotency_key=_child_key(lease.run_id, key, armed.run_pass),
                    queue=queue,
                    trace_id=self._ctx.trace_id,
                    parent_run_id=lease.run_id,
                    parent_step=key,
                )
        else:
            child_id = _child_of(lease.run_id, _child_key(lease.run_id, key, armed.run_pass))
        with observed_step(self._ctx, key, StepKind.CHILD):
            while True:
                status, output, error = transitions.child_outcome(child_id)
                if status == RunStatus.COMPLETED:
                    self._resolve(armed, output=output)
                    return output
                if status in FINISHED:
                    exc: BaseException = (
                        rebuild_error(error)
                        if error
                        else TaskCanceledError(f"child run {child_id} was {status}")
                    )
                    self._resolve(armed, error=exc)
                    raise exc
                if armed.wake_at is not None and clock.now() >= armed.wake_at:
                    err = StepTimeoutError(
                        f"child run {child_id} (step {key!r}) did not finish in time; canceled"
                    )
                    stored = _terminal(err)
                    if transitions.time_out_child(lease, armed.id, child_id, stored):
                        armed.status, armed.error = StepStatus.FAILED, stored
                        raise err
                    continue  # it finished meanwhile: take its outcome
                self._ctx.raise_if_canceled()
                self._park_unless(
                    f"child:{child_id}",
                    armed.wake_at,
                    lambda: transitions.child_outcome(child_id)[0] in FINISHED,
                )

    def _park_unless(
        self, waiting_on: str, wake: datetime | None, arrived: Callable[[], bool]
    ) -> None:
        """Park the run on `waiting_on` (Suspend) unless what it waits for `arrived()`
        meanwhile (return: the caller looks again) or a cancel came (end the run)."""
        progress = self._s.progress_to_carry()
        parking = transitions.park_run_unless(
            self._s.lease, waiting_on, wake, self._s.deadline_at, arrived, progress
        )
        if parking is Parking.PARKED:
            raise Suspend(f"waiting on {waiting_on}")
        self._s.progress_not_carried(progress)
        if parking is Parking.CANCELED:
            self._canceled()


def _terminal(error: BaseException) -> dict[str, Any]:
    """A wait's failure as stored: terminal, so replay raises it again."""
    return {**encode_error(error), "terminal": True}


def _child_key(run_id: Any, key: str, run_pass: int) -> str:
    """The child's idempotency key: one child per step and workflow pass (a workflow retry
    starts the child again instead of getting the failed one back)."""
    suffix = f":pass{run_pass}" if run_pass > 1 else ""
    full = f"child:{run_id}:{key}{suffix}"
    if len(full) <= 255:  # the idempotency key column's length
        return full
    # A long step key (they may hold 300 characters): its digest instead, still one per step.
    digest = hashlib.sha256(key.encode()).hexdigest()
    return f"child:{run_id}:sha256:{digest}{suffix}"


@transitions.attempt_write
def _start_child(workflow_or_name: Workflow | str, input: Any, **options: Any) -> Any:
    return enqueue(workflow_or_name, input, **options).run_id


@transitions.attempt_write
def _child_of(parent_id: Any, idempotency_key: str) -> Any:
    return (
        WorkflowRun.objects.filter(parent_run_id=parent_id, idempotency_key=idempotency_key)
        .values_list("pk", flat=True)
        .get()
    )


def _armed_timeout(armed: Attempt, seconds: float | None) -> str:
    """The timeout the wait was armed with (a replay's own may be only what is left of it),
    as text: at most millisecond precision, no trailing zeros."""
    stored = armed.output.get("timeout") if isinstance(armed.output, dict) else None
    length = stored if isinstance(stored, int | float) else seconds or 0.0
    return f"{length:.3f}".rstrip("0").rstrip(".")
