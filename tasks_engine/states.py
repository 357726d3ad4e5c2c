"""Run and step statuses, and the table of every run transition: its cause, the functions
in `transitions/` that write it, and who calls them; and which pass a run is in.

`tests/engine/transitions/test_states.py` checks that the table and `transitions/` agree.
"""

from __future__ import annotations

from typing import NamedTuple

from django.db import models


class RunStatus(models.TextChoices):
    PENDING = "pending"  # due now, or later after a retry backoff or a deferred start
    RUNNING = "running"  # a worker holds its lease
    WAITING = "waiting"  # on a sleep, a fact or a child run; no worker holds it
    COMPLETED = "completed"  # the handler returned; output stored
    FAILED = "failed"  # the handler raised and the workflow retry budget is spent
    CANCELED = "canceled"  # cancel was requested and took effect


class StepStatus(models.TextChoices):
    RUNNING = "running"  # the attempt started (or a timer/wait is armed)
    COMPLETED = "completed"  # result stored; replay returns it
    FAILED = "failed"  # the body raised; error stored
    ABANDONED = "abandoned"  # closed without an outcome: crash, shutdown or cancel


class StepKind(models.TextChoices):
    FUNCTION = "function"
    SLEEP = "sleep"
    FACT_WAIT = "fact_wait"
    CHILD = "child"
    OP = "op"
    PATCH = "patch"  # ctx.patched(): the marker that this run took a patched code path


ACTIVE = frozenset({RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING})
FINISHED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELED})


class Edge(NamedTuple):
    cause: str
    functions: str  # the functions in transitions/ that write it, comma-separated
    callers: str  # who calls them


START = Edge(
    "enqueue",
    "create_runs",
    "engine.enqueue (callers, run_child, schedules, the django.tasks backend) and"
    " engine.enqueue_many",
)

# (from, to) -> the edge. `tests/engine/transitions/test_states.py` reads transitions/ to check
# that every function writing a run status is here (or a helper of one that is), and the reverse.
TRANSITIONS: dict[tuple[RunStatus, RunStatus], Edge] = {
    (RunStatus.PENDING, RunStatus.RUNNING): Edge(
        "claimed by a worker", "claim_runs", "a worker's main loop, or its group commit"
    ),
    (RunStatus.RUNNING, RunStatus.RUNNING): Edge(
        "lease expired, reclaimed",
        "claim_runs",
        "another worker's claim (the replay closes the old attempt abandoned)",
    ),
    (RunStatus.RUNNING, RunStatus.COMPLETED): Edge(
        "handler returned", "complete_run", "the executor (on PostgreSQL via the group commit)"
    ),
    (RunStatus.RUNNING, RunStatus.FAILED): Edge(
        "handler raised, no retries left; or returned past its deadline",
        "fail_run",
        "the executor; complete_run when the handler returned past the run's deadline; the"
        " heartbeat when a step ignores its deadline's abort",
    ),
    (RunStatus.RUNNING, RunStatus.PENDING): Edge(
        "step or workflow retry backoff, or handed back (shutdown, outage, busy op)",
        "requeue_run",
        "the executor and its steps; the worker's slot after an outage; the heartbeat when a"
        " step ignores its timeout",
    ),
    (RunStatus.RUNNING, RunStatus.WAITING): Edge(
        "sleep, fact wait or child wait",
        "park_run",
        "the steps sleep, wait_for_fact and run_child (park_run_unless)",
    ),
    (RunStatus.RUNNING, RunStatus.CANCELED): Edge(
        "cancel reached the worker, or committed as the handler returned, or no live worker"
        " holds the run",
        "cancel_running_run, complete_run, fail_run, cancel_idle_run",
        "the executor; the heartbeat when a step ignores its cancel; the completion's or the"
        " failure's write when a cancel committed before it (the run ends canceled, without"
        " its output, with its error); engine.cancel of a run whose holder is dead or reaped"
        " with its lease expired (cancel_active), and the leader's orphaned-cancels service for"
        " a cancel its holder received before it died (end_orphaned_cancels)",
    ),
    (RunStatus.WAITING, RunStatus.RUNNING): Edge(
        "timer due (sleep, timeout, deadline)", "claim_runs", "a worker's claim"
    ),
    (RunStatus.WAITING, RunStatus.PENDING): Edge(
        "fact signalled, or child finished; or timer due in a paused queue",
        "wake_run, wake_parent, pend_paused_timers",
        "engine.signal (wake_run); a child's end in complete_run, fail_run,"
        " cancel_running_run or cancel_idle_run (wake_parent); the leader's paused-queues"
        " service (pend_paused_timers: the run waits as pending until the queue is resumed)",
    ),
    (RunStatus.PENDING, RunStatus.CANCELED): Edge(
        "canceled before it ran",
        "cancel_idle_run",
        "engine.cancel, or its parent ending failed or canceled (cancel_active)",
    ),
    (RunStatus.WAITING, RunStatus.CANCELED): Edge(
        "canceled while waiting",
        "cancel_idle_run",
        "engine.cancel, or its parent ending failed or canceled (cancel_active)",
    ),
    (RunStatus.FAILED, RunStatus.PENDING): Edge(
        "retried by an operator", "retry_run", "engine.retry_run (the admin, tasks retry)"
    ),
    (RunStatus.CANCELED, RunStatus.PENDING): Edge(
        "retried by an operator", "retry_run", "engine.retry_run (the admin, tasks retry)"
    ),
}


def mermaid() -> str:
    """The run state machine as a mermaid flowchart, edges labelled with their causes."""
    lines = ["flowchart LR", f"    start(( )) -- {START.cause} --> pending"]
    for (src, dst), edge in TRANSITIONS.items():
        lines.append(f'    {src} -- "{edge.cause} ({edge.functions})" --> {dst}')
    return "\n".join(lines) + "\n"


def leaving_table() -> str:
    """Who moves a run out of each state, as a markdown table (docs/state_machine.md)."""
    lines = ["| state | to | cause | written by | called by |", "|---|---|---|---|---|"]
    for status in RunStatus:
        for (src, dst), edge in TRANSITIONS.items():
            if src == status:
                functions = ", ".join(f"`{f}`" for f in edge.functions.split(", "))
                lines.append(f"| `{src}` | `{dst}` | {edge.cause} | {functions} | {edge.callers} |")
    return "\n".join(lines) + "\n"


def current_pass(failures: int, pass_offset: int) -> int:
    """The number of the pass a run's next claim executes: its workflow retries so far
    (`failures`) on top of the passes before the last operator retry (`pass_offset`, which
    `retry_run` sets when it resets `failures`). The worker and `replay-check` both read a
    history in this pass, so a terminal error of an earlier pass is not raised again."""
    return failures + pass_offset + 1
