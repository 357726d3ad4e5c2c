"""The engine simulation: a hypothesis rule-based state machine over the real transitions.

Three simulated workers (a worker id, a draining flag and the attempts it runs, two at most)
claim runs of the `sim-` workflows (workflows.py) with the engine's own `claim_runs`, on the
test database, under a ticking fake clock. Each claimed run executes on a thread of its own
(`executor.build_context` + `executor.execute`, as a worker slot does) that stops before every
engine call and inside every step body (harness.py); the machine releases one attempt at a
time, so each example is one deterministic interleaving of:

Rules
  start           (first) enqueue 1..4 runs of the shapes in SHAPES
  enqueue         one more run (at most MAX_RUNS an example)
  claim           worker w claims a due run (pending, woken timer or expired lease)
  advance         release one attempt for 1..8 stops (a step body, or an engine call)
  advance_to_body release one attempt until it is in its next step body (or op), or ends
  slow_body       the same, and that body takes 4 or 9 s by the fake clock before its stop (an
                  atomic body takes them inside its transaction, where it cannot stop); the
                  `slow` input of a shape makes given bodies take 9 s too (workflows.py)
  advance_all     release every live attempt for one stop, round robin
  db_error        the n-th statement an attempt sends from now raises OperationalError,
                  then release it
  crash           worker w dies: its attempts stop where they are and never write again; its
                  row stays (beating no more) and the process that replaces it beats a new one
  heartbeat       worker w's heartbeat (worker/heartbeat.py's own Heartbeat, on the fake clock:
                  step_timeouts and the heartbeat read the fake clock's `monotonic`): fires due
                  step timers (the step's abort signal gets a StepTimeoutError), writes off
                  each run whose step ignored its abort (timeout, cancel, deadline) for a lease
                  (`write_off_stuck`: the attempt recorded failed and the run requeued, or the
                  run canceled or failed), renews its leases (`renew_leases`), aborts runs
                  whose lease is gone, whose cancel was requested or whose deadline passed,
                  sends deferred step completions, and beats its worker row
                  (`fleet.Registration.beat`, an upsert), whether it holds runs or not
  heartbeats      every worker's heartbeat
  stop_worker     graceful stop: draining, a grace of a few stops, abort, hand back
                  (`requeue_run`), exit (its row removed); its replacement beats a new row
  reap            one round of the leader's dead-worker service (`transitions.reap_dead_workers`)
                  after aging every worker row to its last beat on the fake clock (beats are
                  stamped with the database's clock)
  stall           worker w stalls for DEAD_WORKER_SECONDS + 1 while the others' heartbeats run,
                  then the leader reaps: w's runs are retaken by others while its attempts
                  are parked; they go on later, and its next heartbeat beats its row back
  prune           one round of the leader's retention service (`retention.prune_expired`,
                  RETENTION_DAYS completed and canceled 0, failed 31 s), in batches of 1
                  or 500, one batch a status or all; in half the examples (`start` draws it) the
                  quiescence drain runs one too each time a run finishes, and in half it cancels
                  the first parent it finds waiting on a running child, then prunes
  cancel, signal  `tasks_engine.cancel` / `tasks_engine.signal(run, "go")` on any run (a cancel
                  may be followed at once by a retention round, as `prune`)
  cancel_parent   cancel a waiting parent whose child is running, then a retention round
  retry           `tasks_engine.retry_run` of a failed or canceled top-level run (an operator's
                  retry: back to pending, its completed steps kept, the rest run again)
  advance_clock   0.6 s (deferred completions), 5 s, 11 s (sleeps), 31 s (leases expire)
  wake_next_timer jump to the next due time of a pending or waiting run

Invariants, after every rule (invariants.py)
  - a completed step never executes again; a step body starts only under a running attempt of
    its lease (checked as each body starts); completed attempts never change
  - a stale lease writes nothing: every stop an attempt makes after its lease passed to another
    claim (or was handed back) leaves the engine's tables exactly as they were
  - a function/op attempt is `running` only while its run is; a finished run has no open
    attempt; armed waits (sleep, fact wait, child) stay running only while the run is active
  - no committed fact, child result or cancel is lost: a waiting run has no unconsumed fact of
    the name it waits on, its child has not finished, its cancel was not requested, and it has
    an armed wait of that kind
  - canceled runs had a cancel request; a parent's cancel reaches every child not finished;
    a cancel that answered True ends its run canceled (until an operator retries it), and one
    that answered False found the run finished;
    no step, sleep, wait or child starts after the run's cancel committed
  - completed runs return what their workflow computes; failed runs failed as their workflow
    means to, or after interruptions (crash, lost lease) used up a step's retry budget, or for
    a canceled child, or with DeadlineExceededError past their deadline: never for an engine
    error
  - an op's business write commits once per op key; bodies meant to run once ran once
  - no attempt dies of an unexpected exception, nor of a database error nobody injected
  - a worker's heartbeat aborts every attempt of it whose lease is gone; a graceful stop hands
    back every run it still held
  - step timeouts (sim-timed's step "t", TIMEOUT_SECONDS): an attempt whose body ran longer
    than its timeout by the fake clock (from its start until it returned) is never recorded
    completed; an atomic one's business write (a Marker keyed by its attempt) never commits,
    and no atomic step's write commits without its checkpoint; an attempt fails with
    StepTimeoutError only once its timeout passed; a timed-out attempt is retried while the
    pass's counted failures are fewer than TIMED_RETRY.max_attempts and is terminal when they
    reach it, and a completed run returned the body's value only after an attempt of "t"
    completed, the caught timeout ("aTb") only after a terminal timeout
  - deadlines (sim-deadline's `@workflow(deadline=...)`, enqueue's `deadline_at` for
    sim-steps): no run ends completed with its completion written (finished_at, the time the
    engine compares) at or after its deadline (it fails or is canceled: with
    DeadlineExceededError, or with its own error if its handler failed on its own first); no
    run fails with DeadlineExceededError before its deadline
  - flow control: no queue or concurrency key ever has more runs `running` than its limit
    (sim-narrow's queue has a concurrency of 1; worker 0 serves it, workers 1 and 2 serve
    `default` alone, with the plain claim until a keyed run is enqueued) (sim-keyed's
    runs share one key of limit 1; the claims are the guarded claim once one is enqueued)
  - a queueing key has at most one queued run (pending, never started, not an operator's
    retry), and an enqueue that a run with the key answered was answered by that queued run
  - debounce (sim-debounced): at most one queued run per window, and an enqueue the window's
    run answered was answered by that queued run, which then holds its input; on_limit
    (sim-cancel-new, sim-cancel-running: keys of limit 1) under the flow limits above; a rate
    per key (sim-rated): no more than RATE_COUNT claims that start its runs in any
    RATE_WINDOW by the fake clock
  - reap: a worker row reaped beat more than DEAD_WORKER_SECONDS ago, one kept beat less; a
    reaped worker's running runs are claimable at once (lease expiry now: the claim's
    expired-lease source), not at lease expiry; a kept worker's runs keep their lease
  - prune: the retention service deletes finished runs only, never a finished child whose
    parent is unfinished (the parent reads it when it resumes) nor a finished parent with an
    unfinished child; a completed run it prunes completed each of its steps once; a run
    leaves the tables only by a prune (the other checks, quiescence included, then look at
    the runs that are left; an op key whose result was pruned may commit once more)
  - a stalled worker's attempts after a reap, and attempts of runs pruned under them, are held
    by the checks above: a stale lease writes nothing, no attempt dies of DoesNotExist (or any
    unexpected exception)
At quiescence (teardown: release every attempt, claim whatever is due, signal every fact
wait, jump over every timer and lease, until nothing moves)
  - every run (not pruned) finished, and every completed run completed each of its steps
    exactly once
Defects injected with SIM_INJECT (defects.py) show that the reap, prune, step-timeout and
deadline invariants catch what they are about.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import tasks_engine
from tasks_engine import testing, transitions
from tasks_engine.conf import engine_settings
from tasks_engine.db.sql import db_clock
from tasks_engine.exceptions import (
    DeadlineExceededError,
    LeaseLostError,
    TaskCanceledError,
    WorkerStopping,
)
from tasks_engine.models import OpLedger, WorkflowRun
from tasks_engine.models import Worker as WorkerRow
from tasks_engine.services import fleet, retention
from tasks_engine.states import FINISHED
from tasks_engine.transitions import claim_mode, first_steps
from tasks_engine.worker.heartbeat import Heartbeat, WorkerHooks
from tasks_engine.worker.slots import Held

from . import harness
from .defects import known
from .harness import Attempt, ThreadPool, TickingClock
from .invariants import (
    CompletedSteps,
    RunRow,
    check_answered_by_queued,
    check_answered_by_window,
    check_atomic_writes,
    check_attempts,
    check_cancel_promises,
    check_cancels,
    check_completed_steps,
    check_deadlines,
    check_debounce_windows,
    check_flow_limits,
    check_log,
    check_outcomes,
    check_queueing_keys,
    check_quiescent,
    check_rate_claims,
    check_step_timeouts,
    check_steps_after_cancel,
    check_timed_bodies,
    check_waits,
    diff,
    read_state,
    reset_tables,
    snapshot,
)
from .workflows import (
    DEBOUNCE_KEY,
    FACT,
    FACT_PAYLOAD,
    QUEUEING_KEY,
    RATE_COUNT,
    RATE_KEY,
    RATE_WINDOW,
    TIMEOUT_SECONDS,
    SimInput,
)

LEASE_SECONDS = 30.0
DEFERRED_MAX_AGE = 0.5  # the heartbeat sends deferred completions older than this
WORKERS = 3
CONCURRENCY = 2  # attempts one worker runs at once
MAX_RUNS = 4  # runs an example enqueues (children come on top)
GRACE_STOPS = 2  # stops a stopping worker lets each attempt make before it aborts them
MAX_STOPS_TO_BODY = 50
DRAIN_LIMIT = 5000  # stops, claims and clock jumps the quiescence drain may take

PARKING_TASKS = frozenset(
    {"sim-sleep", "sim-fact", "sim-fact-timeout", "sim-async-fact"}
)  # besides parents
PARENT_TASKS = frozenset({"sim-parent", "sim-parent-retry"})
PRUNE_BATCH = 500
# The retention service's RETENTION_DAYS (test_simulation.py installs it): completed and
# canceled runs go at the next round, failed ones once they are 31 s old on the fake clock (an
# operator may retry them until then).
DAY = 86_400.0
RETENTION_DAYS = {"completed": 0, "failed": 31 / DAY, "canceled": 0}


@dataclass(frozen=True)
class Shape:
    task: str
    input: dict[str, Any] | None = None
    defect: str | None = None  # the known defect that keeps it out (defects.py)
    queueing_key: str | None = None  # enqueued with it: a queued run of the key answers
    deadline: float | None = None  # enqueued with deadline_at this many seconds from now


SHAPES: dict[str, Shape] = {
    "steps": Shape("sim-steps"),
    "steps-atomic": Shape("sim-steps", {"atomic": True}),
    "steps-abortable": Shape("sim-steps", {"honor_abort": True}),
    # Async workflows: the same guarantees, through the async step API (runtime/async_steps.py).
    "async-steps": Shape("sim-async-steps"),
    "async-steps-atomic": Shape("sim-async-steps", {"atomic": True, "honor_abort": True}),
    "async-fact": Shape("sim-async-fact"),
    "sleep": Shape("sim-sleep"),
    "fact": Shape("sim-fact"),
    "fact-timeout": Shape("sim-fact-timeout"),
    "parent": Shape("sim-parent"),
    # Every sim-op run uses the same op key, unless that is a known defect.
    "op": Shape("sim-op", {"op": "" if known("op-ledger-not-fenced-across-runs") else "shared"}),
    "flaky": Shape("sim-flaky"),
    "fail": Shape("sim-fail"),
    "parent-retry": Shape("sim-parent-retry", None, "failed-child-not-rerun"),
    "bad-nan": Shape("sim-bad-value", {"bad": "nan"}, "unstorable-step-result"),
    "bad-inf": Shape("sim-bad-value", {"bad": "inf"}, "unstorable-step-result"),
    "bad-nul": Shape("sim-bad-value", {"bad": "nul"}, "unstorable-step-result"),
    "bad-set": Shape("sim-bad-value", {"bad": "set"}, "unstorable-step-result"),
    "keyed": Shape("sim-keyed"),
    # Issue 46: enqueues of one debounce key collapse into the window's run (its input the
    # last one's); full keys that cancel the new run or the running one; a rate per key.
    "debounced": Shape("sim-debounced", {"op": "first"}),
    "debounced-again": Shape("sim-debounced", {"op": "second"}),
    "cancel-new": Shape("sim-cancel-new"),
    "cancel-running": Shape("sim-cancel-running"),
    "rated": Shape("sim-rated"),
    "narrow": Shape("sim-narrow"),
    "queued": Shape("sim-steps", queueing_key=QUEUEING_KEY),
    # The same key with another input: the queued run answers whatever the input.
    "queued-atomic": Shape("sim-steps", {"atomic": True}, queueing_key=QUEUEING_KEY),
    # Step timeouts: the first run of "t" (the first two, "tt") outlives its timeout; the
    # machine's clock moves and slow_body may make any run of it do so.
    "timed": Shape("sim-timed"),
    "timed-slow": Shape("sim-timed", {"slow": "t"}),
    "timed-atomic-slow": Shape("sim-timed", {"atomic": True, "slow": "tt"}),
    "timed-abortable-slow": Shape("sim-timed", {"honor_abort": True, "slow": "t"}),
    # Deadlines: sim-deadline's `@workflow(deadline=...)` (25 s: its 10 s sleep and the
    # machine's clock moves may pass it), and enqueue's `deadline_at`, which slow bodies pass
    # mid-run.
    "deadline": Shape("sim-deadline"),
    "steps-deadline": Shape("sim-steps", {"slow": "ab"}, deadline=12.0),
    "steps-deadline-abortable": Shape(
        "sim-steps", {"honor_abort": True, "slow": "b"}, deadline=9.0
    ),
}
ENABLED_SHAPES = [name for name, s in SHAPES.items() if s.defect is None or not known(s.defect)]
WORKER = st.integers(0, WORKERS - 1)


@dataclass
class SimEnv:
    """What the test fixture sets up once for every example: the clock, the threads, and the
    (name, version) pairs the simulated workers claim."""

    clock: TickingClock
    pool: ThreadPool
    pairs: list[tuple[str, int]]


ENV: SimEnv | None = None
STATS: Counter[str] = Counter()  # what the examples did, summed (printed by the test)


def env() -> SimEnv:
    if ENV is None:
        raise RuntimeError("the simulation runs inside the sim_env fixture (test_simulation.py)")
    return ENV


class SimWorker:
    """A simulated worker process: a new id on every (re)start, as a real one has, and a worker
    row (`fleet.Registration`) that it beats when it starts and at every heartbeat."""

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.generation = 0
        self.draining = threading.Event()
        self.attempts: list[Attempt] = []
        # What Registration reads of its worker process.
        self.pairs = env().pairs
        self.config = SimpleNamespace(concurrency=CONCURRENCY)
        self.concurrency = CONCURRENCY  # services/worker_process.py's WorkerProcess reads it
        self.registration = fleet.Registration(self)  # type: ignore[arg-type]
        self.heartbeat = _heartbeat(self)

    def held(self) -> list[Attempt]:
        return self.live()

    def slots(self) -> list[Held]:
        """What the worker's heartbeat sees of its slots (worker/slots.py's Held, one per
        executing attempt, made as it reaches its first stop): those not lost nor written
        off."""
        out = []
        for attempt in self.live():
            if attempt.ctx is None or attempt.handle is None:
                continue
            if attempt.held is None:
                attempt.held = Held(attempt.lease, attempt.ctx, attempt.handle, renewed_at=0.0)
            if not attempt.lost and not attempt.held.lost:
                out.append(attempt.held)
        return out

    @property
    def id(self) -> str:
        return f"sim-w{self.slot}.{self.generation}"

    @property
    def queues(self) -> list[str] | None:
        """Worker 0 (and the drainer) serve every queue, the limited one too: their claims are
        guarded. The others serve `default` alone: theirs are the plain claim until a keyed
        run is enqueued."""
        return None if self.slot in (0, WORKERS) else ["default"]

    def live(self) -> list[Attempt]:
        return [a for a in self.attempts if not a.done]

    def restart(self) -> None:
        """The process that replaces it (after a crash or a graceful stop): a new id, a new
        row. A crashed process's row stays behind until the leader reaps it."""
        self.generation += 1
        self.draining = threading.Event()
        self.attempts = []
        self.registration = fleet.Registration(self)  # type: ignore[arg-type]
        self.heartbeat = _heartbeat(self)


class _Slots:
    """The slot pool a simulated worker's Heartbeat (worker/heartbeat.py) works on: `held` and
    `stuck` as worker/slots.py's SlotPool has them; `only` narrows `stuck` to one attempt (the
    machine writes off one attempt at a time, to check each write on its behalf)."""

    def __init__(self, worker: SimWorker) -> None:
        self.worker = worker
        self.only: Held | None = None

    def held(self) -> list[Held]:
        return self.worker.slots()

    def stuck(self, now: float) -> list[Held]:
        return [
            h
            for h in self.held()
            if (self.only is None or h is self.only)
            and h.abort_deadline is not None
            and now >= h.abort_deadline
            and h.ctx.abort_signal.aborted
        ]


class _QuietLog:
    def __getattr__(self, _name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


def _heartbeat(worker: SimWorker) -> Heartbeat:
    """The engine's heartbeat of worker/heartbeat.py, never started as a thread: the heartbeat
    rule calls what its loop calls (step timers, write-offs, aborts) on the fake clock (the
    sim_env fixture gives step_timeouts and the heartbeat the fake clock's `monotonic`)."""

    def written_off(held: Held) -> None:  # worker/loop.py's: the slot goes to a new thread
        held.lost = True

    hooks = WorkerHooks(lambda now: None, written_off, lambda now: None)
    return Heartbeat(
        _Slots(worker),  # type: ignore[arg-type]
        hooks,
        lease_seconds=LEASE_SECONDS,
        heartbeat_seconds=LEASE_SECONDS / 3,
        log=_QuietLog(),
    )


class Violation(AssertionError):
    """An invariant failed; one subclass per check, so hypothesis keeps distinct bugs apart."""


_VIOLATIONS: dict[str, type[Violation]] = {}


def violation(check: str) -> type[Violation]:
    if check not in _VIOLATIONS:
        name = "Violation_" + check.replace("-", "_")
        _VIOLATIONS[check] = type(name, (Violation,), {})
    return _VIOLATIONS[check]


@dataclass(frozen=True)
class RunInfo:
    id: uuid.UUID
    task_name: str
    status: str


def runs() -> list[RunInfo]:
    rows = WorkflowRun.objects.order_by("created_at").values_list("id", "task_name", "status")
    return [RunInfo(*row) for row in rows]


def next_due(statuses: tuple[str, ...], after: datetime | None = None) -> datetime | None:
    """The earliest `available_at` of a run in `statuses` (later than `after`, if given)."""
    runs = WorkflowRun.objects.filter(status__in=statuses, available_at__isnull=False)
    if after is not None:
        runs = runs.filter(available_at__gt=after)
    return runs.order_by("available_at").values_list("available_at", flat=True).first()


class EngineSimulation(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.env = env()
        reset_tables()
        first_steps.reset()  # each example learns first steps (claims start them) on its own
        claim_mode.forget_keyed()  # plain claims until a keyed run is enqueued
        self.env.clock.reset()
        self.log = harness.reset_log()
        self.workers = [SimWorker(i) for i in range(WORKERS)]
        # Worker rows: the fake-clock time of each row's last beat. Beats are stamped with the
        # database's clock (sql.db_now_sql); before a reap the rows are aged to match (`_age`).
        self.beats: dict[str, datetime] = {}
        for worker in self.workers:
            self._beat(worker)
        self.released: set[uuid.UUID] = set()  # runs a reap made claimable
        self.pruned: dict[uuid.UUID, RunRow] = {}  # runs the retention service deleted
        self.ledger_pruned: Counter[str] = Counter()  # op results pruned with their runs
        self.known_runs: set[uuid.UUID] = set()
        self.attempts: list[Attempt] = []
        self.enqueued = 0
        self.rate_claims: list[float] = []  # fake-clock times of claims that started sim-rated
        self.disrupted: Counter[uuid.UUID] = Counter()  # kills and lost leases, per run
        self.outages: Counter[uuid.UUID] = Counter()  # attempts ended by a database error
        self.retried: Counter[uuid.UUID] = Counter()  # operator retries, per run
        # Runs whose cancel() answered True, with their retries then: until an operator retries
        # it again, such a run ends canceled, never completed or failed.
        self.cancel_promised: dict[uuid.UUID, int] = {}
        self.ended: set[int] = set()  # attempts whose end was looked at
        self.completed_steps = CompletedSteps()
        self.broken = False

    # -- rules --------------------------------------------------------------------------------

    @initialize(
        shapes=st.lists(st.sampled_from(ENABLED_SHAPES), min_size=1, max_size=MAX_RUNS),
        prune_while_draining=st.booleans(),
        cancel_while_draining=st.booleans(),
    )
    def start(
        self, shapes: list[str], prune_while_draining: bool, cancel_while_draining: bool
    ) -> None:
        self.prune_while_draining = prune_while_draining
        self.cancel_while_draining = cancel_while_draining
        for shape in shapes:
            self.enqueue(shape)

    @precondition(lambda self: self.enqueued < MAX_RUNS)
    @rule(shape=st.sampled_from(ENABLED_SHAPES))
    def enqueue(self, shape: str) -> None:
        spec = SHAPES[shape]
        deadline_at = None
        if spec.deadline is not None:
            deadline_at = self.env.clock.now() + timedelta(seconds=spec.deadline)
        res = tasks_engine.enqueue(
            spec.task, spec.input, queueing_key=spec.queueing_key, deadline_at=deadline_at
        )
        self.enqueued += 1
        if spec.task == "sim-debounced":
            STATS["debounced enqueues"] += 1
            if res.deduplicated:
                STATS["debounced enqueues a window's run answered"] += 1
                stored = {**SimInput().model_dump(mode="json"), **(spec.input or {})}
                answered = check_answered_by_window(res.run_id, DEBOUNCE_KEY, stored)
                self._report("debounce", answered)
        if spec.queueing_key is not None:
            STATS["enqueues with a queueing key"] += 1
            if res.deduplicated:
                STATS["enqueues a queued run answered"] += 1
                answered = check_answered_by_queued(res.run_id, spec.queueing_key)
                self._report("queueing-key", answered)

    @rule(w=WORKER)
    def claim(self, w: int) -> None:
        worker = self.workers[w]
        if len(worker.live()) < CONCURRENCY and not worker.draining.is_set():
            self._claim(worker)

    @precondition(lambda self: self._live())
    @rule(data=st.data(), stops=st.integers(1, 8))
    def advance(self, data: st.DataObject, stops: int) -> None:
        attempt = data.draw(st.sampled_from(self._live()), label="attempt")
        for _ in range(stops):
            self._step(attempt)

    @precondition(lambda self: self._live())
    @rule(data=st.data())
    def advance_to_body(self, data: st.DataObject) -> None:
        """Release one attempt until it is inside its next step body (or op), or ends."""
        self.to_body(data.draw(st.sampled_from(self._live()), label="attempt"))

    @precondition(lambda self: self._live())
    @rule(data=st.data(), seconds=st.sampled_from([TIMEOUT_SECONDS / 2, TIMEOUT_SECONDS + 1]))
    def slow_body(self, data: st.DataObject, seconds: float) -> None:
        """Release one attempt until it is in its next step body, which takes `seconds` by the
        fake clock before its stop (an atomic body takes them inside its transaction, where
        it cannot stop: only the step's own check of its timer can fail it)."""
        attempt = data.draw(st.sampled_from(self._live()), label="attempt")
        attempt.body_seconds = seconds
        self.to_body(attempt)
        attempt.body_seconds = 0.0

    @precondition(lambda self: self._live())
    @rule()
    def advance_all(self) -> None:
        for attempt in self._live():
            self._step(attempt)

    @precondition(lambda self: self._live())
    @rule(data=st.data(), nth=st.integers(1, 3))
    def db_error(self, data: st.DataObject, nth: int) -> None:
        attempt = data.draw(st.sampled_from(self._live()), label="attempt")
        attempt.fail_in = nth
        self._step(attempt)

    @rule(w=WORKER)
    def crash(self, w: int) -> None:
        worker = self.workers[w]
        for attempt in worker.live():
            self.disrupted[attempt.run_id] += 1
            attempt.kill()
            self._ended(attempt)
        worker.restart()  # the dead process's row stays, beating no more
        self._beat(worker)

    @rule(w=WORKER)
    def heartbeat(self, w: int) -> None:
        """What worker/heartbeat.py does each interval: renew every lease the worker holds,
        abort runs whose lease is gone or whose cancel was requested, flush old completions,
        then beat the worker's row (an upsert: a row reaped while it stalled comes back)."""
        worker = self.workers[w]
        self._step_timers(worker)
        held = [a for a in worker.live() if a.ctx is not None and not a.lost]
        if held:
            self._renew(worker, held)
        self._beat(worker)

    @rule()
    def heartbeats(self) -> None:
        """Every worker's heartbeat, as time passes for them all."""
        for w in range(WORKERS):
            self.heartbeat(w)

    def _step_timers(self, worker: SimWorker) -> None:
        """worker/heartbeat.py's step-timer part, on the fake clock: fire every due step timer
        (the step's abort signal gets its StepTimeoutError), then write off each run whose
        abort (a timeout, a cancel, a deadline) its step ignored past the grace (a lease):
        a timed-out attempt is recorded failed and the run requeued, a canceled run canceled,
        a run past its deadline failed; the stuck thread writes nothing after that."""
        hb = worker.heartbeat
        hb.fire_step_timeouts(self.env.clock.monotonic())
        slots = hb.slots
        assert isinstance(slots, _Slots)
        for attempt in worker.live():
            held = attempt.held
            if held is None or held.lost or attempt.lost:
                continue
            slots.only = held
            try:
                if slots.stuck(self.env.clock.monotonic()):
                    self._on_behalf(attempt, hb.write_off_stuck)
            finally:
                slots.only = None
            if held.lost:
                attempt.lost = True
                STATS["attempts written off after their abort"] += 1
                event("the heartbeat wrote off a step that ignored its abort")

    def _renew(self, worker: SimWorker, held: list[Attempt]) -> None:
        renewed = transitions.renew_leases([a.lease for a in held], LEASE_SECONDS)
        for attempt in held:
            assert attempt.ctx is not None
            renewal = renewed.get(attempt.lease.key)
            if renewal is None:
                attempt.lost = True
                attempt.ctx.abort_signal.abort(LeaseLostError(f"run {attempt.run_id}: lost"))
            elif renewal.cancel_requested:
                assert attempt.handle is not None and attempt.held is not None
                attempt.handle.request_cancel()
                worker.heartbeat.abort(attempt.held, TaskCanceledError("canceled"))
            elif renewal.deadline_passed:
                assert attempt.held is not None
                worker.heartbeat.abort(attempt.held, DeadlineExceededError("deadline passed"))
                STATS["deadline aborts"] += 1
        for attempt in held:
            if not attempt.lost:
                flush = functools.partial(
                    transitions.flush_deferred, attempt.lease, older_than=DEFERRED_MAX_AGE
                )
                self._on_behalf(attempt, flush)
        self._report(
            "heartbeat-aborts-lost-leases",
            [
                f"{a!r}: its lease is gone and the heartbeat did not abort it"
                for a in held
                if self._stale(a)
                and a.ctx is not None
                and not a.ctx.abort_signal.aborted
                and not (known("renew-cross-matches-leases") and self._reclaimed_by(a, held))
            ],
        )

    @rule(w=WORKER)
    def stop_worker(self, w: int) -> None:
        """worker/loop.py's graceful stop: draining (each run hands itself back at its next
        step), a grace, then the runs still busy are aborted, handed back, and the process
        exits. Every run the worker held is back to be claimed at once."""
        worker = self.workers[w]
        worker.draining.set()
        for _ in range(GRACE_STOPS):
            for attempt in worker.live():
                self._step(attempt)
        for attempt in worker.live():
            if attempt.ctx is not None:
                attempt.ctx.abort_signal.abort(WorkerStopping("worker shutting down"))
            self._step(attempt)
        for attempt in worker.live():
            now = self.env.clock.now()
            self._on_behalf(attempt, functools.partial(transitions.requeue_run, attempt.lease, now))
            attempt.kill()
            self._ended(attempt)
        if not known("stop-drops-aborted-runs"):
            self._report(
                "stop-hands-back",
                [
                    f"{a!r}: the worker stopped gracefully, its run still waits for the lease"
                    for a in worker.attempts
                    if not self._stale(a)
                ],
            )
        worker.registration.remove()
        self.beats.pop(worker.id, None)
        worker.restart()
        self._beat(worker)

    @rule(data=st.data(), then_prune=st.booleans())
    def cancel(self, data: st.DataObject, then_prune: bool) -> None:
        """`tasks_engine.cancel` of any run; with `then_prune`, a retention round at once (a
        canceled parent is finished while its running child still finishes its step)."""
        candidates = [r for r in runs() if self._may_cancel(r)]
        if candidates:
            run = data.draw(st.sampled_from(candidates), label="run")
            if tasks_engine.cancel(run.id):
                self.cancel_promised[run.id] = self.retried[run.id]
            else:
                now = WorkflowRun.objects.get(pk=run.id).status
                self._report(
                    "cancel-answer",
                    []
                    if now in FINISHED
                    else [f"run {run.id}: cancel answered False, it is {now}"],
                )
            if then_prune:
                self._prune(PRUNE_BATCH, None)

    @precondition(lambda self: self._parents_of_running_children())
    @rule(data=st.data())
    def cancel_parent(self, data: st.DataObject) -> None:
        """Cancel a waiting parent while its child runs, then a retention round: the parent
        is canceled at once, its child only once its holder sees the request (`prune` must
        keep the parent until then)."""
        parents = self._parents_of_running_children()
        if parents:
            run_id = data.draw(st.sampled_from(parents), label="parent")
            if tasks_engine.cancel(run_id):
                self.cancel_promised[run_id] = self.retried[run_id]
            self._prune(PRUNE_BATCH, None)

    @staticmethod
    def _parents_of_running_children() -> list[uuid.UUID]:
        children = WorkflowRun.objects.filter(status="running", parent_run_id__isnull=False)
        parents = WorkflowRun.objects.filter(
            status="waiting", pk__in=children.values("parent_run_id")
        )
        return list(parents.order_by("created_at").values_list("id", flat=True))

    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        # Top-level runs only: a child belongs to its parent's pass (the parent's retry starts
        # a new child), and a child retried alone under a canceled parent would run on.
        finished = WorkflowRun.objects.filter(
            status__in=("failed", "canceled"), parent_run_id__isnull=True
        )
        candidates = list(finished.order_by("created_at").values_list("id", flat=True))
        if candidates:
            run_id = data.draw(st.sampled_from(candidates), label="run")
            assert tasks_engine.retry_run(run_id, reason="simulated operator") is True
            self.retried[run_id] += 1
            event("an operator retried a run")

    @rule(data=st.data())
    def signal(self, data: st.DataObject) -> None:
        candidates = runs()  # none, once every run was pruned
        if candidates:
            run = data.draw(st.sampled_from(candidates), label="run")
            tasks_engine.signal(run.id, FACT, FACT_PAYLOAD)

    @rule(seconds=st.sampled_from([DEFERRED_MAX_AGE + 0.1, 5.0, 11.0, LEASE_SECONDS + 1]))
    def advance_clock(self, seconds: float) -> None:
        self.env.clock.advance(seconds)

    @rule()
    def wake_next_timer(self) -> None:
        due = next_due(("pending", "waiting"))
        if due is not None:
            self.env.clock.jump_to(due)

    @rule()
    def reap(self) -> None:
        """One round of the leader's dead-worker service (`transitions.reap_dead_workers`): the
        runs of every worker whose row beat more than DEAD_WORKER_SECONDS ago (on the fake
        clock) become claimable at once, and the rows go; the others' runs and rows stay."""
        dead_after = engine_settings().dead_worker_seconds
        ages = self._age()
        rows = set(WorkerRow.objects.values_list("id", flat=True))
        running = WorkflowRun.objects.filter(status="running")
        before = {r[0]: r[1:] for r in running.values_list("id", "worker_id", "available_at")}
        transitions.reap_dead_workers()
        now = self.env.clock.now()
        reaped = rows - set(WorkerRow.objects.values_list("id", flat=True))
        after = dict(
            WorkflowRun.objects.filter(pk__in=list(before)).values_list("id", "available_at")
        )
        problems = [
            f"worker {w}: beat {ages[w]:.1f} s ago, {'reaped' if w in reaped else 'kept'}"
            for w in rows
            if w in ages
            # A second's slack either side: the database clock moves on while this runs.
            if (w in reaped and ages[w] < dead_after - 1)
            or (w not in reaped and ages[w] > dead_after + 1)
        ]
        for run_id, (worker_id, available_at) in before.items():
            later = after.get(run_id)
            if worker_id in reaped:
                if later is None or later > now:
                    problems.append(
                        f"run {run_id}: its worker {worker_id} was reaped, the run is not "
                        f"claimable until {later} (now {now})"
                    )
                else:
                    self.released.add(run_id)
            elif later != available_at:
                problems.append(
                    f"run {run_id}: its worker {worker_id} is alive, a reap moved its lease "
                    f"from {available_at} to {later}"
                )
        self._report("reap", problems)
        for w in reaped:
            self.beats.pop(w, None)
        STATS["workers reaped"] += len(reaped)
        STATS["runs a reap released"] += sum(1 for r, (w, _) in before.items() if w in reaped)
        if reaped:
            event("the leader reaped a worker")

    @rule(w=WORKER)
    def stall(self, w: int) -> None:
        """Worker w stalls (a long pause: its threads stop, its process lives) for longer than
        DEAD_WORKER_SECONDS while the others' heartbeats run, and the leader reaps it. Its
        attempts and heartbeat go on afterwards (the stale-lease invariant holds them), and
        its next beat brings its row back."""
        self.env.clock.advance(engine_settings().dead_worker_seconds + 1)
        for other in range(WORKERS):
            if other != w:
                self.heartbeat(other)
        self.reap()

    @rule(batch=st.sampled_from([1, PRUNE_BATCH]), max_batches=st.sampled_from([1, None]))
    def prune(self, batch: int, max_batches: int | None) -> None:
        """One round of the leader's retention service (`retention.prune_expired`, with
        RETENTION_DAYS short enough for this fake clock). It deletes finished runs only, and
        never a finished child whose parent is unfinished (the parent reads it when it
        resumes) nor a finished parent with an unfinished child."""
        self._prune(batch, max_batches)

    def _prune(self, batch: int, max_batches: int | None) -> None:
        before = read_state()
        done = list(OpLedger.objects.filter(status="done").values_list("op_key", "run_id"))
        retention.prune_expired(batch=batch, max_batches=max_batches)
        after = read_state()
        pruned = [run for run_id, run in before.runs.items() if run_id not in after.runs]
        # An op's result goes with its run: a later run with the same op key runs it again.
        self.ledger_pruned.update(k for k, r in done if r in before.runs and r not in after.runs)
        problems = []
        for run in pruned:
            parent = before.runs.get(run.parent_run_id) if run.parent_run_id else None
            if run.status not in FINISHED:
                problems.append(f"{run.label}: pruned, it was not finished")
            if parent is not None and parent.status not in FINISHED:
                problems.append(f"{run.label}: pruned, its parent {parent.label} is not")
            for child in before.children(run.id):
                if child.status not in FINISHED:
                    problems.append(f"{run.label}: pruned, its child {child.label} is not")
            # What quiescence would have checked of it, had it stayed.
            problems += check_completed_steps(run, before)
        self._report("prune", problems)
        for run in before.runs.values():  # the windows the prune rules are about
            parent = before.runs.get(run.parent_run_id) if run.parent_run_id else None
            if parent is not None and (run.status in FINISHED) != (parent.status in FINISHED):
                STATS[
                    f"prunes over a {'child' if run.status in FINISHED else 'parent'} "
                    "finished before its family"
                ] += 1
        for run in pruned:
            self.pruned[run.id] = run
        self.completed_steps.forget(self.pruned)
        STATS["runs pruned"] += len(pruned)
        if pruned:
            event("the retention service pruned a run")

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def engine_state_is_consistent(self) -> None:
        state = read_state()
        # A run leaves the tables only through the retention service (the prune rule).
        vanished = self.known_runs - state.runs.keys() - self.pruned.keys()
        self._report("runs-kept", [f"run {r}: gone, and nothing pruned it" for r in vanished])
        self.known_runs |= state.runs.keys()
        for check in dict.fromkeys(c for c, _ in self.log.violations):
            self._report(check, [m for c, m in self.log.violations if c == check])
        self._report("attempts-match-runs", check_attempts(state))
        self._report("cancel-reaches-children", check_cancels(state))
        self._report(
            "cancel-answer", check_cancel_promises(state, self.cancel_promised, self.retried)
        )
        self._report("no-step-after-cancel", check_steps_after_cancel(state))
        self._report("no-lost-wakeup", check_waits(state))
        self._report("flow-limits", check_flow_limits())
        self._report("queueing-key", check_queueing_keys())
        self._report("debounce", check_debounce_windows())
        self._report("rate-key", check_rate_claims(self.rate_claims, RATE_COUNT, RATE_WINDOW))
        self._report("completed-steps-stable", self.completed_steps.check(state))
        self._report("run-outcomes", check_outcomes(state, self.disrupted, self.pruned))
        self._report("timed-body-not-completed", check_timed_bodies(state, self.log))
        self._report("atomic-write-with-checkpoint", check_atomic_writes(state, self.log))
        self._report("step-timeout-retries", check_step_timeouts(state))
        self._report("deadline", check_deadlines(state))
        # A body meant to run once runs once more per interruption, and per operator retry of
        # a run it failed (its failed step runs again).
        reruns = self.disrupted + self.outages + self.retried
        self._report("side-effects", check_log(state, self.log, reruns, self.ledger_pruned))

    def teardown(self) -> None:
        try:
            if not self.broken:
                self._quiesce()
                self.engine_state_is_consistent()
                state = read_state()
                self._report("quiescence", check_quiescent(state))
                self._record_events(state)
        finally:
            for attempt in self._live():
                with contextlib.suppress(harness.SimHang):
                    attempt.kill()

    # -- helpers ------------------------------------------------------------------------------

    def to_body(self, attempt: Attempt) -> None:
        self._step(attempt)
        for _ in range(MAX_STOPS_TO_BODY):
            if attempt.done or attempt.in_body:
                break
            self._step(attempt)

    def _live(self) -> list[Attempt]:
        return [a for a in self.attempts if not a.done]

    def _beat(self, worker: SimWorker) -> None:
        worker.registration.beat()
        self.beats[worker.id] = self.env.clock.now()

    def _age(self) -> dict[str, float]:
        """Age every worker row as the fake clock says (beats are stamped with the database's
        clock, not the fake one): its last beat is as long before the database's now as it
        is before the fake clock's. Returns the ages, in seconds, of the rows there are."""
        now, db_now = self.env.clock.now(), db_clock()
        ages = {}
        for worker_id in WorkerRow.objects.values_list("id", flat=True):
            if worker_id not in self.beats:  # not a simulated worker's: left as it is
                continue
            age = (now - self.beats[worker_id]).total_seconds()
            WorkerRow.objects.filter(pk=worker_id).update(
                last_heartbeat=db_now - timedelta(seconds=age)
            )
            ages[worker_id] = age
        return ages

    def _claim(self, worker: SimWorker) -> bool:
        held = tuple(a.run_id for a in worker.live())  # as worker/loop.py passes its slots' runs
        # The rate key's runs that a claim now would start (not retake: a reclaim of an
        # expired lease is not counted), to record the claims of them it makes.
        startable = set(
            WorkflowRun.objects.filter(
                rate_key=RATE_KEY, status__in=["pending", "waiting"]
            ).values_list("pk", flat=True)
        )
        claimed = transitions.claim_runs(
            worker.id, self.env.pairs, worker.queues, 1, LEASE_SECONDS, held
        )
        for item in claimed:
            run_id = item.lease.run_id
            if run_id in startable:
                STATS["claims of a rate key's runs"] += 1
                self.rate_claims.append(self.env.clock.now().timestamp())
            if run_id in self.released:
                self.released.discard(run_id)
                STATS["runs retaken after a reap"] += 1
            if any(a.run_id == run_id for a in self._live()):
                self.disrupted[run_id] += 1  # a live attempt lost its lease to this claim
            attempt = Attempt(len(self.attempts) + 1, worker.id, item, worker.draining)
            self.attempts.append(attempt)
            worker.attempts.append(attempt)
            self.env.pool.start(attempt)
            self._ended(attempt)
        return bool(claimed)

    @staticmethod
    def _reclaimed_by(attempt: Attempt, held: list[Attempt]) -> bool:
        """Whether another attempt of the same worker holds the same run."""
        return any(a.run_id == attempt.run_id and a is not attempt for a in held)

    def _stale(self, attempt: Attempt) -> bool:
        token = (
            WorkflowRun.objects.filter(pk=attempt.run_id)
            .values_list("lease_token", flat=True)
            .first()
        )
        return token != attempt.token

    def _step(self, attempt: Attempt) -> None:
        if not attempt.done:
            self._on_behalf(attempt, attempt.step)
            self._ended(attempt)

    def _on_behalf(self, attempt: Attempt, action: Callable[[], Any]) -> None:
        """Let `attempt` (or its worker, for it) act; if its lease is stale, nothing may change."""
        before = snapshot() if self._stale(attempt) else None
        with contextlib.suppress(LeaseLostError):
            action()
        if before is not None and (changed := diff(before, snapshot())):
            message = f"{attempt!r} wrote with a lost lease:\n{changed}"
            self.log.violations.append(("stale-lease-wrote", message))

    def _ended(self, attempt: Attempt) -> None:
        """An attempt that ended must have ended as a worker slot expects."""
        if not attempt.done or attempt.seq in self.ended:
            return
        self.ended.add(attempt.seq)
        if attempt.outcome == "crashed":
            message = f"{attempt!r} raised {attempt.error!r}\n{attempt.trace}"
            self.log.violations.append(("attempt", message))
        elif attempt.outcome == "outage":
            self.outages[attempt.run_id] += 1
            if not attempt.injected:
                message = f"{attempt!r}: a database error nobody injected: {attempt.error!r}"
                self.log.violations.append(("attempt", message))
            # What worker/loop.py's slot does after an outage: back off, hand the run back
            # (the interrupted attempt not counted) so that it is replayed at once.
            now = self.env.clock.now()
            self._on_behalf(attempt, functools.partial(transitions.requeue_run, attempt.lease, now))

    def _may_cancel(self, run: RunInfo) -> bool:
        if run.status != "running":
            return True
        if run.task_name in PARKING_TASKS and known("cancel-lost-when-parking"):
            return False
        return not (run.task_name in PARENT_TASKS and known("child-outlives-canceled-parent"))

    def _quiesce(self) -> None:
        drainer = SimWorker(WORKERS)  # a worker that never fails
        finished = 0
        for _ in range(DRAIN_LIMIT):
            if self.prune_while_draining:
                # A retention round each time a run finishes: a child that completes before
                # its parent resumes, a parent canceled before its child ends, go by a prune.
                now_finished = WorkflowRun.objects.filter(status__in=FINISHED).count()
                if now_finished > finished:
                    self._prune(PRUNE_BATCH, None)
                finished = now_finished
            if self.cancel_while_draining and (parents := self._parents_of_running_children()):
                # Once: an operator cancels a parent whose child runs, and a retention round
                # follows at once (what the cancel_parent rule does, reached far more often).
                self.cancel_while_draining = False
                if tasks_engine.cancel(parents[0]):
                    self.cancel_promised[parents[0]] = self.retried[parents[0]]
                self._prune(PRUNE_BATCH, None)
            live = self._live()
            if live:
                self._step(live[0])
            elif not self._claim(drainer) and not self._signal_fact_waiters():
                # Nothing claimable now; a due run may still be held back (its key is full,
                # its place held by a crashed worker's run): wait for the next thing that comes
                # due, such as that lease's expiry.
                due = next_due(("pending", "waiting", "running"), after=self.env.clock.current)
                # Or a due run its rate key holds back: when the key's window frees a place.
                frees = testing.rate_window_frees(self.env.pairs)
                if frees is not None and (due is None or frees < due):
                    due = frees
                if due is None:
                    return
                self.env.clock.jump_to(due)
        self._report("quiescence", [f"still moving after {DRAIN_LIMIT} drain steps"])

    def _signal_fact_waiters(self) -> bool:
        waiting = WorkflowRun.objects.filter(status="waiting", waiting_on=f"fact:{FACT}")
        delivered = False
        for run_id in waiting.order_by("created_at").values_list("id", flat=True):
            delivered |= tasks_engine.signal(run_id, FACT, FACT_PAYLOAD).delivered
        return delivered

    def _record_events(self, state: Any) -> None:
        """What the example did: hypothesis events, and STATS for the test's summary."""
        STATS["examples"] += 1
        STATS["attempts"] += len(self.attempts)
        STATS["operator retries"] += sum(self.retried.values())
        for outcome in sorted({a.outcome for a in self.attempts}):
            event(f"an attempt ended {outcome}")
        STATS.update(f"attempt {a.outcome}" for a in self.attempts)
        STATS.update(f"{run.task_name} {run.status}" for run in state.runs.values())
        # The windows the step-timeout and deadline invariants are about.
        late = [b for b in self.log.bodies if b.outlived_timeout()]
        STATS["timed bodies that outlived their timeout"] += len(late)
        if late:
            event("a timed step body outlived its timeout")
        STATS.update(
            f"sim-timed returned {run.output}"
            for run in state.runs.values()
            if run.task_name == "sim-timed" and run.status == "completed"
        )
        for run in state.runs.values():
            if run.deadline_at is not None and run.finished_at is not None:
                when = "after" if run.finished_at >= run.deadline_at else "before"
                STATS[f"runs with a deadline that ended {run.status} {when} it"] += 1

    def _report(self, check: str, problems: list[str]) -> None:
        if problems:
            self.broken = True
            raise violation(check)("\n".join(problems) + "\n\n" + self._describe())

    def _describe(self) -> str:
        state = read_state()
        lines = ["runs:"]
        for run in state.runs.values():
            lines.append(
                f"  {run.label} waiting_on={run.waiting_on!r} parent="
                f"{str(run.parent_run_id)[:8]} cancel={run.cancel_requested_at} "
                f"output={run.output!r} error={(run.error or {}).get('type')}"
            )
            for s in state.steps_of(run.id):
                lines.append(f"    {s.kind} {s.name!r} {s.status} output={s.output!r}")
        lines.append("attempts:")
        lines += [f"  {a!r}" for a in self.attempts]
        return "\n".join(lines)
