"""The engine API for async callers (async views, ASGI apps): Django's `a` prefix.

Each call is its plain twin run through `sync_to_async(thread_sensitive=True)`, as Django's
own async ORM methods are: on the thread (and connection) the rest of the request's sync work
uses, so the same checks, errors and transactions apply. `await_run` does not hold that thread
while it waits: it looks at the run between `asyncio.sleep`s (every 50 ms at first, backing
off to 0.5 s), so a view awaiting a long run blocks nothing else.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from asgiref.sync import sync_to_async

from .. import engine
from ..definitions import Workflow
from ..exceptions import UnknownRunError
from ..states import FINISHED

FIRST_LOOK_SECONDS = 0.05
LONGEST_LOOK_SECONDS = 0.5


async def aenqueue(task: str | Workflow, input: Any = None, **options: Any) -> engine.Enqueued:
    """`enqueue` from async code; the same keyword arguments."""
    return await sync_to_async(engine.enqueue, thread_sensitive=True)(task, input, **options)


async def aenqueue_many(
    task: str | Workflow,
    inputs: Iterable[Any],
    *,
    queue: str | None = None,
    priority: int | None = None,
    idempotency_keys: Sequence[str | None] | None = None,
    available_at: datetime | None = None,
    tags: dict[str, str] | None = None,
) -> list[engine.Enqueued]:
    return await sync_to_async(engine.enqueue_many, thread_sensitive=True)(
        task,
        inputs,
        queue=queue,
        priority=priority,
        idempotency_keys=idempotency_keys,
        available_at=available_at,
        tags=tags,
    )


async def asignal(
    run_id: uuid.UUID | str, name: str, payload: Any = None, *, idempotency_key: str | None = None
) -> engine.Signaled:
    return await sync_to_async(engine.signal, thread_sensitive=True)(
        run_id, name, payload, idempotency_key=idempotency_key
    )


async def acancel(run_id: uuid.UUID | str, reason: str | None = None) -> bool:
    return await sync_to_async(engine.cancel, thread_sensitive=True)(run_id, reason)


async def aget_run(run_id: uuid.UUID | str) -> engine.RunView | None:
    return await sync_to_async(engine.get_run, thread_sensitive=True)(run_id)


async def alist_runs(**filters: Any) -> list[engine.RunView]:
    """`list_runs` from async code; the same keyword arguments."""
    return await sync_to_async(engine.list_runs, thread_sensitive=True)(**filters)


async def aretry_run(
    run_id: uuid.UUID | str, *, from_step: str | None = None, reason: str | None = None
) -> bool:
    return await sync_to_async(engine.retry_run, thread_sensitive=True)(
        run_id, from_step=from_step, reason=reason
    )


async def await_run(
    run_id: uuid.UUID | str, timeout: float | timedelta | None = None
) -> engine.RunView:
    """`wait` from async code: the run's view once it has finished (completed, failed or
    canceled). `TimeoutError` after `timeout` (seconds or a timedelta), `UnknownRunError` for
    an id that names no run, `ValueError` for a timeout that is not a number of seconds >= 0."""
    deadline = _deadline(timeout)
    pause = FIRST_LOOK_SECONDS
    while True:
        view = await aget_run(run_id)
        if view is None:
            raise UnknownRunError(f"no run with id {run_id}")
        if view.status in FINISHED:
            return view
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"run {view.run_id} did not finish in time")
            pause = min(pause, left)
        await asyncio.sleep(pause)
        pause = min(pause * 2, LONGEST_LOOK_SECONDS)


def _deadline(timeout: float | timedelta | None) -> float | None:
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise ValueError(f"timeout must be a number of seconds, not {timeout!r}")
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout must be a number of seconds >= 0, not {timeout!r}")
    return time.monotonic() + float(timeout)
