"""Run and step statuses, and the table of every run transition with its cause.

`transitions/` implements each edge; `tests/test_states.py` checks that the two agree.
"""

from __future__ import annotations

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

# (from, to) -> (cause, the functions in transitions/ that perform it, comma-separated)
TRANSITIONS: dict[tuple[RunStatus, RunStatus], tuple[str, str]] = {
    (RunStatus.PENDING, RunStatus.RUNNING): ("claimed by a worker", "claim_runs"),
    (RunStatus.RUNNING, RunStatus.RUNNING): ("lease expired, reclaimed", "claim_runs"),
    (RunStatus.RUNNING, RunStatus.COMPLETED): ("handler returned", "complete_run"),
    (RunStatus.RUNNING, RunStatus.FAILED): ("handler raised, no retries left", "fail_run"),
    (RunStatus.RUNNING, RunStatus.PENDING): (
        "step or workflow retry backoff, or handed back (shutdown, outage, busy op)",
        "requeue_run",
    ),
    (RunStatus.RUNNING, RunStatus.WAITING): ("sleep, fact wait or child wait", "park_run"),
    (RunStatus.RUNNING, RunStatus.CANCELED): ("cancel reached the worker", "cancel_running_run"),
    (RunStatus.WAITING, RunStatus.RUNNING): ("timer due (sleep, timeout, deadline)", "claim_runs"),
    (RunStatus.WAITING, RunStatus.PENDING): (
        "fact signalled, or child finished",
        "wake_run, wake_parent",
    ),
    (RunStatus.PENDING, RunStatus.CANCELED): ("canceled before it ran", "cancel_idle_run"),
    (RunStatus.WAITING, RunStatus.CANCELED): ("canceled while waiting", "cancel_idle_run"),
    (RunStatus.FAILED, RunStatus.PENDING): ("retried by an operator (retry_run)", "retry_run"),
    (RunStatus.CANCELED, RunStatus.PENDING): ("retried by an operator (retry_run)", "retry_run"),
}


def mermaid() -> str:
    """The run state machine as a mermaid flowchart, edges labelled with their causes."""
    lines = ["flowchart LR", "    start(( )) -- enqueue --> pending"]
    for (src, dst), (cause, fn) in TRANSITIONS.items():
        lines.append(f'    {src} -- "{cause} ({fn})" --> {dst}')
    return "\n".join(lines) + "\n"
