"""The attempt handle: what the worker's threads may read and change of a running attempt."""

from __future__ import annotations

import threading
import uuid

import pytest

from tasks_engine.runtime.attempt_handle import AttemptHandle
from tasks_engine.runtime.step_timeouts import StepTimer, WriteOff
from tasks_engine.transitions import Lease

pytestmark = pytest.mark.one_db("pure Python: the attempt handle's threads")


def _handle(**kwargs: bool) -> AttemptHandle:
    lease = Lease(uuid.uuid4(), uuid.uuid4(), "worker")
    return AttemptHandle(
        lease,
        has_parent=kwargs.get("has_parent", False),
        cancel_requested=kwargs.get("cancel_requested", False),
    )


def test_progress_is_taken_once_and_as_a_copy() -> None:
    handle = _handle()
    assert handle.take_dirty_progress() is None
    reported = {"done": 1, "total": 2, "message": None}
    handle.report_progress(reported)
    taken = handle.take_dirty_progress()
    assert taken == reported and taken is not reported
    assert handle.take_dirty_progress() is None  # nothing new since


def test_cancel_is_remembered() -> None:
    assert _handle(cancel_requested=True).cancel_requested
    handle = _handle()
    assert not handle.cancel_requested
    handle.request_cancel()
    assert handle.cancel_requested


def test_arming_a_timer_tells_the_watcher_and_disarming_clears_it() -> None:
    handle = _handle()
    armed = threading.Event()
    handle.on_timer_armed(armed.set)
    timer = StepTimer("step", 5.0, WriteOff(1, {}, None))
    handle.arm_timer(timer)
    assert armed.is_set() and handle.timer is timer
    handle.disarm_timer()
    assert handle.timer is None
