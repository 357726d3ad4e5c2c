"""The worker's slots, under one lock: how many are taken, the runs they hold, and the claimed
runs queued for the next slot that frees.

A slot is taken while a run executes in it, while a claimed run waits for one (prefetched), and
while a claim is reserving it. `busy` may exceed the concurrency by the prefetch. A run's last
write (its completion, worker/group_commit.py) may take its slot along: the group that commits
it frees the slot, or gives it to a run it claimed in the same statement.

How deep the prefetch goes follows the rate at which the slots start runs: as many as they
start in PREFETCH_WAIT, up to the worker's `prefetch`. Quick runs keep a deep queue (the claim
and the completions of one group are written while the slots run the runs an earlier group
claimed: Python and the database work side by side); slow runs keep none (a run is not held
back from other workers for a slot that frees in minutes).

Runs are keyed by (run, lease token): a stale attempt of a run (its slot still executes after an
outage let its lease expire) and a fresh one never share an entry. The claims of this worker
never take back a run one of its slots holds (see `ClaimRequest.held`).
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from .. import transitions
from ..observe import metrics
from ..runtime.attempt_handle import AttemptHandle
from ..runtime.context import TaskContext

Key = transitions.LeaseKey  # (run id, lease token)

PREFETCH_WAIT = 0.1  # seconds a prefetched run is expected to wait for a slot, at most
RATE_SECONDS = 0.25  # the start rate's memory (time constant of its moving average)
RATE_STEP = 0.05  # the rate is updated at most this often


@dataclass
class Held:
    lease: transitions.Lease
    ctx: TaskContext
    handle: AttemptHandle  # the attempt's state shared with the heartbeat (timer, cancel, ...)
    renewed_at: float  # monotonic time the lease was last known to be granted (claim, renewal)
    lost: bool = False
    abort_deadline: float | None = None  # monotonic time after which the run is written off
    handed_over: bool = False  # its last write took the slot along (the group frees it)


class SlotPool:
    def __init__(
        self, concurrency: int, prefetch: int, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.concurrency = concurrency
        self.prefetch = prefetch  # the most runs claimed ahead (prefetch_depth: how many now)
        self._monotonic = monotonic
        self._started = 0  # runs the slot threads took up so far
        self._rate = 0.0  # runs started per second, a moving average
        self._rate_mark = (monotonic(), 0)  # when the rate was last updated, and _started then
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)  # a run (or a stop) is queued
        self._busy = 0
        self._held: dict[Key, Held] = {}
        self._queued: deque[transitions.Claimed | None] = deque()  # None: a slot thread stops
        # Async runs (worker/async_runs.py): queued apart, taken by the event loop, not a thread.
        self._queued_async: deque[transitions.Claimed] = deque()
        self.is_async: Callable[[transitions.Claimed], bool] = lambda claimed: False
        self.async_ready: Callable[[], None] = lambda: None  # async runs were queued
        self.threads_wanted: Callable[[int], None] = lambda n: None  # start n slot threads
        self._threads = 0  # slot threads alive (started, not retired)
        self._idle = 0  # slot threads waiting for a run
        # Runs taken up (by a slot thread or the event loop) and not released: at most the
        # concurrency, both kinds together, once `shared_cap` (a worker with async workflows).
        # With plain runs alone there are as many threads as places: nothing to wait for.
        self._running = 0
        self.shared_cap = False
        self._written_off: set[Key] = set()  # runs whose stuck slot thread was replaced
        self.freed = threading.Event()  # a slot freed: the claim loop may claim again
        self.backlog = False  # the last claim filled every slot it asked for
        self.closed = False  # the worker stops: no claim rides on a group any more
        # The claim loop claims ahead (the prefetch), not the group: flow control guards the
        # claims (worker/loop.py).
        self.claims_ahead = False
        # Queues with a worker_concurrency: their runs this worker holds, from the claim that
        # took them until their slot releases them (or they go back from the queue).
        self.caps: dict[str, int] = {}
        self._capped: dict[Key, str] = {}
        self._per_queue: Counter[str] = Counter()

    # -- reserving and filling ------------------------------------------------------------------

    def reserve(self, n: int) -> int:
        """Take up to `n` free places for the claim loop's claim; returns how many."""
        with self._lock:
            n = max(0, min(n, self._room()))
            self._busy += n
        return n

    def _room(self) -> int:
        """The claim loop's places: the free slots, and the prefetch's when it claims ahead."""
        ahead = self._prefetch_depth() if self.claims_ahead and self.backlog else 0
        return self.concurrency + ahead - self._busy

    def reserve_for_group(self, handed_over: int) -> int:
        """How many runs a group completing `handed_over` runs claims along (0: none): a run
        for each slot they hand over, and one for each idle slot or free prefetch place (which
        it reserves). Only under a backlog, and not once the worker stops."""
        if not handed_over or not self.backlog or self.closed or self.claims_ahead:
            return 0
        with self._lock:
            idle = max(0, self.concurrency + self._prefetch_depth() - self._busy)
            self._busy += idle
        return handed_over + idle

    def prefetch_depth(self) -> int:
        """How many runs to claim ahead now: as many as the slots start in PREFETCH_WAIT."""
        with self._lock:
            return self._prefetch_depth()

    def _prefetch_depth(self) -> int:
        now = self._monotonic()
        since, started = self._rate_mark
        elapsed = now - since
        if elapsed >= RATE_STEP:  # a moving average weighted by time (steady however often asked)
            measured = (self._started - started) / elapsed
            self._rate += (1 - math.exp(-elapsed / RATE_SECONDS)) * (measured - self._rate)
            self._rate_mark = (now, self._started)
        return min(self.prefetch, round(self._rate * PREFETCH_WAIT))

    def fill(self, claimed: list[transitions.Claimed], reserved: int) -> None:
        """Queue the claimed runs for the `reserved` slots and free the slots they did not
        take."""
        metrics.record_claims([item.run for item in claimed])
        with self._lock:
            if self.caps:
                for c in claimed:
                    if c.run.queue in self.caps:
                        self._capped[c.lease.key] = c.run.queue
                        self._per_queue[c.run.queue] += 1
            plain = [c for c in claimed if not self.is_async(c)]
            self._queued_async.extend(c for c in claimed if self.is_async(c))
            self._queued.extend(plain)
            self._busy -= reserved - len(claimed)
            self._ready.notify(len(plain))
            wanted = 0
            if self._threads < self.concurrency:  # slot threads started as plain runs come
                queued = sum(1 for c in self._queued if c is not None)
                wanted = min(queued - self._idle, self.concurrency - self._threads)
        if wanted > 0:
            self.threads_wanted(wanted)
        if len(plain) < len(claimed):
            self.async_ready()

    def after_claim(self, claimed: list[transitions.Claimed], reserved: int) -> bool:
        """Queue the claim loop's claimed runs (`fill`) and note whether more is probably
        queued; returns whether the claim filled every place it reserved."""
        self.fill(claimed, reserved)
        full = len(claimed) == reserved
        # A guarded claim that took fewer runs than it asked for was most likely cut short by a
        # limit (a key or a queue with less room than places), not by an empty queue: while it
        # takes runs, or runs are still in flight, the loop keeps claiming ahead. Dropping to
        # the free slots alone would let the prefetched runs drain before the next claim, and
        # the slots wait for it.
        self.backlog = full or (self.claims_ahead and (bool(claimed) or self._busy > 0))
        return full

    def after_group(self, claimed: list[transitions.Claimed], reserved: int, handed: int) -> None:
        """A group's slots (handed over by the runs it completed, and those it reserved) go to
        the runs it claimed; the rest are freed (and the claim loop woken for them)."""
        held = max(reserved, handed)
        self.fill(claimed, held)
        if reserved:
            self.backlog = len(claimed) == reserved
        if held > len(claimed):
            self.freed.set()

    def take_stale(self, now: float, max_age: float) -> list[transitions.Claimed]:
        """Queued runs that waited `max_age` for a slot, taken off the queue and their slots
        freed: the caller hands them back for any worker."""
        with self._lock:
            stale = [c for c in self._queued if c is not None and now - c.at > max_age]
            for c in stale:
                self._queued.remove(c)
                self._uncap(c.lease.key)
            stale_async = [c for c in self._queued_async if now - c.at > max_age]
            for c in stale_async:
                self._queued_async.remove(c)
                self._uncap(c.lease.key)
            stale.extend(stale_async)
            self._busy -= len(stale)
        if stale:
            self.freed.set()
        return stale

    # -- slot threads ---------------------------------------------------------------------------

    def next_run(self) -> transitions.Claimed | None:
        """Block until a run is queued for this slot thread (None: the thread stops)."""
        with self._lock:
            self._idle += 1
            while not self._queued or (
                self.shared_cap
                and self._queued[0] is not None
                and self._running >= self.concurrency
            ):
                self._ready.wait()
            self._idle -= 1
            item = self._queued.popleft()
            if item is not None:
                self._started += 1
                self._running += 1
            else:
                self._threads -= 1
            return item

    def thread_started(self) -> None:
        with self._lock:
            self._threads += 1

    def thread_retired(self) -> None:
        with self._lock:
            self._threads -= 1

    def next_async(self, room: int) -> list[transitions.Claimed]:
        """Up to `room` queued async runs, for the event loop to start now."""
        with self._lock:
            n = min(room, self.concurrency - self._running, len(self._queued_async))
            taken = [self._queued_async.popleft() for _ in range(max(0, n))]
            self._started += len(taken)
            self._running += len(taken)
            return taken

    def stop_threads(self, n: int) -> None:
        with self._lock:
            self._queued.extend([None] * n)
            self._ready.notify_all()

    def hold(self, held: Held) -> None:
        with self._lock:
            self._held[held.lease.key] = held

    def hand_over(self, lease: transitions.Lease) -> bool:
        """The run's last write takes its slot along (the group's `after_group` frees it).
        False: the run no longer has a slot (it was written off), and nothing is handed."""
        with self._lock:
            held = self._held.get(lease.key)
            if held is not None:
                held.handed_over = True
            return held is not None

    def release(self, lease: transitions.Lease) -> bool:
        """The slot's run ended. Returns whether this slot thread retires (a replacement took
        its slot when its run was written off)."""
        k = lease.key
        with self._lock:
            held = self._held.pop(k, None)
            handed_over = held is not None and held.handed_over
            retired = k in self._written_off  # its slot was already given to a new thread
            self._written_off.discard(k)
            self._uncap(k)
            if not retired and not handed_over:
                self._busy -= 1
            if not retired:
                self._running -= 1
                self._ready.notify()  # a slot thread held back by the concurrency
            waiting_async = bool(self._queued_async)
        if not handed_over:
            self.freed.set()
        if waiting_async:
            self.async_ready()
        return retired

    def write_off(self, held: Held) -> bool:
        """Stop counting a slot whose run ignores its abort; the caller starts a replacement
        thread. False: the run ended meanwhile."""
        k = held.lease.key
        with self._lock:
            if self._held.get(k) is not held:
                return False
            held.lost = True
            del self._held[k]
            self._written_off.add(k)
            self._uncap(k)  # like its slot, its place under a worker_concurrency is given up
            self._busy -= 1
            self._running -= 1
            self._ready.notify()
        self.freed.set()
        self.async_ready()
        return True

    def _uncap(self, k: Key) -> None:
        queue = self._capped.pop(k, None)
        if queue is not None:
            self._per_queue[queue] -= 1

    # -- reading --------------------------------------------------------------------------------

    def worker_room(self) -> dict[str, int]:
        """Places left under each queue's worker_concurrency (ClaimRequest.worker_room)."""
        with self._lock:
            return {q: cap - self._per_queue[q] for q, cap in self.caps.items()}

    def busy(self) -> int:
        return self._busy

    def free(self) -> int:
        """What the claim loop may claim now (see `reserve`)."""
        with self._lock:
            return self._room()

    def yet_to_write(self) -> int:
        """Runs that will send a write to the group writer without waiting for a group: those
        in slots, and the queued runs that an idle slot thread takes up now (a slot whose run's
        last write took the slot along is idle at once, and its next run's first write can
        join the same group)."""
        with self._lock:
            queued = sum(1 for c in self._queued if c is not None)
            idle_threads = max(0, self.concurrency - len(self._held))
            return len(self._held) + min(queued + len(self._queued_async), idle_threads)

    def held(self) -> list[Held]:
        with self._lock:
            return [h for h in self._held.values() if not h.lost]

    def executing(self, held: Held) -> bool:
        """Whether `held`'s run is still in its slot and has not sent its last write (a run
        whose slot let it go, or whose completion took the slot along, has ended)."""
        with self._lock:
            return self._held.get(held.lease.key) is held and not held.handed_over

    def held_ids(self) -> tuple[uuid.UUID, ...]:
        """Runs in this worker's slots: its claims never take them back (see ClaimRequest)."""
        with self._lock:
            return tuple(run_id for run_id, _ in self._held)

    def stuck(self, now: float) -> list[Held]:
        with self._lock:
            return [
                h
                for h in self._held.values()
                if h.abort_deadline is not None
                and now >= h.abort_deadline
                and h.ctx.abort_signal.aborted  # a step timeout's abort ends with its step
            ]
