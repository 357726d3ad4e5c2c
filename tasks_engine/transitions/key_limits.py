"""What an enqueue does when its concurrency key is full: `on_limit` (docs/FLOW_CONTROL.md).

A key is full when it has `concurrency_limit` runs pending or running (a running run already
asked to stop is on its way out and not counted). `"cancel_new"` ends the new run canceled at
once; `"cancel_running"` cancels the key's oldest runs, as many as make room, and the new run
takes their place once they have stopped. Both go through the normal cancel path
(outcomes.cancel_batch), so a running run is asked to stop and keeps its place until it has:
the claim, which alone admits runs into `running`, still never lets more than the limit run.

The enqueues of one key are serialised from before their count until their commit (on
PostgreSQL a transaction-level advisory lock per key, in key order; SQLite has one writer), so
two enqueues at the same instant never both see room for one run.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from typing import TYPE_CHECKING

from ..db.sql import execute, is_postgres
from ..models import WorkflowRun
from ..states import RunStatus
from .outcomes import cancel_batch

if TYPE_CHECKING:
    from .creating import NewRun

# pg_advisory_xact_lock(class, hashtext(key)): a class of its own (flow_claims_pg.py has the
# claims' 0x7E51 and 0x7E52), so an enqueue never holds up a claim. A collision only
# serialises two keys' enqueues.
ENQUEUE_KEY_LOCK = 0x7E53


def lock_keys(keys: set[str]) -> None:
    """Hold each key's enqueue lock until the caller's transaction ends (PostgreSQL)."""
    if keys and is_postgres():
        execute(
            "SELECT count(pg_advisory_xact_lock(%s, hashtext(k))) FROM unnest(%s::text[]) AS k",
            [ENQUEUE_KEY_LOCK, sorted(keys)],
        )


def apply_on_limit(created: list[NewRun]) -> None:
    """The new runs `created` (in enqueue order) whose workflow says cancel_new or
    cancel_running, inserted in the caller's transaction under their keys' locks: cancel what
    their strategy says when their key is full."""
    by_key: dict[str, list[NewRun]] = defaultdict(list)
    for run in created:
        assert run.concurrency_key is not None
        by_key[run.concurrency_key].append(run)
    new_ids = {run.id for run in created}
    canceled: dict[str, list[uuid.UUID]] = defaultdict(list)  # reason -> runs
    for key, runs in sorted(by_key.items()):
        active = _active(key, new_ids)
        for run in runs:
            limit = run.concurrency_limit or 1
            if len(active) < limit:
                active.append(run.id)
            elif run.on_limit == "cancel_new":
                canceled[_new_reason(key, limit)].append(run.id)
            else:
                while len(active) >= limit:
                    canceled[_replaced_reason(key, run.id)].append(active.pop(0))
                active.append(run.id)
    for reason, ids in canceled.items():
        cancel_batch(ids, reason)


def _active(key: str, new_ids: set[uuid.UUID]) -> list[uuid.UUID]:
    """The key's runs that hold a place, oldest first: pending, and running unless asked to
    stop; the runs of this enqueue left out."""
    rows = (
        WorkflowRun.objects.filter(
            concurrency_key=key, status__in=[RunStatus.PENDING, RunStatus.RUNNING]
        )
        .exclude(status=RunStatus.RUNNING, cancel_requested_at__isnull=False)
        .order_by("created_at", "id")
        .values_list("pk", flat=True)
    )
    return [pk for pk in rows if pk not in new_ids]


def _new_reason(key: str, limit: int) -> str:
    return (
        f"canceled at enqueue: concurrency key {key!r} already had {limit} run(s) pending or"
        f" running (its limit), and on_limit is 'cancel_new'"
    )


def _replaced_reason(key: str, by: uuid.UUID) -> str:
    return (
        f"replaced by run {by} of concurrency key {key!r} (on_limit 'cancel_running': the"
        " newest run takes the oldest's place)"
    )
