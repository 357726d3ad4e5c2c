"""What the worker holds of one claimed attempt of a run, and all it may touch of it.

The executor builds one handle per claim; the run's own thread (its steps) and the worker's
heartbeat thread share it. Everything both threads read or write is behind the handle's lock:
the cancel flag, the progress not yet written, and the running step's timer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..transitions import Lease
from .step_timeouts import StepTimer


class AttemptHandle:
    def __init__(self, lease: Lease, *, has_parent: bool, cancel_requested: bool) -> None:
        self.lease = lease
        self.has_parent = has_parent  # its end wakes the parent run (passed to transitions)
        self._lock = threading.Lock()
        self._cancel_requested = cancel_requested
        self._progress: dict[str, Any] | None = None
        self._progress_dirty = False
        self._timer: StepTimer | None = None
        self._timer_armed: Callable[[], None] | None = None

    # -- cancel -------------------------------------------------------------------------------

    @property
    def cancel_requested(self) -> bool:
        with self._lock:
            return self._cancel_requested

    def request_cancel(self) -> None:
        """The run's cancel was found (by a renewal, or under the run's row lock): no new step
        starts, and the run ends canceled."""
        with self._lock:
            self._cancel_requested = True

    # -- progress -----------------------------------------------------------------------------

    def report_progress(self, progress: dict[str, Any]) -> None:
        with self._lock:
            self._progress = progress
            self._progress_dirty = True

    def take_dirty_progress(self) -> dict[str, Any] | None:
        """The progress reported since the last take (a copy), or None if there is none new."""
        with self._lock:
            if not self._progress_dirty:
                return None
            self._progress_dirty = False
            return dict(self._progress or {})

    # -- the running step's timeout -----------------------------------------------------------

    @property
    def timer(self) -> StepTimer | None:
        """The timer of the step running now, if it has a timeout (fired by the heartbeat)."""
        with self._lock:
            return self._timer

    def on_timer_armed(self, callback: Callable[[], None]) -> None:
        """Call `callback` whenever a step arms a timer (the heartbeat recomputes its sleep)."""
        with self._lock:
            self._timer_armed = callback

    def arm_timer(self, timer: StepTimer) -> None:
        with self._lock:
            self._timer = timer
            armed = self._timer_armed
        if armed is not None:
            armed()

    def disarm_timer(self) -> None:
        with self._lock:
            self._timer = None
