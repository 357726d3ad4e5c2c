"""What must hold of the engine's tables: after every rule, and once the simulation is driven
to quiescence. Each check returns the violations it found, as sentences naming the run."""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Count, Max

from tasks_engine.models import QUEUED, Fact, OpLedger, StepAttempt, Worker, WorkflowRun
from tasks_engine.states import ACTIVE, FINISHED
from tests.testapp.models import Marker

from .defects import known
from .harness import SimLog, business_key
from .workflows import EXPECT, NARROW_LIMIT, NARROW_QUEUE, TIMED_RETRY, TIMEOUT_SECONDS

WORK_KINDS = ("function", "op")


@dataclass(frozen=True)
class RunRow:
    id: uuid.UUID
    task_name: str
    status: str
    parent_run_id: uuid.UUID | None
    waiting_on: str
    cancel_requested_at: datetime | None
    output: Any
    error: Any
    created_at: datetime
    deadline_at: datetime | None
    finished_at: datetime | None

    @property
    def label(self) -> str:
        return f"run {str(self.id)[:8]} ({self.task_name}, {self.status})"


@dataclass(frozen=True)
class StepRow:
    id: int
    run_id: uuid.UUID
    name: str
    kind: str
    status: str
    output: Any
    started_at: datetime
    attempt: int
    run_pass: int
    counted: bool
    error: Any
    finished_at: datetime | None

    @property
    def error_type(self) -> str:
        return str((self.error or {}).get("type", ""))


@dataclass(frozen=True)
class FactRow:
    run_id: uuid.UUID
    name: str
    consumed_by: str


@dataclass
class DbState:
    runs: dict[uuid.UUID, RunRow]  # in creation order
    steps: list[StepRow]
    facts: list[FactRow]
    _children: dict[uuid.UUID, list[RunRow]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for run in self.runs.values():
            if run.parent_run_id is not None:
                self._children.setdefault(run.parent_run_id, []).append(run)

    def children(self, run_id: uuid.UUID) -> list[RunRow]:
        return self._children.get(run_id, [])

    def steps_of(self, run_id: uuid.UUID) -> list[StepRow]:
        return [s for s in self.steps if s.run_id == run_id]


def read_state() -> DbState:
    runs = WorkflowRun.objects.order_by("created_at").values_list(
        "id",
        "task_name",
        "status",
        "parent_run_id",
        "waiting_on",
        "cancel_requested_at",
        "output",
        "error",
        "created_at",
        "deadline_at",
        "finished_at",
    )
    steps = StepAttempt.objects.order_by("id").values_list(
        "id",
        "run_id",
        "name",
        "kind",
        "status",
        "output",
        "started_at",
        "attempt",
        "run_pass",
        "counted",
        "error",
        "finished_at",
    )
    facts = Fact.objects.order_by("id").values_list("run_id", "name", "consumed_by")
    return DbState(
        {row[0]: RunRow(*row) for row in runs},
        [StepRow(*row) for row in steps],
        [FactRow(*row) for row in facts],
    )


def snapshot() -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the engine's tables: what a write by a stale lease would change."""
    return {
        model.__name__: list(model.objects.order_by("pk").values_list())
        for model in (WorkflowRun, StepAttempt, Fact, OpLedger)
    }


def diff(before: dict[str, list[tuple[Any, ...]]], after: dict[str, list[tuple[Any, ...]]]):
    lines = []
    for table, rows in after.items():
        gone = [r for r in before[table] if r not in rows]
        new = [r for r in rows if r not in before[table]]
        lines += [f"  {table} was: {r}" for r in gone] + [f"  {table} now: {r}" for r in new]
    return "\n".join(lines)


def reset_tables() -> None:
    with connection.cursor() as cur:
        for model in (OpLedger, Fact, StepAttempt, WorkflowRun, Worker, Marker):
            cur.execute(f"DELETE FROM {model._meta.db_table}")


# -- after every rule -------------------------------------------------------------------------


def check_attempts(state: DbState) -> list[str]:
    """No attempt runs for a run that does not (armed waits stay running while it waits),
    and a finished run has no open attempt."""
    out = []
    for s in state.steps:
        if s.status != "running":
            continue
        run = state.runs[s.run_id]
        if s.kind in WORK_KINDS and run.status != "running":
            out.append(f"{run.label}: {s.kind} step {s.name!r} is still running")
        elif run.status not in ACTIVE:
            out.append(f"{run.label}: armed {s.kind} step {s.name!r} is still running")
    return out


def check_waits(state: DbState) -> list[str]:
    """A waiting run waits on an armed wait that nothing has satisfied yet: no fact, child
    result or cancel that committed is lost."""
    out = []
    for run in state.runs.values():
        if run.status != "waiting":
            continue
        kind, _, what = run.waiting_on.partition(":")
        armed = [s for s in state.steps_of(run.id) if s.status == "running"]
        if run.cancel_requested_at is not None:
            out.append(f"{run.label}: waits on {run.waiting_on!r} with its cancel requested")
        if kind == "fact" and any(
            f.run_id == run.id and f.name == what and not f.consumed_by for f in state.facts
        ):
            out.append(f"{run.label}: waits on fact {what!r} that was signalled (lost wake-up)")
        if kind == "child":
            child = state.runs.get(uuid.UUID(what))
            if child is None or child.parent_run_id != run.id:
                out.append(f"{run.label}: waits on {what}, which is not its child")
            elif child.status in FINISHED:
                out.append(f"{run.label}: waits on its child, which ended {child.status}")
        wanted = {"sleep": "sleep", "fact": "fact_wait", "child": "child"}.get(kind)
        if not any(s.kind == wanted for s in armed):
            out.append(f"{run.label}: waits on {run.waiting_on!r} with no armed {wanted} step")
    return out


def check_cancels(state: DbState) -> list[str]:
    """Canceled runs had a cancel; a cancel reaches every child (including those started
    after it)."""
    out = []
    for run in state.runs.values():
        if run.status == "canceled" and run.cancel_requested_at is None:
            out.append(f"{run.label}: canceled without a cancel request")
        if run.cancel_requested_at is None:
            continue
        for child in state.children(run.id):
            if child.status not in FINISHED and child.cancel_requested_at is None:
                out.append(f"{run.label}: cancel requested, child {child.label} goes on")
    return out


def check_cancel_promises(
    state: DbState, promised: dict[uuid.UUID, int], retried: Counter[uuid.UUID]
) -> list[str]:
    """A run whose cancel() answered True, and that no operator retried since, is not finished
    in any other way than canceled."""
    return [
        f"{state.runs[run_id].label}: cancel answered True, the run ended {status}"
        for run_id, retries in promised.items()
        if run_id in state.runs  # not pruned since
        and retried[run_id] == retries
        and (status := state.runs[run_id].status) in FINISHED
        and status != "canceled"
    ]


def check_flow_limits() -> list[str]:
    """No queue or key ever has more runs `running` than its limit (crashed and stale attempts
    included: their runs keep their places until the run leaves `running`)."""
    narrow = WorkflowRun.objects.filter(status="running", queue=NARROW_QUEUE).count()
    over = [f"queue {NARROW_QUEUE}: {narrow} runs running, its limit is {NARROW_LIMIT}"]
    running = (
        WorkflowRun.objects.filter(status="running", concurrency_key__isnull=False)
        .values("concurrency_key")
        .annotate(n=Count("id"), limit=Max("concurrency_limit"))
    )
    return (over if narrow > NARROW_LIMIT else []) + [
        f"key {r['concurrency_key']!r}: {r['n']} runs running, its limit is {r['limit']}"
        for r in running
        if r["n"] > (r["limit"] or 1)
    ]


def check_queueing_keys() -> list[str]:
    """At most one queued run (pending, never started, not retried by hand) per queueing key."""
    queued = (
        WorkflowRun.objects.filter(queueing_key__isnull=False, **QUEUED)
        .values("queueing_key")
        .annotate(n=Count("id"))
    )
    return [
        f"queueing key {r['queueing_key']!r}: {r['n']} queued runs" for r in queued if r["n"] > 1
    ]


def check_debounce_windows() -> list[str]:
    """At most one queued run per (workflow, debounce key): one window at a time."""
    queued = (
        WorkflowRun.objects.filter(debounce_key__isnull=False, **QUEUED)
        .values("task_name", "debounce_key")
        .annotate(n=Count("id"))
    )
    return [
        f"debounce key {r['debounce_key']!r} of {r['task_name']}: {r['n']} queued runs"
        for r in queued
        if r["n"] > 1
    ]


def check_answered_by_window(run_id: Any, key: str, stored_input: Any) -> list[str]:
    """An enqueue that a debounced run answered: that run is the key's queued one, and holds
    the enqueue's input (the last one's, until the next enqueue or its claim)."""
    run = WorkflowRun.objects.filter(pk=run_id).values("status", "started_at", "input").first()
    if not WorkflowRun.objects.filter(pk=run_id, debounce_key=key, **QUEUED).exists():
        return [f"an enqueue with debounce key {key!r} was answered by run {run_id}: {run}"]
    if run is None or run["input"] != stored_input:
        return [f"debounced run {run_id} holds {run and run['input']}, not {stored_input}"]
    return []


def check_rate_claims(times: list[float], count: int, window: float) -> list[str]:
    """At most `count` claims (the fake clock's seconds) in any window of `window` seconds:
    any count + 1 consecutive claims span at least the window."""
    times = sorted(times)
    return [
        f"rate key: {count + 1} claims within {window} s: {times[i : i + count + 1]}"
        for i in range(len(times) - count)
        if times[i + count] - times[i] < window
    ]


def check_answered_by_queued(run_id: Any, key: str) -> list[str]:
    """An enqueue that a run with its queueing key answered: that run is the key's queued one."""
    if WorkflowRun.objects.filter(pk=run_id, queueing_key=key, **QUEUED).exists():
        return []
    run = WorkflowRun.objects.filter(pk=run_id).values("status", "started_at", "retries").first()
    return [f"an enqueue with queueing key {key!r} was answered by run {run_id}, not queued: {run}"]


def check_steps_after_cancel(state: DbState) -> list[str]:
    """No step, sleep, wait or child starts after the run's cancel committed."""
    out = []
    for run in state.runs.values():
        if run.cancel_requested_at is None:
            continue
        late = [s for s in state.steps_of(run.id) if s.started_at > run.cancel_requested_at]
        out += [f"{run.label}: {s.kind} step {s.name!r} started after its cancel" for s in late]
    return out


def check_outcomes(
    state: DbState, disrupted: Counter[uuid.UUID], pruned: dict[uuid.UUID, RunRow] | None = None
) -> list[str]:
    """Completed runs return what their workflow computes; failed runs failed as it means to
    (`pruned`: the runs the retention service deleted, whose failures may explain a
    parent's)."""
    out = []
    for run in state.runs.values():
        expect = EXPECT.get(run.task_name)
        if expect is None:
            out.append(f"{run.label}: not a simulation workflow")
        elif run.status == "completed":
            if expect.must_fail or run.output not in expect.outputs:
                out.append(f"{run.label}: completed with {run.output!r}")
        elif run.status == "failed":
            why = failure_not_allowed(run, state, disrupted, pruned or {})
            if why:
                out.append(f"{run.label}: {why}")
    return out


def failure_not_allowed(
    run: RunRow,
    state: DbState,
    disrupted: Counter[uuid.UUID],
    pruned: dict[uuid.UUID, RunRow],
) -> str:
    """Why this failure is an engine defect ('' when the workflow's own failure explains it).
    A run may fail as its workflow means to; a step interrupted (crash, lost lease) more times
    than its retry budget allows fails it; a parent fails when its child was canceled."""
    expect = EXPECT[run.task_name]
    error = run.error or {}
    kind, message = str(error.get("type", "")), str(error.get("message", ""))
    if kind in expect.fails_with or (expect.must_fail and not expect.fails_with):
        return ""
    # Its children, those pruned since it failed too (as they were when pruned).
    children = state.children(run.id) + [r for r in pruned.values() if r.parent_run_id == run.id]
    family = [run, *children]
    if kind.endswith(".StepFailedError") and "interrupted" in message:
        if any(disrupted[r.id] for r in family) or known("outage-counts-as-crash"):
            return ""
        return f"failed, interrupted by nothing but database errors: {message}"
    if run.task_name == "sim-parent-retry" and kind.endswith(".ChildFlake"):
        # Its retry started a new child, which flaked because the first one never ran (it
        # was canceled, say): the retry budget is spent. With one child, the retry got the
        # failed child back instead of running it again.
        if len(children) >= 2:
            return ""
        return f"failed with the child's first failure, never rerun: {message}"
    if known("db-error-fails-run") and "simulated database outage" in message:
        return ""
    if kind.endswith(".TaskCanceledError") and any(c.status == "canceled" for c in children):
        return ""
    if kind == DEADLINE and deadline_passed(run):
        return ""
    return f"failed with {kind}: {message}"


DEADLINE = "tasks_engine.exceptions.DeadlineExceededError"
STEP_TIMEOUT = "tasks_engine.exceptions.StepTimeoutError"


def deadline_passed(run: RunRow) -> bool:
    """Whether the run ended at or after its deadline (the engine's test: now >= deadline_at)."""
    return (
        run.deadline_at is not None
        and run.finished_at is not None
        and run.finished_at >= run.deadline_at
    )


def check_deadlines(state: DbState) -> list[str]:
    """DESIGN.md: once `deadline_at` passed, the run fails with DeadlineExceededError. So no run
    ends completed with its completion written (finished_at, the time the engine compares)
    at or after its deadline, and a run failed with DeadlineExceededError only once its
    deadline had passed. (A run whose handler failed on its own after the deadline, before a
    heartbeat or claim noticed it, keeps its own error: `fail_run` records the failure that
    happened, so such a run ends failed, never completed, with that error.)"""
    out = []
    for run in state.runs.values():
        if run.status not in FINISHED or run.deadline_at is None:
            continue
        error = str((run.error or {}).get("type", ""))
        if deadline_passed(run):
            if run.status == "completed":
                out.append(
                    f"{run.label}: completed at {run.finished_at}, its deadline "
                    f"{run.deadline_at} had passed"
                )
        elif run.status == "failed" and error == DEADLINE:
            out.append(
                f"{run.label}: failed with DeadlineExceededError at {run.finished_at}, before "
                f"its deadline {run.deadline_at}"
            )
    return out


def check_timed_bodies(state: DbState, log: SimLog) -> list[str]:
    """A timed step's attempt whose body ran longer than its timeout (by the fake clock, from
    its start until it returned) is never recorded completed: it failed with StepTimeoutError,
    or its lease went."""
    steps = {s.id: s for s in state.steps}
    return [
        f"run {str(b.run_id)[:8]}: step {b.key!r} (attempt id {b.step_id}) ran {ran:g} s,"
        f" its timeout is {timeout:g} s, and it is recorded completed"
        for b in log.bodies
        if (over := b.overrun()) is not None
        and (s := steps.get(b.step_id)) is not None
        and s.status == "completed"
        for ran, timeout in [over]
    ]


def check_atomic_writes(state: DbState, log: SimLog) -> list[str]:
    """An atomic step's business write (a Marker keyed by its attempt) commits with its
    checkpoint or not at all: never for a body that outlived its timeout, never for an
    attempt that is not completed (a pruned run's attempts are gone: not looked at)."""
    keys = set(Marker.objects.filter(key__startswith="sim-step:").values_list("key", flat=True))
    out = [
        f"run {str(b.run_id)[:8]}: atomic step {b.key!r} (attempt id {b.step_id}) ran {ran:g} s"
        f" past a {timeout:g} s timeout, and its business write committed"
        for b in log.bodies
        if (over := b.overrun()) is not None and business_key(b.step_id) in keys
        for ran, timeout in [over]
    ]
    steps = {s.id: s for s in state.steps}
    for key in sorted(keys):
        s = steps.get(int(key.rpartition(":")[2]))
        if s is not None and s.status != "completed":
            out.append(
                f"run {str(s.run_id)[:8]}: atomic step {s.name!r} is {s.status}, its business "
                "write committed"
            )
    return out


def check_step_timeouts(state: DbState) -> list[str]:
    """A step attempt fails with StepTimeoutError only once its timeout passed (finished at
    least TIMEOUT_SECONDS after it started); and sim-timed's step "t" goes as its retry policy
    says: a timed-out attempt is retried while the pass's counted failures (failed, or
    abandoned by a crash) are fewer than TIMED_RETRY.max_attempts, the one that reaches it is
    terminal, and a completed run returned "T" (the StepTimeoutError caught) only after a
    terminal timeout, the body's value only after an attempt completed."""
    out = []
    for s in state.steps:
        if s.status == "failed" and s.error_type == STEP_TIMEOUT:
            took = ((s.finished_at or s.started_at) - s.started_at).total_seconds()
            if took < TIMEOUT_SECONDS:
                out.append(
                    f"run {str(s.run_id)[:8]}: step {s.name!r} failed with StepTimeoutError "
                    f"{took:g} s after it started (timeout {TIMEOUT_SECONDS:g} s)"
                )
    limit = TIMED_RETRY.max_attempts
    for run in state.runs.values():
        if run.task_name != "sim-timed":
            continue
        tries = [s for s in state.steps_of(run.id) if s.name == "t"]
        counted: Counter[int] = Counter()
        for s in tries:
            if s.status == "failed" or (s.status == "abandoned" and s.counted):
                counted[s.run_pass] += 1
            if s.status == "failed" and s.error_type == STEP_TIMEOUT:
                terminal = bool((s.error or {}).get("terminal"))
                if terminal != (counted[s.run_pass] >= limit):
                    out.append(
                        f"{run.label}: timed-out attempt {s.attempt} of step 't' is "
                        f"{'terminal' if terminal else 'retried'} after "
                        f"{counted[s.run_pass]} counted failures (max_attempts {limit})"
                    )
        if run.status != "completed":
            continue
        last = tries[-1] if tries else None
        timed_out = (
            last is not None
            and last.status == "failed"
            and last.error_type == STEP_TIMEOUT
            and bool((last.error or {}).get("terminal"))
        )
        if run.output == "aTb" and not timed_out:
            out.append(f"{run.label}: returned 'aTb', its step 't' ended {last}")
        if run.output == "atb" and not any(s.status == "completed" for s in tries):
            out.append(f"{run.label}: returned 'atb', no attempt of its step 't' completed")
    return out


class CompletedSteps:
    """A completed step attempt stays completed, with the same output."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[uuid.UUID, str, Any]] = {}

    def forget(self, runs: Any) -> None:
        """The steps of `runs` (pruned) are gone with their runs."""
        self.seen = {sid: seen for sid, seen in self.seen.items() if seen[0] not in runs}

    def check(self, state: DbState) -> list[str]:
        now = {s.id: s for s in state.steps}
        out = []
        for sid, (run_id, name, output) in self.seen.items():
            s = now.get(sid)
            if s is None or s.status != "completed" or s.output != output:
                out.append(f"run {str(run_id)[:8]}: completed step {name!r} changed to {s}")
        for s in state.steps:
            if s.status == "completed":
                self.seen.setdefault(s.id, (s.run_id, s.name, s.output))
        return out


def check_log(
    state: DbState,
    log: SimLog,
    interrupted: Counter[uuid.UUID],
    forgotten: Counter[str] | None = None,
) -> list[str]:
    """Op commits happen once per op key, or once more for each result of it the retention
    service pruned (`forgotten`: a pruned run's ledger rows go with it, DESIGN.md's
    retention); bodies meant to run once ran once, or once more for each time their run was
    interrupted (a crash, a lost lease, a database error)."""
    out = []
    forgotten = forgotten or Counter()
    for op_key, n in Counter(key for key, _, _ in log.commits).items():
        if n > 1 + forgotten[op_key]:
            out.append(
                f"op {op_key!r} committed its business write {n} times, its result was "
                f"pruned {forgotten[op_key]} times"
            )
    for run in state.runs.values():
        for key in EXPECT[run.task_name].run_once:
            n = log.count(run.id, key)
            if n > 1 + interrupted[run.id]:
                out.append(
                    f"{run.label}: step body {key!r} ran {n} times, its run was interrupted "
                    f"{interrupted[run.id]} times"
                )
    return out


# -- at quiescence ----------------------------------------------------------------------------


def check_quiescent(state: DbState) -> list[str]:
    """Driven to quiescence (every wait satisfied, every timer passed), every run finished,
    and every completed run completed each of its steps exactly once."""
    out = []
    for run in state.runs.values():
        if run.status not in FINISHED:
            out.append(f"{run.label}: did not finish (waiting_on={run.waiting_on!r})")
        out += check_completed_steps(run, state)
    return out


def check_completed_steps(run: RunRow, state: DbState) -> list[str]:
    """A completed run completed each of its steps exactly once (checked at quiescence, and of
    a run the retention service prunes before that)."""
    if run.status != "completed":
        return []
    completed = Counter(s.name for s in state.steps_of(run.id) if s.status == "completed")
    return [
        f"{run.label}: step {key!r} completed {completed[key]} times"
        for key in EXPECT[run.task_name].steps
        if completed[key] != 1
    ]
