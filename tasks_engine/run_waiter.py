"""tasks_engine.wait(): block until a run has finished.

PostgreSQL: LISTEN on a dedicated connection for the run's end (see transitions/awaiting.py),
re-reading the status at least once a second in case a notification is lost with a dropped
connection. SQLite, NOTIFY turned off, or a transaction pooler without LISTEN_URL: polling
every 50 ms.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from .db import notify
from .exceptions import UnknownRunError
from .models import WorkflowRun
from .states import FINISHED
from .transitions.awaiting import RUN_END_CHANNEL, mark_awaited

POLL_SECONDS = 0.05
RECHECK_SECONDS = 1.0


def wait_finished(run_id: uuid.UUID, timeout: float | timedelta | None) -> None:
    """Return once the run has finished; TimeoutError after `timeout` (seconds, or a
    timedelta as a step's `timeout=` takes)."""
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise ValueError(f"timeout must be a number of seconds, not {timeout!r}")
        if math.isnan(timeout) or timeout < 0:
            raise ValueError(f"timeout must be a number of seconds >= 0, not {timeout!r}")
    deadline = None if timeout is None else time.monotonic() + float(timeout)
    if _finished(run_id):
        return
    if notify.enabled() and notify.listening_possible():
        _listen_until_finished(run_id, deadline)
    else:
        _poll_until_finished(run_id, deadline, time.sleep)


def _finished(run_id: uuid.UUID) -> bool:
    status = WorkflowRun.objects.filter(pk=run_id).values_list("status", flat=True).first()
    if status is None:
        raise UnknownRunError(f"no run with id {run_id}")
    return status in FINISHED


def _remaining(run_id: uuid.UUID, deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(f"run {run_id} did not finish in time")
    return left


def _poll_until_finished(
    run_id: uuid.UUID, deadline: float | None, pause: Callable[[float], Any]
) -> None:
    while not _finished(run_id):
        left = _remaining(run_id, deadline)
        pause(POLL_SECONDS if left is None else min(POLL_SECONDS, left))


def _listen_until_finished(run_id: uuid.UUID, deadline: float | None) -> None:
    import psycopg

    try:
        conn = psycopg.connect(**notify.listen_params(), autocommit=True)
    except psycopg.Error:
        return _poll_until_finished(run_id, deadline, time.sleep)
    with conn:
        conn.execute(f"LISTEN {RUN_END_CHANNEL}")
        mark_awaited(conn, run_id)
        wanted = str(run_id)

        def pause(seconds: float) -> None:
            for note in conn.notifies(timeout=seconds, stop_after=1):
                if note.payload == wanted:
                    return

        while not _finished(run_id):
            left = _remaining(run_id, deadline)
            pause(RECHECK_SECONDS if left is None else min(RECHECK_SECONDS, left))
    return None
