"""Where an async run's synchronous work goes, off its event loop.

An async workflow's own code (its body, its `async def` step functions) runs on an event loop.
Two kinds of work must not: the engine's (every replay check, fenced write and read goes
through Django's connections, which are per thread and synchronous) and a plain step function
(which may block for as long as it likes). A `Bridge` sends both to threads and gives the loop
an awaitable of their result:

- `PoolBridge`, a worker's: a bounded pool of engine threads, each with its own connection (a
  hot write there joins the group writer's statement as a slot thread's does), and a bounded
  pool for plain step functions. A thousand runs awaiting I/O hold no thread.
- `in_caller`, for in-process execution (`drain`, `WorkflowTester`, tests): the loop runs on a
  helper thread while the calling thread does every synchronous part (asgiref's
  `async_to_sync`), so the engine's writes, plain step functions and Django's async ORM all
  use the caller's connection and see its transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from asgiref.sync import async_to_sync, sync_to_async

from ..db.alias import connection
from ..db.outages import DB_ERRORS, drop_if_cut


class Bridge(Protocol):
    loop: asyncio.AbstractEventLoop

    def engine(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        """Run engine work (statements) off the loop; its result or exception."""

    def blocking(self, fn: Callable[[], Any], /) -> Awaitable[Any]:
        """Run a plain step function off the loop; its result or exception."""


class PoolBridge:
    """A worker's bridge: `engine_threads` threads for the engine, up to `step_threads` (made
    as needed) for plain step functions."""

    def __init__(self, loop: asyncio.AbstractEventLoop, engine_threads: int, step_threads: int):
        self.loop = loop
        self.engine_threads = engine_threads
        self._engine = ThreadPoolExecutor(engine_threads, thread_name_prefix="tasks-engine")
        self._steps = ThreadPoolExecutor(step_threads, thread_name_prefix="tasks-step")

    def engine(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        return asyncio.wrap_future(
            self._engine.submit(_engine_call, fn, args, kwargs), loop=self.loop
        )

    def blocking(self, fn: Callable[[], Any], /) -> Awaitable[Any]:
        # In the caller's context: the step's span is current there too (observe/tracing.py).
        context = contextvars.copy_context()
        return asyncio.wrap_future(self._steps.submit(context.run, fn), loop=self.loop)

    def shutdown(self) -> None:
        """Each engine thread closes its connection; the step threads are left to end when
        their functions return (a stuck one must not hold the process: they are daemons)."""
        for _ in range(self.engine_threads):
            self._engine.submit(connection.close)
        self._engine.shutdown(wait=True, cancel_futures=False)
        self._steps.shutdown(wait=False, cancel_futures=True)


def _engine_call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """On an engine thread: what a slot thread does around its statements (drop a session the
    server ended while the thread sat idle; close the connection an outage broke, so that the
    next call on this thread connects afresh)."""
    drop_if_cut()
    try:
        return fn(*args, **kwargs)
    except DB_ERRORS:
        with contextlib.suppress(Exception):
            if connection.connection is not None and not connection.is_usable():
                connection.close()
        raise


class _CallerBridge:
    """`in_caller`'s: every synchronous part on the thread that called `in_caller`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def engine(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        return sync_to_async(fn, thread_sensitive=True)(*args, **kwargs)

    def blocking(self, fn: Callable[[], Any], /) -> Awaitable[Any]:
        return sync_to_async(fn, thread_sensitive=True)()


def in_caller[R](main: Callable[[Bridge], Coroutine[Any, Any, R]]) -> R:
    """Run `main(bridge)` to its end on an event loop, this thread doing its synchronous
    parts. Not from a thread that runs an event loop itself."""

    async def run() -> R:
        return await main(_CallerBridge(asyncio.get_running_loop()))

    return async_to_sync(run, force_new_loop=True)()


async def awaited(value: Any) -> Any:
    """`value`, awaited as long as it is awaitable (a step function may return a coroutine
    that returns another)."""
    while inspect.isawaitable(value):
        value = await value
    return value


def resolve_from_thread(value: Any) -> Any:
    """On a thread off the run's loop: `value`, or, if it is awaitable, its result (an `async
    def check` of a fact wait, called on an engine thread). Through asgiref's `async_to_sync`,
    so that a thread-sensitive call inside it (Django's async ORM) runs on this very thread
    when this thread is itself the one `in_caller` gave the run (a test's: its connection),
    instead of waiting for it."""
    if not inspect.isawaitable(value):
        return value

    async def result() -> Any:
        return await awaited(value)

    return async_to_sync(result)()
