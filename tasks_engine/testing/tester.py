"""`WorkflowTester`, `FakeClock` and `drain` (the package's docstring shows them in use).

The tester is the real engine: runs are claimed, replayed and written by the same executor
and transitions a worker uses (one run at a time, in this thread). Only time is fake: the
engine's clock (`tasks_engine.clock.now`) is replaced while the tester is open, and whenever
nothing is due the clock jumps to the next timer (a sleep, a fact wait's timeout, a step's or
the workflow's retry backoff, a deferred start), or, when due runs are held back by their
queue's rate limit, to when its sliding window frees a place. A run that waits on a fact
without a timeout stays waiting until the test signals it; `run_until_idle` does not jump
over fact timeouts either (the test may mean to signal first), `run_to_completion` does.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from functools import reduce
from operator import or_
from typing import Any

from django.db.models import Q, QuerySet

from .. import clock, engine, transitions
from ..conf import engine_settings, parse_rate
from ..definitions import Workflow, registry
from ..engine import RunView, Signaled, StepView
from ..models import WorkflowRun
from ..runtime import executor
from ..states import RunStatus
from ..transitions import queue_state
from ..transitions.flow_claims import rate_frees_at
from ..transitions.flow_rate_claims import rate_key_frees_at
from ..values.durations import duration_seconds
from ..values.text import check_text
from .assertions import ANY, assert_enqueued, assert_not_enqueued

FINISHED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELED})


class FakeClock:
    """The engine's time while a tester is open: moves only when told (or jumped)."""

    def __init__(self, start: datetime | None = None) -> None:
        if start is not None:
            engine.check_time("start", start)  # the engine's times are aware
        self.current = start or datetime.now(UTC)

    def now(self) -> datetime:
        return self.current

    def advance(self, seconds: float | timedelta) -> None:
        """Move the clock forward by seconds or a timedelta (0 up to durations.MAX_DURATION)."""
        try:
            delta = duration_seconds(seconds, "advance(seconds)", zero_ok=True)
        except ValueError:
            given = seconds.total_seconds() if isinstance(seconds, timedelta) else seconds
            if given < 0:
                raise ValueError(f"the clock does not go back: advance({seconds!r})") from None
            raise
        self.current += seconds if isinstance(seconds, timedelta) else timedelta(seconds=delta)

    def jump_to(self, when: datetime) -> None:
        self.current = max(self.current, when)


def next_timer(
    *,
    fact_timeouts: bool = True,
    after: datetime | None = None,
    pairs: list[tuple[str, int]] | None = None,
) -> datetime | None:
    """The earliest time a pending or waiting run (of `pairs`, when given) becomes due (None:
    no run has a timer), later than `after` when given. Without `fact_timeouts`, runs waiting
    for a fact are left out: their timer is the timeout the test may mean to beat by
    signalling."""
    runs = _timed_runs(fact_timeouts, pairs)
    if after is not None:
        runs = runs.filter(available_at__gt=after)
    return runs.order_by("available_at").values_list("available_at", flat=True).first()


def _timed_runs(
    fact_timeouts: bool, pairs: list[tuple[str, int]] | None = None
) -> QuerySet[WorkflowRun]:
    runs = WorkflowRun.objects.filter(
        status__in=[RunStatus.PENDING, RunStatus.WAITING], available_at__isnull=False
    )
    if pairs is not None:
        runs = runs.filter(reduce(or_, (Q(task_name=n, version=v) for n, v in pairs), Q(pk=None)))
    if not fact_timeouts:
        runs = runs.exclude(status=RunStatus.WAITING, waiting_on__startswith="fact:")
    return runs


def rate_window_frees(
    pairs: list[tuple[str, int]], *, fact_timeouts: bool = True
) -> datetime | None:
    """When the first rate-limited queue or rate limit key that holds back due runs of `pairs`
    admits one again (its sliding window frees a place: docs/FLOW_CONTROL.md); None when no
    due run waits on a rate limit."""
    now = clock.now()
    if not pairs:
        return None
    limits = queue_state.limits()
    rated = [q for q, lim in limits.items() if lim.rate is not None]
    due = _timed_runs(fact_timeouts, pairs).filter(available_at__lte=now)
    queues = set(due.filter(queue__in=rated).values_list("queue", flat=True).distinct())
    frees = [rate_frees_at(q, limits[q], now) for q in sorted(queues)]
    keys = due.filter(rate_key__isnull=False).values_list("rate_key", "rate_limit").distinct()
    for key, rate in sorted(set(keys)):
        if key is not None:  # the filter's: mypy cannot see it
            frees.append(rate_key_frees_at(key, parse_rate(rate, "rate_limit"), now))
    return min((at for at in frees if at is not None), default=None)


def drain(
    fake: FakeClock | None = None,
    *,
    pairs: list[tuple[str, int]] | None = None,
    horizon: float | None = None,
    limit: int = 500,
    worker_id: str = "test-worker",
    fact_timeouts: bool = True,
) -> list[str]:
    """Execute due runs in this thread, one claim at a time, until none is due; returns each
    execution's outcome ("completed", "suspended", "retrying", "failed", ...). With a fake
    clock, jump to the next timer instead of waiting for it, and over a rate limit's window
    that holds due runs back (`rate_window_frees`) (only to times within
    `horizon` seconds, when given; over fact timeouts only with `fact_timeouts`). `limit`
    bounds the executions (a run that never settles), and the clock jumps between two."""
    check_worker_id(worker_id)
    pairs = pairs or registry.pairs()
    outcomes: list[str] = []
    jumps = 0  # in a row, without an execution: bounded by `limit` too
    while len(outcomes) < limit and jumps <= limit:
        claimed = transitions.claim_runs(worker_id, pairs, None, 1, 30.0)
        if not claimed:
            wake = (
                next_timer(fact_timeouts=fact_timeouts, pairs=pairs) if fake is not None else None
            )
            if fake is not None and wake is not None and wake <= fake.current:
                # Due, yet no claim took it: held back by a queue's rate limit (jump to when
                # its window frees a place, or to a later timer if that comes first), or not
                # claimable by these pairs (nothing this drain can do).
                wake = rate_window_frees(pairs, fact_timeouts=fact_timeouts)
                if wake is not None:
                    later = next_timer(fact_timeouts=fact_timeouts, after=fake.current, pairs=pairs)
                    wake = wake if later is None else min(wake, later)
            if wake is None:
                break
            if horizon is not None and wake > clock.now() + timedelta(seconds=horizon):
                break
            assert fake is not None
            fake.jump_to(wake)
            jumps += 1
            continue
        jumps = 0
        run, lease = claimed[0].run, claimed[0].lease
        prepared = executor.prepare(run, lease, threading.Event(), claimed[0].prestarted)
        with _StepTimeouts(prepared):
            outcomes.append(executor.execute(run, prepared.workflow, prepared.ctx))
    return outcomes


def check_worker_id(worker_id: Any) -> None:
    """TypeError or ValueError for a worker id the claimed rows cannot hold (it is written in
    every claim): checked before the first, which would otherwise fail its statement."""
    longest = WorkflowRun._meta.get_field("worker_id").max_length
    assert longest is not None
    check_text("worker_id", worker_id, longest)


class _StepTimeouts:
    """What a worker's heartbeat does for the running step's `timeout=`, for the run a drain
    executes: when the timer is due, abort the step with its StepTimeoutError (it then fails
    and is retried under its policy, as in a worker). Real time, not the fake clock: a step's
    timeout bounds how long its code runs. (A step that ignores its abort runs on until it
    returns; a worker would write it off after the grace.)"""

    def __init__(self, prepared: executor.Prepared) -> None:
        self._handle = prepared.handle
        self._abort = prepared.ctx.abort_signal.abort
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._watch, name="tester-step-timeouts")

    def __enter__(self) -> _StepTimeouts:
        self._handle.on_timer_armed(self._wake.set)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stopping:
            self._wake.clear()  # before reading the timer: an arm after this wakes the wait
            timer = self._handle.timer
            wait: float | None = None  # until the next step arms one
            if timer is not None and timer.fired is None:
                wait = timer.deadline - time.monotonic()
                if wait <= 0:
                    timer.fire(time.monotonic(), self._abort)
                    continue
                # A longer wait raises OverflowError (and killed this thread: later timeouts
                # never fired); waking at the cap only looks again.
                wait = min(wait, threading.TIMEOUT_MAX)
            self._wake.wait(wait)


class WorkflowTester:
    """Start runs, drive them with a fake clock, deliver facts, inspect the results.

    Use it as a context manager (the fake clock is installed on entry and removed on exit) in
    a test that has database access (pytest-django's `db` fixture, or a Django `TestCase`).
    """

    def __init__(
        self,
        *,
        start: datetime | None = None,
        worker_id: str = "workflow-tester",
        limit: int | None = None,
    ) -> None:
        check_worker_id(worker_id)
        self.clock = FakeClock(start)
        self.worker_id = worker_id
        self._limit = limit
        self._saved: Any = None

    def __enter__(self) -> WorkflowTester:
        self._saved = clock.now
        clock.now = self.clock.now  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        clock.now = self._saved  # type: ignore[method-assign]
        self._saved = None

    def _check_entered(self) -> None:
        """Outside its `with` block the engine runs on the real clock: nothing would be
        jumped, and a run would only seem stuck."""
        if self._saved is None:
            raise RuntimeError(
                "the tester's clock is installed only inside its block: use"
                " `with testing.WorkflowTester() as t:`"
            )

    @property
    def limit(self) -> int:
        """The executions one drive may make: as given, else 1000 more than the engine's
        MAX_STEP_ATTEMPTS_PER_RUN, so that a step retried without end reaches the cap and fails
        its run as in a worker (at the default cap of 1000, a limit of 1000 stopped the drive
        one execution short of it)."""
        if self._limit is not None:
            return self._limit
        return engine_settings().max_step_attempts_per_run + 1000

    @property
    def now(self) -> datetime:
        return self.clock.now()

    def advance(self, seconds: float | timedelta) -> None:
        """Move the fake clock forward (runs due by then run at the next `run_until_idle`)."""
        self._check_entered()
        self.clock.advance(seconds)

    # -- driving ------------------------------------------------------------------------------

    def start(self, task: str | Workflow, input: Any = None, **options: Any) -> uuid.UUID:
        """Enqueue a run (the options are `enqueue`'s) and return its id; nothing runs yet."""
        return engine.enqueue(task, input, **options).run_id

    def run_until_idle(self, *, jump: bool = True) -> list[str]:
        """Execute runs until nothing is due, jumping the clock over sleeps, retry backoffs and
        deferred starts when `jump`, but not over fact timeouts: a run waiting for a fact stays
        waiting for the test to signal it. Returns each execution's outcome, in order."""
        return self._drive(jump=jump, fact_timeouts=False)

    def run_to_completion(self, run_id: uuid.UUID | str, *, jump: bool = True) -> RunView:
        """Run until `run_id` has finished (completed, failed or canceled) and return its view,
        jumping over every timer when `jump`, fact timeouts included. AssertionError when it
        cannot finish without outside help (it waits on a fact that has no timeout), or names
        no run (then nothing is driven)."""
        self.get_run(run_id)
        executed = len(self._drive(jump=jump, fact_timeouts=True))
        view = self.get_run(run_id)
        if view.status not in FINISHED:
            waiting = WorkflowRun.objects.filter(pk=view.run_id).values_list(
                "waiting_on", flat=True
            )
            why = (
                f"the drive stopped after {executed} executions (limit={self.limit})"
                if executed >= self.limit
                else "nothing more is due: signal it, or advance the clock"
            )
            raise AssertionError(
                f"run {view.run_id} is {view.status} (waiting on {waiting.first() or 'nothing'!r})"
                f" and {why}"
            )
        return view

    def _drive(self, *, jump: bool, fact_timeouts: bool) -> list[str]:
        self._check_entered()
        return drain(
            self.clock if jump else None,
            limit=self.limit,
            worker_id=self.worker_id,
            fact_timeouts=fact_timeouts,
        )

    def signal(
        self, run_id: uuid.UUID | str, name: str, payload: Any = None, **kw: Any
    ) -> Signaled:
        """Deliver a fact, as `tasks_engine.signal` does (the run runs at the next drive)."""
        return engine.signal(run_id, name, payload, **kw)

    def cancel(self, run_id: uuid.UUID | str, reason: str | None = None) -> bool:
        return engine.cancel(run_id, reason)

    # -- inspecting ---------------------------------------------------------------------------

    def get_run(self, run_id: uuid.UUID | str) -> RunView:
        view = engine.get_run(run_id)
        if view is None:
            raise AssertionError(f"no run {run_id}")
        return view

    def steps(self, run_id: uuid.UUID | str) -> list[StepView]:
        """Every step attempt of the run, oldest first."""
        return list(self.get_run(run_id).steps)

    def assert_enqueued(
        self,
        task: str | Workflow,
        input: Any = ANY,
        *,
        count: int | None = None,
        queue: str | None = None,
        parent: uuid.UUID | str | None = None,
    ) -> list[RunView]:
        """`testing.assert_enqueued`: runs of `task` (with `input`, ...) were enqueued."""
        __tracebackhide__ = True
        return assert_enqueued(task, input, count=count, queue=queue, parent=parent)

    def assert_not_enqueued(
        self,
        task: str | Workflow,
        input: Any = ANY,
        *,
        queue: str | None = None,
        parent: uuid.UUID | str | None = None,
    ) -> None:
        """`testing.assert_not_enqueued`: no run of `task` (with `input`, ...) was enqueued."""
        __tracebackhide__ = True
        assert_not_enqueued(task, input, queue=queue, parent=parent)
