"""The worker's event loop: every async run it claims runs here, as a task, not on a thread.

One loop per worker process, on one thread. The claim (the claim loop's, or a group's) queues
async runs in the slot pool apart from plain ones (`SlotPool.next_async`); this thread starts
them as tasks while fewer than `--concurrency` of them are in flight. What a run does off the
loop goes through the worker's `PoolBridge` (runtime/bridge.py): the engine's statements on a
small pool of engine threads (their hot writes join the group writer's statements as a slot
thread's do), plain step functions on a pool of their own. A run's task does what a slot thread
does for a plain run (worker/loop.py's `_slot` and `_execute`): hold the run for the heartbeat,
execute it, treat a database error as an outage (back off, hand the run back), release it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from .. import clock, transitions
from ..db.outages import DB_ERRORS, Outage
from ..definitions import registry
from ..exceptions import LeaseLostError
from ..runtime import executor
from ..runtime.async_steps import AsyncTaskContext
from ..runtime.bridge import PoolBridge
from .slots import Held, SlotPool

ENGINE_THREADS = 16  # engine threads (and connections) of a worker's async runs, at most
STEP_THREADS = 32  # threads for plain step functions of async runs, at most (made as needed)


class AsyncRuns(threading.Thread):
    def __init__(
        self,
        slots: SlotPool,
        *,
        concurrency: int,
        draining: threading.Event,
        writer: Callable[[], transitions.Writer | None],
        timer_armed: Callable[[], None],
        log: Any,
    ) -> None:
        super().__init__(name="tasks-async-loop", daemon=True)
        self.slots = slots
        self.concurrency = concurrency
        self.draining = draining
        self._writer = writer
        self._timer_armed = timer_armed
        self.log = log
        self.loop = asyncio.new_event_loop()
        self.bridge = PoolBridge(
            self.loop, engine_threads(concurrency), min(concurrency, STEP_THREADS)
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._outage = Outage(log, "async run")

    # -- from any thread ------------------------------------------------------------------------

    def wake(self) -> None:
        """Async runs were queued: start those there is room for."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: the worker stopped
            self.loop.call_soon_threadsafe(self._start_queued)

    def stop(self, timeout: float = 2.0) -> None:
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.join(timeout)
        self.bridge.shutdown()

    # -- the loop's thread ----------------------------------------------------------------------

    def run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.call_soon(self._start_queued)
            self.loop.run_forever()
        except BaseException as exc:  # the worker's watch (loop.py) stops the worker
            with contextlib.suppress(Exception):
                self.log.exception("async run loop died", error=str(exc))
        finally:
            with contextlib.suppress(Exception):
                self.loop.close()

    def _start_queued(self) -> None:
        # The pool's count decides (both kinds together); a run written off for ignoring its
        # abort left it, though its task may still be awaiting its code.
        for item in self.slots.next_async(self.concurrency):
            task = self.loop.create_task(self._run(item))
            self._tasks.add(task)
            task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._start_queued()

    async def _run(self, item: transitions.Claimed) -> None:
        run, lease = item.run, item.lease
        writer = self._writer()
        if writer is not None:
            lease = dataclasses.replace(lease, writer=writer)
        engine = self.bridge.engine
        try:
            if run.attempts > 1:  # it reads the run's history first
                prepared = await engine(
                    executor.prepare, run, lease, self.draining, item.prestarted
                )
            else:  # nothing to read: no trip off the loop
                prepared = executor.prepare(run, lease, self.draining, item.prestarted)
            ctx, handle = prepared.ctx, prepared.handle
            handle.on_timer_armed(self._timer_armed)  # the heartbeat sleeps until the earliest
            self.slots.hold(Held(lease, ctx, handle, renewed_at=item.at))
            if self.draining.is_set():
                await engine(transitions.requeue_run, lease, clock.now())
                return
            await executor.aexecute(run, prepared.workflow, ctx, self.bridge)
            self._outage.ok()
        except LeaseLostError as exc:
            self.log.warning("lease lost; dropping the run", run_id=str(run.pk), error=str(exc))
        except DB_ERRORS as exc:
            # An outage, not the run's failure: back off, then hand the run back (worker/loop.py
            # `_slot`); the interrupted attempt does not count against its retries.
            await asyncio.sleep(self._outage.failed(exc))
            with contextlib.suppress(LeaseLostError, *DB_ERRORS):
                await engine(transitions.requeue_run, lease, clock.now())
        except Exception as exc:
            self.log.exception("run crashed the executor", run_id=str(run.pk), error=str(exc))
        finally:
            self.slots.release(lease)  # unless its completion took the slot along


def engine_threads(concurrency: int) -> int:
    return max(1, min(concurrency, ENGINE_THREADS))


def is_async_run(claimed: transitions.Claimed) -> bool:
    wf = registry.find(claimed.run.task_name, claimed.run.version)
    return wf is not None and wf.is_async


def held_async(held: Held) -> bool:
    return isinstance(held.ctx, AsyncTaskContext)
