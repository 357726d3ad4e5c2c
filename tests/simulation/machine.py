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
  advance_all     release every live attempt for one stop, round robin
  db_error        the n-th statement an attempt sends from now raises OperationalError,
                  then release it
  crash           worker w dies: its attempts stop where they are and never write again
  heartbeat       worker w renews its leases (`renew_leases`), aborts runs whose lease is gone
                  or whose cancel was requested, sends deferred step completions
  stop_worker     graceful stop: draining, a grace of a few stops, abort, hand back
                  (`requeue_run`), exit
  cancel, signal  `tasks_engine.cancel` / `tasks_engine.signal(run, "go")` on any run
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
    a canceled child: never for an engine error
  - an op's business write commits once per op key; bodies meant to run once ran once
  - no attempt dies of an unexpected exception, nor of a database error nobody injected
  - a worker's heartbeat aborts every attempt of it whose lease is gone; a graceful stop hands
    back every run it still held
  - flow control: no queue or concurrency key ever has more runs `running` than its limit
    (sim-narrow's queue has a concurrency of 1; worker 0 serves it, workers 1 and 2 serve
    `default` alone, with the plain claim until a keyed run is enqueued) (sim-keyed's
    runs share one key of limit 1; the claims are the guarded claim once one is enqueued)
  - a queueing key has at most one queued run (pending, never started, not an operator's
    retry), and an enqueue that a run with the key answered was answered by that queued run
At quiescence (teardown: release every attempt, claim whatever is due, signal every fact
wait, jump over every timer and lease, until nothing moves)
  - every run finished, and every completed run completed each of its steps exactly once
"""

from __future__ import annotations

import contextlib
import functools
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
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
from tasks_engine import first_steps, flow, transitions
from tasks_engine.exceptions import LeaseLostError, TaskCanceledError, WorkerStopping
from tasks_engine.models import WorkflowRun
from tasks_engine.states import FINISHED

from . import harness
from .defects import known
from .harness import Attempt, ThreadPool, TickingClock
from .invariants import (
    CompletedSteps,
    check_answered_by_queued,
    check_attempts,
    check_cancel_promises,
    check_cancels,
    check_flow_limits,
    check_log,
    check_outcomes,
    check_queueing_keys,
    check_quiescent,
    check_steps_after_cancel,
    check_waits,
    diff,
    read_state,
    reset_tables,
    snapshot,
)
from .workflows import FACT, FACT_PAYLOAD, QUEUEING_KEY

LEASE_SECONDS = 30.0
DEFERRED_MAX_AGE = 0.5  # the heartbeat sends deferred completions older than this
WORKERS = 3
CONCURRENCY = 2  # attempts one worker runs at once
MAX_RUNS = 4  # runs an example enqueues (children come on top)
GRACE_STOPS = 2  # stops a stopping worker lets each attempt make before it aborts them
MAX_STOPS_TO_BODY = 50
DRAIN_LIMIT = 5000  # stops, claims and clock jumps the quiescence drain may take

PARKING_TASKS = frozenset({"sim-sleep", "sim-fact", "sim-fact-timeout"})  # besides parents
PARENT_TASKS = frozenset({"sim-parent", "sim-parent-retry"})


@dataclass(frozen=True)
class Shape:
    task: str
    input: dict[str, Any] | None = None
    defect: str | None = None  # the known defect that keeps it out (defects.py)
    queueing_key: str | None = None  # enqueued with it: a queued run of the key answers


SHAPES: dict[str, Shape] = {
    "steps": Shape("sim-steps"),
    "steps-atomic": Shape("sim-steps", {"atomic": True}),
    "steps-abortable": Shape("sim-steps", {"honor_abort": True}),
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
    "narrow": Shape("sim-narrow"),
    "queued": Shape("sim-steps", queueing_key=QUEUEING_KEY),
    # The same key with another input: the queued run answers whatever the input.
    "queued-atomic": Shape("sim-steps", {"atomic": True}, queueing_key=QUEUEING_KEY),
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
    """A simulated worker process: a new id on every (re)start, as a real one has."""

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.generation = 0
        self.draining = threading.Event()
        self.attempts: list[Attempt] = []

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
        self.generation += 1
        self.draining = threading.Event()
        self.attempts = []


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
        flow.forget_keyed()  # and whether keyed runs exist: plain claims until one is enqueued
        self.env.clock.reset()
        self.log = harness.reset_log()
        self.workers = [SimWorker(i) for i in range(WORKERS)]
        self.attempts: list[Attempt] = []
        self.enqueued = 0
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

    @initialize(shapes=st.lists(st.sampled_from(ENABLED_SHAPES), min_size=1, max_size=MAX_RUNS))
    def start(self, shapes: list[str]) -> None:
        for shape in shapes:
            self.enqueue(shape)

    @precondition(lambda self: self.enqueued < MAX_RUNS)
    @rule(shape=st.sampled_from(ENABLED_SHAPES))
    def enqueue(self, shape: str) -> None:
        spec = SHAPES[shape]
        res = tasks_engine.enqueue(spec.task, spec.input, queueing_key=spec.queueing_key)
        self.enqueued += 1
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
        worker.restart()

    @rule(w=WORKER)
    def heartbeat(self, w: int) -> None:
        """What worker/heartbeat.py does each interval: renew every lease the worker holds,
        abort runs whose lease is gone or whose cancel was requested, flush old completions."""
        held = [a for a in self.workers[w].live() if a.ctx is not None and not a.lost]
        if not held:
            return
        renewed = transitions.renew_leases([a.lease for a in held], LEASE_SECONDS)
        for attempt in held:
            assert attempt.ctx is not None
            renewal = renewed.get(attempt.lease.key)
            if renewal is None:
                attempt.lost = True
                attempt.ctx.abort_signal.abort(LeaseLostError(f"run {attempt.run_id}: lost"))
            elif renewal.cancel_requested:
                assert attempt.handle is not None
                attempt.handle.request_cancel()
                attempt.ctx.abort_signal.abort(TaskCanceledError("canceled"))
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
        worker.restart()

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
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
        run = data.draw(st.sampled_from(runs()), label="run")
        tasks_engine.signal(run.id, FACT, FACT_PAYLOAD)

    @rule(seconds=st.sampled_from([DEFERRED_MAX_AGE + 0.1, 5.0, 11.0, LEASE_SECONDS + 1]))
    def advance_clock(self, seconds: float) -> None:
        self.env.clock.advance(seconds)

    @rule()
    def wake_next_timer(self) -> None:
        due = next_due(("pending", "waiting"))
        if due is not None:
            self.env.clock.jump_to(due)

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def engine_state_is_consistent(self) -> None:
        state = read_state()
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
        self._report("completed-steps-stable", self.completed_steps.check(state))
        self._report("run-outcomes", check_outcomes(state, self.disrupted))
        # A body meant to run once runs once more per interruption, and per operator retry of
        # a run it failed (its failed step runs again).
        reruns = self.disrupted + self.outages + self.retried
        self._report("side-effects", check_log(state, self.log, reruns))

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

    def _claim(self, worker: SimWorker) -> bool:
        held = tuple(a.run_id for a in worker.live())  # as worker/loop.py passes its slots' runs
        claimed = transitions.claim_runs(
            worker.id, self.env.pairs, worker.queues, 1, LEASE_SECONDS, held
        )
        for item in claimed:
            run_id = item.lease.run_id
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
        for _ in range(DRAIN_LIMIT):
            live = self._live()
            if live:
                self._step(live[0])
            elif not self._claim(drainer) and not self._signal_fact_waiters():
                # Nothing claimable now; a due run may still be held back (its key is full,
                # its place held by a crashed worker's run): wait for the next thing that comes
                # due, such as that lease's expiry.
                due = next_due(("pending", "waiting", "running"), after=self.env.clock.current)
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
