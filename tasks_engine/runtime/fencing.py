"""Fenced external side effects: `ctx.with_attempt_token` and the op ledger.

The "started" row is committed before `fn` runs, so after a crash the next attempt knows the
outside world may already have been touched (`info.resumed`) and can reconcile first.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.db import IntegrityError

from .. import clock, transitions
from ..db import partitions
from ..db.alias import atomic
from ..exceptions import FencingError, Suspend
from ..models import OpLedger, WorkflowRun
from ..transitions.creating import lock_run_keys
from ..values.serialization import to_jsonable


@dataclass(frozen=True)
class OpInfo:
    op_key: str
    resumed: bool
    attempt_token: UUID


def run_fenced(
    lease: transitions.Lease,
    step_name: str,
    op_key: str,
    fn: Callable[[OpInfo], Any],
    *,
    commit: Callable[[Any], Any] | None = None,
) -> Any:
    """`ctx.with_attempt_token` for the attempt holding `lease`, inside step `step_name` (or
    between steps: ""). Three parts, so that an async workflow awaits `fn` on its event loop
    between the two engine parts (runtime/async_steps.py)."""
    started = begin_fenced(lease, step_name, op_key)
    if isinstance(started, Done):
        return started.result
    result = fn(OpInfo(op_key, started, lease.token))
    return commit_fenced(lease, op_key, result, commit)


def begin_fenced(lease: transitions.Lease, step_name: str, op_key: str) -> bool | Done:
    """Record that this attempt starts `op_key` (committed before `fn` runs): whether an
    earlier attempt had started it (`resumed`), or its stored result."""
    transitions.flush_deferred(lease)
    started = _record_start(lease, op_key, step_name)
    if isinstance(started, _Busy):
        # Another run's live attempt is inside this op: come back when it is likely done
        # rather than touch the outside world beside it.
        transitions.requeue_run(lease, started.retry_at)
        raise Suspend(f"op {op_key!r} is in progress in run {started.holder}")
    return started


def commit_fenced(
    lease: transitions.Lease, op_key: str, value: Any, commit: Callable[[Any], Any] | None
) -> Any:
    """In ONE transaction: the lease check, `commit(result)`, the stored result."""
    result = to_jsonable(value)
    # A lost connection is an outage (the op is resumed on replay); an error of `commit`'s own
    # writes is the caller's.
    with transitions.outage_guard(op_key, transitions.TRANSIENT_ERRORS), atomic():
        _check_lease(lease, op_key)
        if commit is not None:
            commit(result)
        _store_result(lease, op_key, result)
    return result


def _check_lease(lease: transitions.Lease, op_key: str) -> None:
    """Inside the transaction: lock the run row, or refuse if this attempt lost its lease."""
    if not transitions.lock_held_run(lease):
        raise FencingError(f"op {op_key!r}: attempt {lease.token} no longer holds the lease")


@transitions.attempt_write
def _store_result(lease: transitions.Lease, op_key: str, result: Any) -> None:
    """Only the attempt the ledger names may store the result: one that another attempt took
    the op over from (its run reclaimed, or another run after this one lost its lease) is
    refused, and its business writes roll back with it."""
    stored = OpLedger.objects.filter(
        op_key=op_key,
        run_id=lease.run_id,
        attempt_token=lease.token,
        status=OpLedger.Status.STARTED,
    ).update(status=OpLedger.Status.DONE, result=result, updated_at=clock.now())
    if not stored:
        raise FencingError(f"op {op_key!r}: attempt {lease.token} no longer owns the op")


@dataclass(frozen=True)
class Done:
    result: Any


@dataclass(frozen=True)
class _Busy:
    holder: UUID
    retry_at: datetime


BUSY_RETRY_SECONDS = 5.0


@transitions.attempt_write
def _record_start(
    lease: transitions.Lease, op_key: str, step_name: str = ""
) -> bool | Done | _Busy:
    """Commit "this attempt started op_key". Returns whether an earlier attempt had started it
    (`resumed`), its stored result, or that a live attempt of another run is inside it."""
    now = clock.now()
    with atomic():
        _check_lease(lease, op_key)
        if partitions.unit() is not None:
            # A partition's unique index sees its own period: two runs of two periods would
            # both insert the key. The key's lock makes them take turns; the second one's
            # lookup, after the lock, finds the first one's row in whichever partition.
            lock_run_keys([json.dumps(["op", op_key])])
        entry = OpLedger.objects.select_for_update().filter(op_key=op_key).first()
        if entry is None:
            try:
                with atomic():
                    OpLedger.objects.create(
                        op_key=op_key,
                        run_id=lease.run_id,
                        step_name=step_name,
                        attempt_token=lease.token,
                        status=OpLedger.Status.STARTED,
                        created_at=now,
                        updated_at=now,
                    )
                return False
            except IntegrityError:  # another attempt started it at the same instant
                entry = OpLedger.objects.select_for_update().get(op_key=op_key)
        if entry.status == OpLedger.Status.DONE:
            return Done(entry.result)
        holder = _live_holder(entry)
        if holder is not None and entry.attempt_token != lease.token:
            return _Busy(holder[0], min(holder[1], now + timedelta(seconds=BUSY_RETRY_SECONDS)))
        entry.run_id, entry.attempt_token, entry.updated_at = lease.run_id, lease.token, now
        entry.step_name = step_name or entry.step_name
        entry.save(update_fields=["run_id", "attempt_token", "updated_at", "step_name"])
        return True


def _live_holder(entry: OpLedger) -> tuple[UUID, datetime] | None:
    """The run whose attempt the entry names, and its lease expiry, if that attempt still holds
    its lease (its run's current token is the entry's)."""
    if entry.run_id is None:
        return None
    row = (
        WorkflowRun.objects.filter(pk=entry.run_id, lease_token=entry.attempt_token)
        .values_list("pk", "available_at")
        .first()
    )
    if row is None or row[1] is None:
        return None
    return row[0], row[1]
