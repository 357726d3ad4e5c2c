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

from django.db import OperationalError
from django.db.models import BooleanField, Exists, OuterRef, Q
from django.db.models.expressions import RawSQL

from .. import clock
from ..conf import engine_settings
from ..db import partitions
from ..db.alias import atomic, connection
from ..db.partitions import bounds, catalog, periods
from ..db.sql import p_dt, p_uuid, placeholders
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
    counts = _drop_periods([(sorted(FINISHED), cutoff)])
    _add(counts, _prune_runs([(sorted(FINISHED), cutoff)], batch))
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
    counts = _drop_periods(cutoffs)
    _add(counts, _prune_runs(cutoffs, batch, max_batches, _due_periods_only(cutoffs)))
    for name, pruner in PRUNERS.items():
        keep = pruner.retention() if pruner.retention is not None else None
        counts[name] = pruner.prune(now - keep, batch, max_batches) if keep is not None else 0
    return counts


def _due_periods_only(cutoffs: list[tuple[list[str], datetime]]) -> Q | None:
    """On partitioned tables the retention service drops periods whole and deletes no run
    row by row from a period that is not yet entirely past the shortest retention: a run is
    kept until its whole period is (at most one period longer than RETENTION_DAYS), and its
    period then leaves with one DROP instead of a DELETE, its WAL and its vacuum per run
    (bench/retention.py: row by row, a daily retention on week partitions wrote 52x the WAL
    of the drops and left 1.44x the disk). Row by row it still deletes what holds a due
    period back (a run kept longer, a waiting run's finished neighbours) and the DEFAULT
    partition's runs (version 4 ids, periods never made). None: not partitioned."""
    period = partitions.unit()
    if period is None or not cutoffs:
        return None
    newest_cutoff = max(cutoff for _, cutoff in cutoffs)
    due_below = bounds.id_bound(bounds.period_start(newest_cutoff, period))
    default = periods.partition_name(partitions.RUNS.table, periods.DEFAULT)
    in_default = RawSQL("tableoid = to_regclass(%s)", [default], output_field=BooleanField())
    return Q(pk__lt=due_below) | Q(in_default)


def _add(counts: dict[str, int], more: dict[str, int]) -> None:
    for key, n in more.items():
        counts[key] = counts.get(key, 0) + n


# -- whole periods (TASKS_ENGINE["PARTITION"]) ------------------------------------------------
#
# A period's partitions go whole when nothing in them may be kept: every run finished and past
# its status's cutoff, and none linked to an unfinished run in another period (the batched
# path's rules). Dropping a partition writes no row and no WAL per row, and leaves no dead rows
# to vacuum. The checks use indexes only: unfinished or kept-for-ever statuses (run_status_created),
# runs finished after their cutoff (run_finished), and the links (run_parent).


def _drop_periods(cutoffs: list[tuple[list[str], datetime]]) -> dict[str, int]:
    period = partitions.unit()
    if period is None:
        return {}
    counts = {"partitions": 0, "runs": 0}
    kept_statuses = sorted(str(s) for s in set(FINISHED) - {s for st, _ in cutoffs for s in st})
    if not cutoffs:
        return counts
    # A period that ended after the shortest retention's cutoff holds no run past it; an older
    # one is looked into (a status kept longer is checked run by run, on its index).
    newest_cutoff = max(cutoff for _, cutoff in cutoffs)
    for part in catalog.partitions(partitions.RUNS.table):
        if part.is_default or bounds.id_moment(part.hi) > newest_cutoff:  # type: ignore[arg-type]
            continue
        try:
            dropped = _drop_period(part, cutoffs, kept_statuses)
        except OperationalError:  # its locks not granted within LOCK_TIMEOUT: next round
            continue
        if dropped is None:
            continue  # the batched path prunes what it may of it
        counts["partitions"] += 1
        counts["runs"] += dropped
    return counts


def _drop_period(
    part: catalog.Partition, cutoffs: list[tuple[list[str], datetime]], kept: list[str]
) -> int | None:
    """Drop the period of `part` if nothing in it may be kept: how many runs went, or None."""
    tag = part.name.rsplit("_", 1)[1]
    name, lo, hi = part.name, str(part.lo), str(part.hi)
    late = " OR ".join(
        "EXISTS (SELECT 1 FROM {p} WHERE finished_at >= %s AND status = ANY(%s))" for _ in cutoffs
    ).format(p=name)
    late_params: list[Any] = [
        x for statuses, cutoff in cutoffs for x in (p_dt(cutoff), [str(s) for s in statuses])
    ]
    active = sorted(str(s) for s in ACTIVE)
    with atomic(), connection.cursor() as cur:
        cur.execute(f"SET LOCAL lock_timeout = '{periods.LOCK_TIMEOUT}'")
        # Writers of these rows (an operator's retry of one of its runs) wait until it is gone.
        for table in partitions.TABLES:
            cur.execute(f"LOCK TABLE {periods.partition_name(table.table, tag)} IN SHARE MODE")
        cur.execute(
            f"SELECT EXISTS (SELECT 1 FROM {name} WHERE status = ANY(%s))"
            f" OR {late}"
            f" OR EXISTS (SELECT 1 FROM {RUN} c WHERE c.parent_run_id >= %s"
            " AND c.parent_run_id < %s AND c.status = ANY(%s))"
            f" OR EXISTS (SELECT 1 FROM {name} r JOIN {RUN} p ON p.id = r.parent_run_id"
            " WHERE r.parent_run_id IS NOT NULL AND p.status = ANY(%s))",
            [[*active, *kept], *late_params, lo, hi, active, active],
        )
        if cur.fetchone()[0]:
            return None
        cur.execute(f"SELECT count(*) FROM {name}")
        runs = int(cur.fetchone()[0])
        # Children in later periods outlive their parents without the link, as in delete_runs.
        cur.execute(
            f"UPDATE {RUN} SET parent_run_id = NULL WHERE parent_run_id >= %s"
            " AND parent_run_id < %s AND NOT (id >= %s AND id < %s)",
            [lo, hi, lo, hi],
        )
        periods.detach_and_drop(tag, cur)
    return runs


def _prune_runs(
    cutoffs: list[tuple[list[str], datetime]],
    batch: int,
    max_batches: int | None = None,
    within: Q | None = None,
) -> dict[str, int]:
    """Runs in `statuses` that finished before their `cutoff` (and match `within`), batch by
    batch."""
    counts = {"runs": 0, "steps": 0, "facts": 0, "ledger": 0}
    for statuses, cutoff in cutoffs:
        batches = 0
        while max_batches is None or batches < max_batches:
            deleted = _prune_batch(statuses, cutoff, batch, within)
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


def _prune_batch(
    statuses: list[str], cutoff: datetime, batch: int, within: Q | None = None
) -> dict[str, int]:
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
        runs = WorkflowRun.objects.filter(status__in=statuses, finished_at__lt=cutoff)
        if within is not None:
            runs = runs.filter(within)
        ids = list(
            runs.exclude(Exists(parent_unfinished))
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
