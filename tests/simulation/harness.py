"""The simulation's machinery: a ticking fake clock, attempt threads that stop before every
engine call, the hooks that inject database errors and silence crashed workers, and the
in-memory side-effect log the step bodies write.

One thread runs at a time: the state machine releases an attempt, which runs until it reaches
its next stop (an engine call made outside any transaction, or a step body) or ends, and only
then does the machine go on. So every example is a deterministic interleaving that hypothesis
can shrink and replay. An attempt never stops inside a transaction: it would hold row locks
(or SQLite's write lock) that the machine's own calls would then wait for.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import queue
import threading
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import Error as DatabaseError
from django.db import OperationalError, connection

from tasks_engine import transitions
from tasks_engine.db import sql
from tasks_engine.exceptions import EngineUnavailable, LeaseLostError
from tasks_engine.runtime import executor
from tasks_engine.runtime.attempt_handle import AttemptHandle
from tasks_engine.runtime.context import TaskContext

STEP_TIMEOUT = 30.0  # seconds an attempt may take to reach its next stop: more is a hang
OUTAGES: tuple[type[BaseException], ...] = (DatabaseError, EngineUnavailable)
# Engine functions that are not an attempt's writes or reads (or are called by the machine
# itself): no stop before them.
NOT_GATED = frozenset(
    {
        "attempt_write",
        "outage_guard",
        "holds",
        "anything_due_before",
        "claim_runs",
        "claim_statement",
        "claimed_from_rows",
        "renew_leases",
        "write_group",
    }
)


class SimKilled(BaseException):
    """The simulated worker process died: the thread unwinds and may not touch the database."""


class SimHang(AssertionError):
    """An attempt did not reach its next stop in time (a lock wait, a loop)."""


# -- the clock --------------------------------------------------------------------------------


class TickingClock:
    """A fake clock whose every reading is a microsecond after the previous one: no two
    timestamps tie, so the claim's ORDER BY, and with it every replay of an example, is
    deterministic."""

    START = datetime(2030, 1, 1, tzinfo=UTC)
    TICK = timedelta(microseconds=1)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.current = self.START

    def now(self) -> datetime:
        with self._lock:
            self.current += self.TICK
            return self.current

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.current += timedelta(seconds=seconds)

    def jump_to(self, when: datetime) -> None:
        with self._lock:
            self.current = max(self.current, when)

    def reset(self) -> None:
        with self._lock:
            self.current = self.START

    def monotonic(self) -> float:
        """Seconds since START, unticked: the step timers' clock (runtime/step_timeouts.py, the
        heartbeat) in the simulation."""
        with self._lock:
            return (self.current - self.START).total_seconds()


_CLOCK: TickingClock | None = None  # the simulation's clock (set_clock), that bodies move


def set_clock(fake: TickingClock | None) -> None:
    global _CLOCK
    _CLOCK = fake


# -- the side-effect log ----------------------------------------------------------------------


@dataclass(frozen=True)
class Execution:
    """One start of a step body (or of an op's `fn`)."""

    run_id: uuid.UUID
    key: str
    token: uuid.UUID
    attempt: int


@dataclass
class Body:
    """One run of a step body, by the fake clock: from its start until it returned (None: it
    has not, or never will). `timeout`: its step's, if it has one."""

    run_id: uuid.UUID
    key: str
    step_id: int
    timeout: float | None
    started: datetime
    ended: datetime | None = None

    def outlived_timeout(self) -> bool:
        """Whether it ran longer than its timeout (it returned after its timer was due)."""
        return self.overrun() is not None

    def overrun(self) -> tuple[float, float] | None:
        """(seconds it ran, its timeout) when it ran longer than its timeout, else None."""
        if self.timeout is None or self.ended is None:
            return None
        ran = (self.ended - self.started).total_seconds()
        return (ran, self.timeout) if ran > self.timeout else None


def business_key(step_id: int) -> str:
    """The key of the business row (testapp's Marker) an atomic step attempt writes."""
    return f"sim-step:{step_id}"


@dataclass
class SimLog:
    executions: list[Execution] = field(default_factory=list)
    bodies: list[Body] = field(default_factory=list)  # step bodies with a step attempt
    commits: list[tuple[str, uuid.UUID, uuid.UUID]] = field(default_factory=list)  # op commits
    flaked_children: set[str] = field(default_factory=set)  # parents whose first child failed
    violations: list[tuple[str, str]] = field(default_factory=list)  # (check, message)

    def count(self, run_id: uuid.UUID, key: str) -> int:
        return sum(1 for e in self.executions if e.run_id == run_id and e.key == key)


LOG = SimLog()


def reset_log() -> SimLog:
    global LOG
    LOG = SimLog()
    return LOG


# -- attempts ---------------------------------------------------------------------------------

_local = threading.local()


def current() -> Attempt | None:
    """The attempt this thread executes (None on the machine's own thread)."""
    return getattr(_local, "attempt", None)


class Attempt:
    """One claim of one run by one simulated worker, executed on a pool thread that stops
    before every engine call and in every step body until the machine releases it."""

    def __init__(
        self, seq: int, worker_id: str, claimed: transitions.Claimed, draining: threading.Event
    ) -> None:
        self.seq = seq
        self.worker_id = worker_id
        self.claimed = claimed
        self.lease = claimed.lease
        self.run_id: uuid.UUID = claimed.lease.run_id
        self.token: uuid.UUID = claimed.lease.token
        self.draining = draining
        self.ctx: TaskContext | None = None
        self.handle: AttemptHandle | None = None  # what the worker's heartbeat holds
        self.where = "claimed"
        self.done = False
        self.killed = False
        self.lost = False  # the heartbeat found the lease gone
        self.outcome = ""
        self.error: BaseException | None = None
        self.trace = ""
        self.fail_in: int | None = None  # the n-th statement from now fails
        # Seconds, by the fake clock, that the next step body takes before its stop (an atomic
        # one has none: the clock moves while it runs, in its transaction).
        self.body_seconds = 0.0
        self.held: Any = None  # the worker's view of it (worker.slots.Held), for its heartbeat
        self.injected = 0  # database errors injected into this attempt
        self._quiet = 0  # > 0: the harness's own statements (not counted, never failed)
        self._go = threading.Semaphore(0)
        self._parked = threading.Event()

    @property
    def in_body(self) -> bool:
        return not self.done and self.where.startswith(("body ", "op "))

    def __repr__(self) -> str:
        state = self.outcome or f"at {self.where}"
        return f"<attempt #{self.seq} {self.worker_id} run {str(self.run_id)[:8]} {state}>"

    # -- the attempt's own thread -------------------------------------------------------------

    def run_here(self, release: Callable[[], None]) -> None:
        _local.attempt = self
        try:
            self.outcome = self._execute()
        except SimKilled:
            self.outcome = "killed"
        except LeaseLostError:
            self.outcome = "lease-lost"
        except OUTAGES as exc:  # the worker backs off; the lease expires and the run is replayed
            self.outcome, self.error = "outage", exc
            with contextlib.suppress(Exception):
                connection.close()
        except BaseException as exc:  # noqa: BLE001 - the invariants report it
            self.outcome, self.error, self.trace = "crashed", exc, traceback.format_exc()
        finally:
            _local.attempt = None
            self.done = True
            release()
            self._parked.set()

    def _execute(self) -> str:
        run = self.claimed.run
        prepared = executor.prepare(run, self.lease, self.draining, self.claimed.prestarted)
        self.ctx, self.handle = prepared.ctx, prepared.handle
        return executor.execute(run, prepared.workflow, prepared.ctx)

    def pause(self, where: str) -> None:
        """Stop here until the machine releases this attempt (never inside a transaction)."""
        if self.killed:
            raise SimKilled(where)
        if connection.in_atomic_block:
            return
        self.where = where
        self._parked.set()
        self._go.acquire()
        if self.killed:
            raise SimKilled(where)

    def before_statement(self) -> None:
        if self.killed:
            raise SimKilled("statement")
        if self._quiet or self.fail_in is None:
            return
        self.fail_in -= 1
        if self.fail_in <= 0:
            self.fail_in = None
            self.injected += 1
            raise OperationalError(f"simulated database outage (attempt #{self.seq})")

    @contextlib.contextmanager
    def quietly(self) -> Iterator[None]:
        """The harness's own statements in this thread: never counted or failed."""
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1

    # -- the machine's side -------------------------------------------------------------------

    def wait_parked(self) -> None:
        if not self._parked.wait(STEP_TIMEOUT):
            raise SimHang(f"{self!r} did not reach its next stop within {STEP_TIMEOUT}s")

    def step(self) -> None:
        """Release the attempt until its next stop, or its end."""
        if self.done:
            return
        self._parked.clear()
        self._go.release()
        self.wait_parked()

    def kill(self) -> None:
        """The worker process dies: the thread unwinds without another statement."""
        self.killed = True
        self.step()


# -- threads ----------------------------------------------------------------------------------


class SimThread(threading.Thread):
    """Executes attempts one after another, on one database connection for its life."""

    def __init__(self, pool: ThreadPool, n: int) -> None:
        super().__init__(name=f"sim-thread-{n}", daemon=True)
        self.pool = pool
        self.jobs: queue.SimpleQueue[Attempt | None] = queue.SimpleQueue()

    def run(self) -> None:
        try:
            with connection.execute_wrapper(_statement_hook):
                connection.ensure_connection()
                while (attempt := self.jobs.get()) is not None:
                    attempt.run_here(functools.partial(self.pool.release, self))
                    # Reconnect now (after an outage closed it), outside any attempt: the
                    # statements that set a new connection up must not count as an attempt's,
                    # or the n-th statement an injected error hits would depend on the thread.
                    connection.ensure_connection()
        finally:
            connection.close()


class ThreadPool:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[SimThread] = []
        self._all: list[SimThread] = []

    def start(self, attempt: Attempt) -> None:
        """Run `attempt` on an idle thread until its first stop."""
        with self._lock:
            thread = self._idle.pop() if self._idle else self._new()
        attempt._parked.clear()
        thread.jobs.put(attempt)
        attempt.wait_parked()

    def _new(self) -> SimThread:
        thread = SimThread(self, len(self._all))
        self._all.append(thread)
        thread.start()
        return thread

    def release(self, thread: SimThread) -> None:
        with self._lock:
            self._idle.append(thread)

    def shutdown(self) -> None:
        for thread in self._all:
            thread.jobs.put(None)
        for thread in self._all:
            thread.join(timeout=STEP_TIMEOUT)


# -- hooks ------------------------------------------------------------------------------------


def _statement_hook(execute: Any, sql_text: str, params: Any, many: bool, context: Any) -> Any:
    attempt = current()
    if attempt is not None:
        attempt.before_statement()
    return execute(sql_text, params, many, context)


def _gated(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        attempt = current()
        if attempt is not None:
            attempt.pause(name)
        return fn(*args, **kwargs)

    return call


def install_hooks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Stop before every engine call an attempt makes (`transitions.<name>`), and see every
    statement it sends (Django's execute wrapper; the engine's prepared statements bypass it,
    so `sql._pg` too). Returns the gated names."""
    gated = []
    for name in transitions.__all__:
        fn = getattr(transitions, name, None)
        if inspect.isfunction(fn) and name not in NOT_GATED:
            monkeypatch.setattr(transitions, name, _gated(name, fn))
            gated.append(name)
    real_pg = sql._pg

    def pg(sql_text: str, params: Any, *, fetch: bool) -> Any:
        attempt = current()
        if attempt is not None:
            attempt.before_statement()
        return real_pg(sql_text, params, fetch=fetch)

    monkeypatch.setattr(sql, "_pg", pg)
    return gated


# -- what step bodies call --------------------------------------------------------------------


def executed(
    ctx: TaskContext, key: str, *, timeout: float | None = None, slow: float = 0.0
) -> int | None:
    """A step body starts: log it, check it may run, and stop (the step is in flight); the
    body's run is timed by the fake clock, and takes `slow` seconds (and the attempt's
    `body_seconds`) before its stop. Returns its step attempt's id (None outside the
    simulation, or without a running attempt)."""
    from tasks_engine import clock
    from tasks_engine.models import StepAttempt

    attempt = current()
    if attempt is None:
        return None
    LOG.executions.append(Execution(ctx.run_id, key, ctx.attempt_token, attempt.seq))
    with attempt.quietly():
        steps = StepAttempt.objects.filter(run_id=ctx.run_id, name=key)
        step_id = (
            steps.filter(status="running", lease_token=ctx.attempt_token)
            .values_list("id", flat=True)
            .first()
        )
        if steps.filter(status="completed").exists():
            LOG.violations.append(
                (
                    "replayed-completed-step",
                    f"step {key!r} of run {ctx.run_id} executed again after it completed "
                    f"(attempt #{attempt.seq})",
                )
            )
        if not steps.filter(status="running", lease_token=ctx.attempt_token).exists():
            LOG.violations.append(
                (
                    "unfenced-step-start",
                    f"step {key!r} of run {ctx.run_id} executed by attempt #{attempt.seq} "
                    "without a running step attempt of its lease",
                )
            )
    body = None
    if step_id is not None:
        body = Body(ctx.run_id, key, step_id, timeout, clock.now())
        LOG.bodies.append(body)
    if (attempt.body_seconds or slow) and _CLOCK is not None:
        _CLOCK.advance(attempt.body_seconds + slow)
        attempt.body_seconds = 0.0
    attempt.pause(f"body {key}")
    if body is not None:
        body.ended = clock.now()
    return step_id


def op_executed(ctx: TaskContext, op_key: str) -> None:
    """An op's `fn` starts: the ledger must not hold a result for it yet."""
    from tasks_engine.models import OpLedger

    attempt = current()
    if attempt is None:
        return
    LOG.executions.append(Execution(ctx.run_id, f"op:{op_key}", ctx.attempt_token, attempt.seq))
    with attempt.quietly():
        if OpLedger.objects.filter(op_key=op_key, status="done").exists():
            message = f"op {op_key!r} ran after its result was stored"
            LOG.violations.append(("op-after-done", message))
    attempt.pause(f"op {op_key}")


def op_committed(ctx: TaskContext, op_key: str) -> None:
    """Inside the op's commit transaction: log the business write once it commits."""
    from django.db import transaction

    entry = (op_key, ctx.run_id, ctx.attempt_token)
    transaction.on_commit(lambda: LOG.commits.append(entry))
