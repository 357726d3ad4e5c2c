"""The worker loop: claim -> hand to a slot -> execute -> free the slot. Reads top to bottom.

Threads: the main loop (claims), up to `concurrency` slot threads for plain runs (each keeps its
own connection; all started at once when every workflow is plain, at most EAGER_SLOT_THREADS
with async workflows too, the rest as plain runs are claimed), with async workflows one
event loop and its engine and step threads (async_runs.py), one heartbeat (which also beats the
worker's row), the maintenance leader candidate (services/leader.py), and on PostgreSQL one
LISTEN connection. SIGTERM/SIGINT: stop claiming, let
in-flight steps finish within the grace period, abort the rest, hand their runs back, exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db.backends.signals import connection_created

from .. import clock, transitions
from ..conf import engine_settings
from ..db import sqlite_bounds
from ..db.alias import connection
from ..db.notify import Listener, listening_possible
from ..db.outages import DB_ERRORS, MAX_BACKOFF_SECONDS, Outage, drop_if_cut, misconfigured
from ..db.pooler import behind_transaction_pooler
from ..definitions import Workflow
from ..exceptions import LeaseLostError, WorkerStopping
from ..observe.logs import get_logger
from ..operations import queues as queue_control
from ..runtime import executor
from ..services.fleet import Registration
from ..services.leader import Leader
from ..transitions import claim_mode, queue_state
from .async_runs import AsyncRuns, engine_threads, held_async, is_async_run
from .group_commit import GroupCommit
from .heartbeat import Heartbeat, WorkerHooks
from .pulse import Pulse, silence_seconds
from .slots import Held, SlotPool

BURST_HORIZON = timedelta(seconds=60)
PREFETCH_MAX_AGE = 1.0
PREFETCH_PER_SLOT = 8  # the default prefetch cap, per slot
CLAIM_GATHER_SECONDS = 0.005  # without group commit (whose own gather is in group_commit.py)
EAGER_SLOT_THREADS = 16  # a worker with async workflows too: slot threads started at once


@dataclass(frozen=True)
class WorkerConfig:
    workflows: tuple[Workflow, ...]
    queues: tuple[str, ...] = ()
    concurrency: int = 4
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 10.0
    poll_interval: float = 1.0
    grace_seconds: float = 30.0
    burst: bool = False
    prefetch: int | None = None  # None: PREFETCH_PER_SLOT x the concurrency


class Worker:
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.pairs = sorted({(w.name, w.version) for w in config.workflows})
        self.queues = list(config.queues) or None
        self.log = get_logger(worker_id=self.id)
        self.stopping = threading.Event()
        self.draining = threading.Event()
        # Runs the group commit may claim beyond the free slots, queued for the next slot that
        # frees (at most `prefetch`; how many, the rate the slots start runs decides: see
        # slots.py). Handed back if not started within PREFETCH_MAX_AGE.
        prefetch = config.prefetch
        if prefetch is None:
            prefetch = config.concurrency * PREFETCH_PER_SLOT
        self.slots = SlotPool(config.concurrency, prefetch)
        queue_state.use_poll_interval(config.poll_interval)
        self.slots.caps = claim_mode.worker_caps(claim_mode.limited_queues(self.queues))
        self.wake = self.slots.freed  # a slot freed, a wake-up arrived, or the worker stops
        self._slots: list[threading.Thread] = []
        self._spawning = threading.Lock()  # the claim loop and the group writer may both start
        self._signals = 0
        self._loop_thread: int | None = None  # the claim loop's (`run`'s) thread
        self.registration = Registration(self)
        # The claim loop turns at least every poll interval, or every outage back-off.
        loop_stall = silence_seconds() + config.poll_interval + MAX_BACKOFF_SECONDS
        self.pulse = Pulse.from_environment(loop_stall, self.log)
        self.heartbeat = Heartbeat(
            self.slots,
            WorkerHooks(
                self.hand_back_stale,
                self.write_off,
                self.registration.beat_if_due,
                pulse=self.pulse.beat,
            ),
            lease_seconds=config.lease_seconds,
            heartbeat_seconds=config.heartbeat_seconds,
            log=self.log,
        )
        self.leader = Leader(self)
        self._batch = max(1, config.concurrency // 2)
        self.group: GroupCommit | None = None
        # SQLite: the async runs' hot writes share transactions (group_commit.py), the plain
        # runs' go alone as before.
        self.async_group: GroupCommit | None = None
        self.listener: Listener | None = None
        # Async workflows' runs go on one event loop (async_runs.py), plain ones on slot
        # threads: as many as the concurrency from the start when every workflow is plain (as
        # before async workflows), else started as plain runs are claimed.
        self.async_runs: AsyncRuns | None = None
        if any(w.is_async for w in config.workflows):
            self.async_runs = AsyncRuns(
                self.slots,
                concurrency=config.concurrency,
                draining=self.draining,
                writer=lambda: self.group or self.async_group,
                timer_armed=self.heartbeat.wake.set,
                log=self.log,
            )
            self.slots.is_async = is_async_run
            self.slots.shared_cap = True  # --concurrency caps both kinds together
            self.slots.async_ready = self.async_runs.wake

    # -- the loop -----------------------------------------------------------------------------

    def run(self) -> int:
        self._install_signal_handlers()
        self._loop_thread = threading.get_ident()
        connection_created.connect(self._configure_connection, weak=False)
        connection.close()  # reopen with the session settings below
        self.log.info(
            "worker started",
            tasks=[f"{n}@{v}" for n, v in self.pairs],
            queues=self.queues or "all",
            concurrency=self.config.concurrency,
        )
        self._bound_atomic_steps()
        with contextlib.suppress(*DB_ERRORS):  # else the heartbeat thread's first beat writes it
            self.registration.beat()
        self._start_threads()
        outage = Outage(self.log, "claim")
        slots = self.slots
        while not self.stopping.is_set() and not self._a_side_loop_died():
            if misconfigured.is_set():  # logged by the thread that met it; retrying cures nothing
                self.log.error("stopping the worker: the database settings must change")
                break
            self.pulse.loop_turned()
            # A guarded claim (flow control) is two statements and a commit of its own: it
            # goes on this thread's connection, beside the group writer's (which then only
            # writes), and claims ahead for the slots as the group's claim would.
            slots.claims_ahead = self.group is not None and claim_mode.guarded(
                self.pairs, self.queues
            )
            loop_claims = self.group is None or slots.claims_ahead
            if slots.backlog and loop_claims and 0 < slots.free() < self._batch:
                # Under a backlog, let a few more places free up so one claim serves several
                # runs, instead of one claim per finished run. (With group commit and plain
                # claims, the completions claim for the slots they free instead.)
                time.sleep(CLAIM_GATHER_SECONDS)
            free = slots.reserve(slots.free())
            if free <= 0:  # every slot busy: wait for one to free (its thread sets `wake`)
                self.wake.wait(self.config.poll_interval)
                self.wake.clear()
                continue
            claimed: list[transitions.Claimed] = []
            try:
                drop_if_cut()
                claim_mode.refresh()
                claimed = transitions.claim_runs(
                    self.id,
                    self.pairs,
                    self.queues,
                    free,
                    self.config.lease_seconds,
                    slots.held_ids(),
                    slots.worker_room(),
                )
                outage.ok()
            except DB_ERRORS as exc:
                self.stopping.wait(outage.failed(exc))
                continue
            finally:
                full = slots.after_claim(claimed, free)
            if full:
                continue  # places were all filled; claim again as soon as one frees
            try:
                if self.config.burst and slots.busy() == 0 and not self._due_soon():
                    break
            except DB_ERRORS as exc:
                self.stopping.wait(outage.failed(exc))
                continue
            self.wake.wait(self.config.poll_interval)
            self.wake.clear()
        return self._shutdown()

    # -- side loops: any of them dying stops the worker (its runs are handed back) -------------

    def _side_loops(self) -> list[threading.Thread]:
        loops: list[threading.Thread | None] = [self.heartbeat, self.leader, self.group]
        loops.append(self.async_group)
        loops.append(self.listener)
        loops.append(self.async_runs)
        return [t for t in loops if t is not None]

    def _a_side_loop_died(self) -> bool:
        """The one watch over the side loops (the claim loop runs it at least every poll
        interval): a worker without its heartbeat renews no lease, without its group writer
        writes nothing, without its listener misses cancels' NOTIFYs, without its leader
        thread leaves maintenance undone."""
        dead = [t.name for t in self._side_loops() if not t.is_alive()]
        if dead:
            self.log.error("a side loop died; stopping the worker", loops=dead)
        return bool(dead)

    def hand_back_stale(self, now: float) -> None:
        """Prefetched runs that waited PREFETCH_MAX_AGE for a slot (its steps are slow) go
        back to the queue for any worker, rather than wait here for as long as a lease lasts."""
        for item in self.slots.take_stale(now, PREFETCH_MAX_AGE):
            with contextlib.suppress(LeaseLostError, *DB_ERRORS):
                transitions.requeue_run(item.lease, clock.now())

    def _due_soon(self) -> bool:
        return transitions.anything_due_before(self.pairs, self.queues, clock.now() + BURST_HORIZON)

    # -- slots --------------------------------------------------------------------------------

    def _slot(self) -> None:
        outage = Outage(self.log, "slot")
        retired = False
        with contextlib.suppress(*DB_ERRORS):
            connection.ensure_connection()  # connect now, not on the first run's critical path
        while not retired:
            item = self.slots.next_run()
            if item is None:
                break
            lease = item.lease
            try:
                drop_if_cut()
                self._execute(item)
                outage.ok()
            except DB_ERRORS as exc:
                # An outage, not the run's failure: back off, then hand the run back so that
                # it is replayed at once (if that fails too, its lease expires and any worker
                # replays it). The interrupted attempt does not count against its retries.
                time.sleep(outage.failed(exc))
                with contextlib.suppress(LeaseLostError, *DB_ERRORS):
                    transitions.requeue_run(lease, clock.now())
            except Exception as exc:
                self.log.exception(
                    "run crashed the executor", run_id=str(lease.run_id), error=str(exc)
                )
            finally:
                retired = self.slots.release(lease)  # unless its completion took the slot along
        if retired:
            self.slots.thread_retired()
        connection.close()

    def _start_slot(self) -> None:
        self.slots.thread_started()
        t = threading.Thread(target=self._slot, name=f"tasks-slot-{len(self._slots)}", daemon=True)
        t.start()
        self._slots.append(t)

    def _eager_slot_threads(self) -> int:
        """Slot threads started (and connected) with the worker, off the first runs' critical
        path: one per place when every workflow is plain; with async workflows too, at most
        EAGER_SLOT_THREADS (a --concurrency sized for async runs must not cost as many idle
        threads and connections), none when every workflow is async."""
        workflows = self.config.workflows
        if self.async_runs is None:
            return self.config.concurrency
        if all(w.is_async for w in workflows):
            return 0
        return min(self.config.concurrency, EAGER_SLOT_THREADS)

    def _start_slots(self, n: int) -> None:
        """Plain runs were claimed and no idle slot thread is left for them."""
        with self._spawning:
            for _ in range(n):
                self._start_slot()

    def _execute(self, item: transitions.Claimed) -> None:
        run, lease = item.run, item.lease
        if self.group is not None:
            lease = dataclasses.replace(lease, writer=self.group)
        prepared = executor.prepare(run, lease, self.draining, item.prestarted)
        wf, ctx, handle = prepared.workflow, prepared.ctx, prepared.handle
        handle.on_timer_armed(self.heartbeat.wake.set)  # it sleeps until the earliest timer
        self.slots.hold(Held(lease, ctx, handle, renewed_at=item.at))
        if self.draining.is_set():
            transitions.requeue_run(lease, clock.now())
            return
        try:
            executor.execute(run, wf, ctx)
        except LeaseLostError as exc:
            ctx.logger.warning("lease lost; dropping the run", error=str(exc))

    # -- slots: what the heartbeat and the worker row call back for -----------------------------

    def slots_busy(self) -> int:
        """Slots executing, queued for or reserving a run (the tasks_worker_slots_busy gauge)."""
        return self.slots.busy()

    @property
    def concurrency(self) -> int:
        return self.config.concurrency

    def held(self) -> list[Held]:
        return self.slots.held()

    def write_off(self, held: Held) -> None:
        """The run's step ignores its abort: stop waiting for the thread and give its slot to a
        new one. The stuck thread can no longer write anything (its lease is gone or about to
        be), and it exits when its user code finally returns."""
        if self.slots.write_off(held):
            if held_async(held):  # its task goes on until its code returns; it holds no thread
                held.ctx.logger.warning("step ignored its abort signal; run written off")
                return
            self._start_slot()
            held.ctx.logger.warning("step ignored its abort signal; slot thread replaced")

    def request_stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    def on_notify(self, payloads: list[str]) -> None:
        if any(p.startswith("cancel:") for p in payloads):
            self.heartbeat.kick.set()
        if any(p.startswith(queue_control.CHANGED) for p in payloads):
            queue_state.forget()  # a queue paused, resumed or re-limited: claim with its news
        self.wake.set()

    # -- start and stop -----------------------------------------------------------------------

    def _start_threads(self) -> None:
        if uses_group_commit():
            claims = transitions.ClaimRequest(
                self.id, self.pairs, self.queues, 0, self.config.lease_seconds
            )
            self.group = GroupCommit(self.slots, claims, self.log)  # before the slots' runs
            self.group.start()
        elif self.async_runs is not None and connection.vendor == "sqlite":
            claims = transitions.ClaimRequest(
                self.id, self.pairs, self.queues, 0, self.config.lease_seconds
            )
            self.async_group = GroupCommit(self.slots, claims, self.log, sqlite=True)
            self.async_group.start()
        for _ in range(self._eager_slot_threads()):
            self._start_slot()
        if self.async_runs is not None:
            self.slots.threads_wanted = self._start_slots  # more as plain runs are claimed
            self.async_runs.start()
        self.heartbeat.start()
        self.leader.start()
        if listens():
            self.listener = Listener(self.on_notify, self.heartbeat.stop, self.log)
            self.listener.start()

    def _bound_atomic_steps(self) -> None:
        """SQLite: an atomic step holds the only write lock, which every worker's renewals wait
        for; this worker cuts its atomic steps within a third of its lease."""
        setting = engine_settings().sqlite_atomic_step_seconds
        bound = sqlite_bounds.bound_by_lease(self.config.lease_seconds)
        if bound is not None and setting is not None and bound < setting:
            self.log.info(
                "SQLite: atomic steps are cut at a third of the lease",
                seconds=round(bound, 3),
                lease_seconds=self.config.lease_seconds,
                sqlite_atomic_step_seconds=setting,
            )

    def _configure_connection(self, sender: Any, connection: Any, **kwargs: Any) -> None:
        """A frozen worker must not hold row locks for long: PostgreSQL ends a session that
        sits idle inside a transaction (only an atomic step keeps one open across user code).

        The claim loop's session commits without waiting for the WAL flush
        (`synchronous_commit = off`): it claims, hands runs back and notes flow control's
        claims, and none of that is a promise to anyone. A claim the database loses in a crash
        (at most the WAL writer's few hundred milliseconds) leaves its run queued as before it;
        the worker that ran it then holds no lease, so its writes are fenced out and the run is
        claimed again, as after a lost worker. Every write that promises something (a step's
        checkpoint, a completion, an enqueue) goes on another session with a synchronous
        commit, whose flush also carries every earlier claim in the WAL. What it saves is a
        flush on the way from an idle worker's wake-up to the run's first step."""
        if connection.vendor == "postgresql" and not behind_transaction_pooler():
            ms = int(max(2 * self.config.lease_seconds, 10) * 1000)
            with connection.cursor() as cur:
                cur.execute(f"SET idle_in_transaction_session_timeout = {ms}")
                if threading.get_ident() == self._loop_thread:
                    cur.execute("SET synchronous_commit = off")

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._signals += 1
        if self._signals > 1:
            os._exit(1)  # second signal: exit at once
        self.request_stop()

    def _shutdown(self) -> int:
        self.draining.set()  # no new step starts; each run hands itself back at its next step
        self.slots.closed = True  # no claim rides on a group any more
        self.leader.stop.set()  # no service starts now; it resigns, so another worker leads at once
        self.log.info("worker stopping", in_flight=self.slots.busy())
        deadline = time.monotonic() + self.config.grace_seconds
        while self.slots.busy() and time.monotonic() < deadline:
            self.pulse.loop_turned()
            time.sleep(0.05)
        stuck = self.held()
        if stuck:
            for h in stuck:
                h.ctx.abort_signal.abort(WorkerStopping("worker shutting down"))
            end = time.monotonic() + 2.0
            while self.slots.busy() and time.monotonic() < end:
                time.sleep(0.05)
            for h in self.held():
                try:  # on this thread's connection: the group writer may be what failed
                    transitions.requeue_run(dataclasses.replace(h.lease, writer=None), clock.now())
                    h.ctx.logger.info("run handed back")
                except LeaseLostError:
                    pass
                except DB_ERRORS:
                    pass
        self.pulse.stopping()
        self.heartbeat.stop.set()
        self.leader.join(timeout=5.0)
        with contextlib.suppress(*DB_ERRORS):
            self.registration.remove()  # after the hand-back: the row no longer holds anything
        self.slots.stop_threads(len(self._slots))
        if self.async_runs is not None:
            self.async_runs.stop()  # before the group writer: its engine threads write there
        for group in (self.group, self.async_group):
            if group is not None:
                group.stop()
        self.heartbeat.wake.set()
        end = time.monotonic() + 2.0  # each closes its connection as it ends
        for t in [*self._slots, *self._side_loops()]:
            t.join(max(0.0, end - time.monotonic()))
        connection.close()
        self.log.info("worker stopped")
        if self.slots.busy():
            # A thread stuck in user code would keep the process alive: exit explicitly.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(self._exit_code())
        return self._exit_code()

    def _exit_code(self) -> int:
        return 1 if misconfigured.is_set() else 0


def uses_group_commit() -> bool:
    return connection.vendor == "postgresql" and engine_settings().group_commit


def listens() -> bool:
    return engine_settings().notify and listening_possible()


def connections_per_process(
    concurrency: int, *, has_async: bool = False, has_plain: bool = True
) -> int:
    """The database connections one worker process holds (`_start_threads`): one per slot (a
    worker of async workflows only starts none), the claim loop's, the heartbeat's, the
    leader's, and the group writer's and the LISTEN one's when they run (PostgreSQL); with
    async workflows, the engine threads' too."""
    slots = concurrency if has_plain else 0
    engine = engine_threads(concurrency) if has_async else 0
    return slots + 3 + engine + int(uses_group_commit()) + int(listens())
