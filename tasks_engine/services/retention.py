"""Pruning finished runs (and whatever other apps register, such as dispatched outbox events):
by hand (`prune`, `tasks prune --older-than`) and as the leader's retention service
(`prune_expired`, per status from TASKS_ENGINE["RETENTION_DAYS"]).

In batches, each its own short transaction: on SQLite every engine write waits for the one
write lock, and a single delete of a month of runs would hold it long enough for other
workers' leases to lapse (on PostgreSQL it would hold its row locks and bloat one transaction).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Exists, OuterRef

from .. import clock
from ..conf import engine_settings
from ..db.alias import atomic, connection
from ..db.sql import p_uuid, placeholders
from ..models import Fact, OpLedger, StepAttempt, WorkflowRun
from ..states import ACTIVE, FINISHED
from ..transitions.flow_rate_claims import prune_idle_keys

PRUNE_BATCH = 500  # runs per transaction, with their steps, facts and ledger rows
RUN = WorkflowRun._meta.db_table


def prune(older_than: timedelta, *, batch: int = PRUNE_BATCH) -> dict[str, int]:
    """Delete finished runs that finished before now - `older_than`, with their step attempts,
    facts and op-ledger rows, `batch` runs per transaction; then other apps' rows (dispatched
    outbox events) older than the same cutoff. Returns how many rows of each kind went."""
    cutoff = clock.now() - older_than
    counts = _prune_runs([(sorted(FINISHED), cutoff)], batch)
    for name, pruner in PRUNERS.items():
        counts[name] = pruner.prune(cutoff, batch, None)
    return counts


def prune_expired(*, batch: int = PRUNE_BATCH, max_batches: int | None = None) -> dict[str, int]:
    """The retention service (one leader round, and `tasks prune` without --older-than): delete
    finished runs older than TASKS_ENGINE["RETENTION_DAYS"] for their status (None keeps
    them), with their rows, and other apps' rows past their own retention. With `max_batches`
    a round stops after that many batches of runs per status, and of each other app's rows;
    the next round goes on."""
    now = clock.now()
    cutoffs = [
        ([status], now - timedelta(days=days))
        for status, days in engine_settings().retention_days
        if days is not None
    ]
    counts = _prune_runs(cutoffs, batch, max_batches)
    for name, pruner in PRUNERS.items():
        keep = pruner.retention() if pruner.retention is not None else None
        counts[name] = pruner.prune(now - keep, batch, max_batches) if keep is not None else 0
    return counts


def _prune_runs(
    cutoffs: list[tuple[list[str], datetime]], batch: int, max_batches: int | None = None
) -> dict[str, int]:
    """Runs in `statuses` that finished before their `cutoff`, batch by batch."""
    counts = {"runs": 0, "steps": 0, "facts": 0, "ledger": 0}
    for statuses, cutoff in cutoffs:
        batches = 0
        while max_batches is None or batches < max_batches:
            deleted = _prune_batch(statuses, cutoff, batch)
            batches += 1
            for key, n in deleted.items():
                counts[key] += n
            if deleted["runs"] < batch:
                break
    return counts


# Other apps' rows that expire too (the outbox registers its dispatched events in its
# ready()): the engine does not know its consumers.
@dataclass(frozen=True)
class Pruner:
    prune: Callable[[datetime, int, int | None], int]
    retention: Callable[[], timedelta | None] | None = None


PRUNERS: dict[str, Pruner] = {}


def register_pruner(
    name: str,
    prune: Callable[[datetime, int, int | None], int],
    *,
    retention: Callable[[], timedelta | None] | None = None,
) -> None:
    """`prune(cutoff, batch, max_batches)` deletes that app's rows older than `cutoff`, in
    batches of `batch`, at most `max_batches` of them (None: until none is left; the
    retention service caps a leader round so it stays short), and returns how many; `tasks
    prune` reports the count under `name`. `retention()` says how long the retention service
    keeps them (None, or no `retention`: for ever; `tasks prune --older-than` still prunes
    them)."""
    PRUNERS[name] = Pruner(prune, retention)


def _prune_batch(statuses: list[str], cutoff: datetime, batch: int) -> dict[str, int]:
    with atomic():
        # Oldest first, on the partial index of finished runs. On PostgreSQL a run that is
        # being retried right now (its row is locked) is left for the next prune. A child whose
        # parent is unfinished stays: the parent reads the child's row when it resumes. A
        # parent with an unfinished child (canceled, its child finishing its step) stays too.
        active = sorted(ACTIVE)
        parent_unfinished = WorkflowRun.objects.filter(
            pk=OuterRef("parent_run_id"), status__in=active
        )
        child_unfinished = WorkflowRun.objects.filter(
            parent_run_id=OuterRef("pk"), status__in=active
        )
        ids = list(
            WorkflowRun.objects.filter(status__in=statuses, finished_at__lt=cutoff)
            .exclude(Exists(parent_unfinished))
            .exclude(Exists(child_unfinished))
            .order_by("finished_at")
            .select_for_update(skip_locked=True)
            .values_list("pk", flat=True)[:batch]
        )
        return delete_runs(ids)


def delete_runs(ids: list[Any]) -> dict[str, int]:
    """Delete these runs with their steps, facts and ledger entries (inside the caller's
    transaction); their children keep going without the link. Returns what it deleted."""
    if not ids:
        return {"runs": 0, "steps": 0, "facts": 0, "ledger": 0}
    # The ledger's foreign key is SET NULL (an entry outlives a run deleted by hand): a
    # pruned run's entries go with it, or they would pile up for ever.
    ledger, _ = OpLedger.objects.filter(run_id__in=ids).delete()
    steps, _ = StepAttempt.objects.filter(run_id__in=ids).delete()
    facts, _ = Fact.objects.filter(run_id__in=ids).delete()
    # A child outlives its pruned parent, without the link (the foreign key's SET NULL).
    WorkflowRun.objects.filter(parent_run_id__in=ids).update(parent_run=None)
    # Not QuerySet.delete(): its collector would read every row and redo the work above.
    # Nor sql.execute(): a statement shape per batch size is not worth preparing.
    with connection.cursor() as cur:
        cur.execute(
            f"DELETE FROM {RUN} WHERE id IN ({placeholders(len(ids))})",
            [p_uuid(i) for i in ids],
        )
        runs = cur.rowcount
    return {"runs": runs, "steps": steps, "facts": facts, "ledger": ledger}


# The rate limit keys' claim rows (transitions/flow_rate_claims.py): a key's row goes once its
# newest claim is older than the retention cutoff and than the longest window (an hour).
register_pruner("rate_keys", prune_idle_keys, retention=lambda: timedelta(days=1))
