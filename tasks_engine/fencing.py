"""Fenced external side effects: `ctx.with_attempt_token` and the op ledger.

The "started" row is committed before `fn` runs, so after a crash the next attempt knows the
outside world may already have been touched (`info.resumed`) and can reconcile first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

from django.db import IntegrityError, transaction

from . import clock, transitions
from .exceptions import FencingError
from .models import OpLedger
from .serialization import to_jsonable

if TYPE_CHECKING:
    from .context import TaskContext


@dataclass(frozen=True)
class OpInfo:
    op_key: str
    resumed: bool
    attempt_token: UUID


def with_attempt_token(
    ctx: TaskContext,
    op_key: str,
    fn: Callable[[OpInfo], Any],
    *,
    commit: Callable[[Any], Any] | None = None,
) -> Any:
    lease = ctx._state.lease
    ctx.raise_if_canceled()
    transitions.flush_deferred(lease)
    resumed = _record_start(ctx, op_key)
    if isinstance(resumed, _Done):
        return resumed.result
    result = to_jsonable(fn(OpInfo(op_key, resumed, lease.token)))
    with transaction.atomic():
        _check_lease(lease, op_key)
        if commit is not None:
            commit(result)
        OpLedger.objects.filter(op_key=op_key).update(
            status=OpLedger.Status.DONE, result=result, updated_at=clock.now()
        )
    return result


def _check_lease(lease: transitions.Lease, op_key: str) -> None:
    """Inside the transaction: lock the run row, or refuse if this attempt lost its lease."""
    if not transitions.lock_held_run(lease):
        raise FencingError(f"op {op_key!r}: attempt {lease.token} no longer holds the lease")


@dataclass(frozen=True)
class _Done:
    result: Any


def _record_start(ctx: TaskContext, op_key: str) -> bool | _Done:
    """Commit "this attempt started op_key". Returns whether an earlier attempt had started it."""
    lease = ctx._state.lease
    now = clock.now()
    with transaction.atomic():
        _check_lease(lease, op_key)
        entry = OpLedger.objects.select_for_update().filter(op_key=op_key).first()
        if entry is not None:
            if entry.status == OpLedger.Status.DONE:
                return _Done(entry.result)
            entry.attempt_token = lease.token
            entry.updated_at = now
            entry.save(update_fields=["attempt_token", "updated_at"])
            return True
        try:
            with transaction.atomic():
                OpLedger.objects.create(
                    op_key=op_key,
                    run_id=lease.run_id,
                    attempt_token=lease.token,
                    status=OpLedger.Status.STARTED,
                    created_at=now,
                    updated_at=now,
                )
        except IntegrityError:
            return True  # another attempt started it at the same instant
        return False
