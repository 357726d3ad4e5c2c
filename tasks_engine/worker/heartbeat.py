"""One heartbeat thread renews every lease the worker holds and relays aborts to runs.

It works on the worker's slot pool (worker/slots.py), not on the worker: what it needs beyond
the pool comes as narrow callbacks (`WorkerHooks`), so the import graph and mypy see every way
it reaches back.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .. import clock, transitions
from ..db import sqlite_bounds
from ..db.alias import connection
from ..db.outages import DB_ERRORS, Outage, drop_if_cut
from ..exceptions import DeadlineExceededError, LeaseLostError, StepTimeoutError, TaskCanceledError
from ..models import WorkflowRun
from ..values.serialization import encode_error
from .slots import Held, SlotPool

PROGRESS_FLUSH_SECONDS = 1.0
DEFERRED_MAX_AGE = 0.5  # seconds a finished step may wait to ride on its run's next write
ENDING_GRACE = 0.1  # seconds a slot whose run's last write committed takes to let it go, at most
ENDING_POLL = 0.002


class _Kick(threading.Event):
    """An event that also wakes the heartbeat's loop."""

    def __init__(self, wake: threading.Event) -> None:
        super().__init__()
        self._wake = wake

    def set(self) -> None:
        super().set()
        self._wake.set()


@dataclass(frozen=True)
class WorkerHooks:
    """What the heartbeat needs of its worker beyond the slot pool."""

    hand_back_stale: Callable[[float], None]  # prefetched runs that waited too long for a slot
    write_off: Callable[[Held], None]  # a slot whose run ignores its abort: replace its thread
    beat: Callable[[float], None]  # the worker's row (services/fleet.py), when a beat is due
    pulse: Callable[[float], None] = lambda now: None  # to a supervisor (pulse.py), every round


class Heartbeat(threading.Thread):
    def __init__(
        self,
        slots: SlotPool,
        hooks: WorkerHooks,
        *,
        lease_seconds: float,
        heartbeat_seconds: float,
        log: Any,
    ) -> None:
        super().__init__(name="tasks-heartbeat", daemon=True)
        self.slots = slots
        self.hooks = hooks
        self.lease_seconds = lease_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self.log = log
        self.stop = threading.Event()
        self.wake = threading.Event()  # run the loop now (a kick, or a step timer armed)
        self.kick = _Kick(self.wake)  # renew now (a cancel NOTIFY arrived)

    def run(self) -> None:
        outage = Outage(self.log, "heartbeat")
        next_renew = time.monotonic() + self.heartbeat_seconds
        try:
            while not self.stop.is_set():
                self.wake.wait(
                    min(PROGRESS_FLUSH_SECONDS, self.heartbeat_seconds, self.next_timer())
                )
                self.wake.clear()
                self.hooks.pulse(time.monotonic())  # first: it needs no database
                kicked = self.kick.is_set()
                self.kick.clear()
                self.abort_unrenewed()
                self.fire_step_timeouts(time.monotonic())
                try:
                    drop_if_cut()
                    self.hooks.hand_back_stale(time.monotonic())
                    self.flush_progress()
                    self.write_off_stuck()
                    if kicked or time.monotonic() >= next_renew:
                        renewed = self.renew_once()
                        # A lease whose row was locked is tried again on the next pass: its
                        # expiry may pass while the lock lasts.
                        again = any(r.locked for r in renewed.values())
                        next_renew = time.monotonic() + (0.0 if again else self.heartbeat_seconds)
                    self.hooks.beat(time.monotonic())
                    sqlite_bounds.optimize_periodically(connection)  # SQLite: ANALYZE hourly
                    if connection.connection is not None:  # a statement really went through
                        outage.ok()
                except DB_ERRORS as exc:
                    # Back off, but not past a heartbeat: leases must be renewed or given up.
                    self.stop.wait(min(outage.failed(exc), self.heartbeat_seconds))
        except BaseException as exc:  # the worker's watch (loop.py) stops the worker
            self.log.exception("heartbeat crashed", error=str(exc))
        finally:
            connection.close()

    # -- aborting runs ------------------------------------------------------------------------

    def lose(self, held: Held, reason: BaseException) -> None:
        held.lost = True
        self.abort(held, reason)
        held.ctx.logger.warning("lease lost; aborting the run", error=str(reason))

    def abort(self, held: Held, reason: BaseException) -> None:
        """Set the run's abort signal; if its step ignores it past the grace (a lease), the
        run is written off (`write_off_stuck`)."""
        if held.ctx.abort_signal.abort(reason) or held.abort_deadline is None:
            held.abort_deadline = time.monotonic() + self.lease_seconds

    def abort_unrenewed(self) -> None:
        """A lease this worker could not renew for a whole lease period (the database is
        unreachable) may be another worker's by now: stop the step instead of running on."""
        now = time.monotonic()
        for h in self.slots.held():
            if now - h.renewed_at > self.lease_seconds:
                self.lose(
                    h,
                    LeaseLostError(
                        f"run {h.lease.run_id}: lease not renewed for "
                        f"{now - h.renewed_at:.0f}s (lease {self.lease_seconds:g}s)"
                    ),
                )

    def next_timer(self) -> float:
        """Seconds until the earliest step timeout of the runs held (the loop's wait)."""
        deadlines = [t.deadline for h in self.slots.held() if (t := h.handle.timer)]
        return max(0.01, min(deadlines) - time.monotonic()) if deadlines else PROGRESS_FLUSH_SECONDS

    def fire_step_timeouts(self, now: float) -> None:
        """Abort every step that ran past its timeout (in memory: works during an outage)."""
        for h in self.slots.held():
            timer = h.handle.timer
            if timer is not None:
                timer.fire(now, functools.partial(self.abort, h))

    def renew_once(self) -> dict[transitions.LeaseKey, transitions.Renewal]:
        """Renew every lease held; each attempt is told what its own lease's renewal found
        (matched by (run, lease token): a stale attempt of a run is never told the fresh
        one's)."""
        held = self.slots.held()
        if not held:
            return {}
        sent = time.monotonic()
        renewed = transitions.renew_leases([h.lease for h in held], self.lease_seconds)
        for h in self.still_executing([h for h in held if h.lease.key not in renewed]):
            self.lose(h, LeaseLostError(f"run {h.lease.run_id}: lease lost"))
        for h in held:
            r = renewed.get(h.lease.key)
            if r is None:
                continue
            h.renewed_at = sent
            if r.cancel_requested:
                reason = (
                    WorkflowRun.objects.filter(pk=h.lease.run_id)
                    .values_list("cancel_reason", flat=True)
                    .first()
                )
                h.handle.request_cancel()
                self.abort(h, TaskCanceledError(reason or "canceled"))
            elif r.deadline_passed:
                self.abort(h, DeadlineExceededError("deadline passed"))
        return renewed

    def still_executing(self, unrenewed: list[Held]) -> list[Held]:
        """Of the runs whose renewal found no token, those that lost their lease. A run may
        have ended since the heartbeat read the runs held: its last write (a completion, a
        park, a retry) cleared the token. Its slot lets it go as that write is queued (group
        commit) or just after it committed (a write alone): give the slots ENDING_GRACE to
        do so, together, before calling any of them lost."""
        end = time.monotonic() + ENDING_GRACE
        while True:
            executing = [h for h in unrenewed if self.slots.executing(h)]
            if not executing or time.monotonic() >= end:
                return executing
            time.sleep(ENDING_POLL)

    # -- writing ------------------------------------------------------------------------------

    def write_off_stuck(self) -> None:
        """End runs whose step ignored its abort past the grace, so the run does not stay
        `running` forever and the worker keeps its capacity."""
        now = time.monotonic()
        for h in self.slots.stuck(now):
            reason = h.ctx.abort_signal.reason
            has_parent = h.handle.has_parent
            try:
                if isinstance(reason, TaskCanceledError):
                    transitions.cancel_running_run(h.lease, has_parent=has_parent)
                elif isinstance(reason, DeadlineExceededError):
                    transitions.fail_run(h.lease, encode_error(reason), has_parent=has_parent)
                elif isinstance(reason, StepTimeoutError):
                    self.write_off_timed_out(h, reason)
            except LeaseLostError:
                pass
            self.hooks.write_off(h)

    def write_off_timed_out(self, h: Held, reason: StepTimeoutError) -> None:
        """The step ignored its timeout: record its attempt failed and requeue the run, which
        fences the stuck thread (the lease token changes). The next pass retries the step, or
        raises the StepTimeoutError into the workflow when the step's retries are spent."""
        timer = h.handle.timer
        if timer is None or timer.fired is not reason or not timer.take_write_off():
            return  # the step ended meanwhile and recorded its own outcome
        off = timer.write_off
        at = clock.now() + timedelta(seconds=off.retry_in or 0.0)
        transitions.requeue_run(h.lease, at, failed_step=(off.step_id, off.error))
        h.ctx.logger.warning("step ignored its timeout; attempt written off", step=timer.key)

    def flush_progress(self) -> None:
        for h in self.slots.held():
            # A refusal means the lease is gone: the renewal below finds that and aborts the run.
            with contextlib.suppress(LeaseLostError):
                transitions.flush_deferred(h.lease, older_than=DEFERRED_MAX_AGE)
            progress = h.handle.take_dirty_progress()
            if progress is not None:
                transitions.set_progress(h.lease, progress)
