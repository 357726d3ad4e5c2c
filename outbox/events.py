"""Writing events: `publish` (on the caller's connection and transaction) and `retry_dead`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import IntegrityError, transaction

from tasks_engine import clock
from tasks_engine.definitions import is_integer
from tasks_engine.exceptions import UnstorableValueError
from tasks_engine.observe import tracing
from tasks_engine.values.serialization import to_jsonable

from .models import EventStatus, OutboxEvent
from .notify import wake_relay

TYPE_MAX_LENGTH = OutboxEvent._meta.get_field("type").max_length or 200
KEY_MAX_LENGTH = OutboxEvent._meta.get_field("idempotency_key").max_length or 255
MAX_ATTEMPTS_MAX = 2**31 - 1  # PostgreSQL's integer column


def publish(
    type: str,
    payload: Any,
    *,
    idempotency_key: str | None = None,
    max_attempts: int | None = None,
) -> OutboxEvent:
    """Write an event that the relay will hand to the route of `type`.

    It commits or rolls back with the caller's transaction. With an `idempotency_key` that an
    event already holds, that event is returned and nothing is written. The payload must be
    JSON-serialisable (TypeError or ValueError otherwise, and nothing is written); the event
    holds it as JSON decodes it, which is what the route will see.
    """
    _check_args(type, idempotency_key, max_attempts)
    stored = _as_json(type, payload)
    if idempotency_key is not None:
        existing = OutboxEvent.objects.filter(idempotency_key=idempotency_key).first()
        if existing is not None:
            return existing
    now = clock.now()
    event = OutboxEvent(
        type=type,
        payload=stored,
        idempotency_key=idempotency_key,
        max_attempts=max_attempts,
        next_attempt_at=now,
        created_at=now,
        trace_context=tracing.current_trace_context(),
    )
    try:
        # A savepoint: a duplicate key must not poison the caller's transaction.
        with transaction.atomic():
            event.save(force_insert=True)
            wake_relay()
    except IntegrityError:
        if idempotency_key is None:
            raise
        existing = OutboxEvent.objects.filter(idempotency_key=idempotency_key).first()
        if existing is None:
            raise
        return existing
    return event


def retry_dead(ids: Iterable[int]) -> int:
    """Put the given dead events back to pending, due now, with a fresh attempt budget.

    Events in any other status are left alone. Returns how many were revived.
    """
    return len(revive_dead(ids))


def revive_dead(ids: Iterable[int]) -> list[int]:
    """`retry_dead`, returning the ids of the events it revived (for the admin's log)."""
    with transaction.atomic():
        dead = OutboxEvent.objects.select_for_update().filter(
            pk__in=list(ids), status=EventStatus.DEAD
        )
        revived = list(dead.values_list("pk", flat=True))
        if revived:
            OutboxEvent.objects.filter(pk__in=revived).update(
                status=EventStatus.PENDING, attempts=0, next_attempt_at=clock.now()
            )
            wake_relay()
    return revived


def _as_json(event_type: str, payload: Any) -> Any:
    """The payload as the route will see it (pydantic models in JSON mode). Refused, the same
    on both databases: what JSON has no form for, NaN and infinities (not standard JSON), and
    a NUL character (PostgreSQL's jsonb cannot hold one)."""
    try:
        return to_jsonable(payload, "the payload")
    except UnstorableValueError as exc:  # a TypeError and a ValueError
        raise UnstorableValueError(
            f"outbox payload for {event_type!r} is not JSON-serialisable: {exc}"
        ) from None


def _check_args(type: str, idempotency_key: str | None, max_attempts: int | None) -> None:
    """ValueError for what the event's columns cannot hold, before any statement: PostgreSQL
    refused a NUL or a max_attempts past its integer column with a DataError, SQLite stored the
    NUL, and 2**63 overflowed the driver."""
    if not isinstance(type, str) or not type or len(type) > TYPE_MAX_LENGTH:
        raise ValueError(f"outbox event type must be a string of 1-{TYPE_MAX_LENGTH} characters")
    if "\x00" in type:
        raise ValueError("outbox event type must not contain a NUL character")
    if idempotency_key is not None and (
        not isinstance(idempotency_key, str)
        or not idempotency_key
        or len(idempotency_key) > KEY_MAX_LENGTH
    ):
        raise ValueError(f"idempotency_key must be a string of 1-{KEY_MAX_LENGTH} characters")
    if idempotency_key is not None and "\x00" in idempotency_key:
        raise ValueError("idempotency_key must not contain a NUL character")
    if max_attempts is not None and (
        not is_integer(max_attempts) or not 1 <= max_attempts <= MAX_ATTEMPTS_MAX
    ):
        raise ValueError(
            f"max_attempts must be an integer from 1 to {MAX_ATTEMPTS_MAX}, got {max_attempts!r}"
        )
