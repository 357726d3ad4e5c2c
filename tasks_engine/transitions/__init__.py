"""The only writer of run and step state.

Every write an attempt makes is a compare-and-set on its lease token: a statement that matches
no row means the attempt lost its lease, and raises `LeaseLostError`. On PostgreSQL the fence
takes a share lock on the run row, so a concurrent reclaim either waits for the write or makes
it fail; on SQLite each statement runs under the single writer lock.

Modules: `creating` (new runs, one or many in one statement), `claims` (claim, renew), `hot`
(the hot writes: a step's start, the deferred step completion, a run's completion; alone or as
a group, through the attempt's `Writer`), `steps` (attempts), `outcomes` (complete, fail,
requeue, park, cancel, wake; cancels of many runs at once), `waiting` (facts, parking under
the row lock), `retry` (an operator's retry, of one run or a batch), `awaiting` (runs someone
waits on). Everything is re-exported here; callers use `transitions.<name>`.

Lock order: a parent's run row before its child's; a run row before its step attempts.
"""

from ._common import (
    RUN,
    STEP,
    TRANSIENT_ERRORS,
    WORK_KINDS,
    Claimed,
    Completion,
    DeferredCompletion,
    Lease,
    LeaseKey,
    Renewal,
    Writer,
    attempt_write,
    holds,
    outage_guard,
)
from .claims import ClaimRequest, anything_due_before, claim_runs, renew_leases
from .creating import NewRun, create_runs
from .dead_workers import alive, reap_dead_workers
from .hot import DIRECT, HotWrite, write_alone, write_group, write_group_sqlite
from .outcomes import (
    cancel_active,
    cancel_all_active,
    cancel_batch,
    cancel_children,
    cancel_children_of,
    cancel_idle_run,
    cancel_idle_runs,
    cancel_running_run,
    complete_run,
    end_orphaned_cancels,
    fail_run,
    lock_parent,
    lock_parents,
    park_run,
    pend_paused_timers,
    request_cancel,
    request_cancels,
    requeue_run,
    set_progress,
    wake_parent,
    wake_run,
)
from .retry import retry_batch, retry_refusal, retry_run
from .steps import (
    close_interrupted_attempts,
    defer_step_completion,
    drop_prestarted_step,
    finish_step,
    flush_deferred,
    start_step,
)
from .waiting import (
    Parking,
    child_outcome,
    fact_available,
    lock_for_child,
    lock_held_run,
    park_run_unless,
    store_fact,
    take_fact,
    time_out_child,
)

__all__ = [
    "DIRECT",
    "RUN",
    "STEP",
    "TRANSIENT_ERRORS",
    "WORK_KINDS",
    "ClaimRequest",
    "Claimed",
    "Completion",
    "DeferredCompletion",
    "HotWrite",
    "Lease",
    "LeaseKey",
    "NewRun",
    "Parking",
    "Renewal",
    "Writer",
    "alive",
    "anything_due_before",
    "attempt_write",
    "cancel_active",
    "cancel_all_active",
    "cancel_batch",
    "cancel_children",
    "cancel_children_of",
    "cancel_idle_run",
    "cancel_idle_runs",
    "cancel_running_run",
    "child_outcome",
    "claim_runs",
    "close_interrupted_attempts",
    "complete_run",
    "create_runs",
    "defer_step_completion",
    "drop_prestarted_step",
    "end_orphaned_cancels",
    "fact_available",
    "fail_run",
    "finish_step",
    "flush_deferred",
    "holds",
    "lock_for_child",
    "lock_held_run",
    "lock_parent",
    "lock_parents",
    "outage_guard",
    "park_run",
    "park_run_unless",
    "pend_paused_timers",
    "reap_dead_workers",
    "renew_leases",
    "request_cancel",
    "request_cancels",
    "requeue_run",
    "retry_batch",
    "retry_refusal",
    "retry_run",
    "set_progress",
    "start_step",
    "store_fact",
    "take_fact",
    "time_out_child",
    "wake_parent",
    "wake_run",
    "write_alone",
    "write_group",
    "write_group_sqlite",
]
