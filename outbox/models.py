"""The outbox table. `events.py` writes new and revived rows; `relay.py` writes outcomes."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from tasks_engine.db.sqlite_bounds import Hints

# SQLite: statistics for the relay's claim and the prune of dispatched events, so that they
# read their partial indexes whatever the table's sizes (tasks_engine/db/sqlite_bounds.py).
SQLITE_HINTS = Hints(
    seeds=(
        ("outbox_event_status", "10000 3000 1"),
        ("outbox_event_due", "100 1 1"),
        ("outbox_event_dispatched", "9000 1"),
    ),
    empty=(("outbox_event_due", "1 1 1"), ("outbox_event_dispatched", "1 1")),
)


class EventStatus(models.TextChoices):
    PENDING = "pending"  # waiting for the relay: due at next_attempt_at (now, or after a backoff)
    DISPATCHED = "dispatched"  # its route ran and committed with the status change
    DEAD = "dead"  # max_attempts spent; only an admin retry brings it back


class OutboxEvent(models.Model):
    type = models.CharField(max_length=200)
    payload = models.JSONField(default=dict, blank=True)
    idempotency_key = models.CharField(max_length=255, unique=True, null=True, blank=True)
    status = models.CharField(
        max_length=16, choices=EventStatus.choices, default=EventStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0, help_text="Dispatch attempts so far.")
    max_attempts = models.PositiveIntegerField(
        null=True, blank=True, help_text='Empty: OUTBOX["MAX_ATTEMPTS"].'
    )
    next_attempt_at = models.DateTimeField()
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField()
    published_at = models.DateTimeField(null=True, blank=True, help_text="When it was dispatched.")
    # The publisher's OpenTelemetry span (W3C traceparent), made current around the route so
    # the runs it starts join the publisher's trace; "" when no span was current.
    trace_context = models.CharField(max_length=128, blank=True, default="")

    class Meta:
        ordering = ["-id"]
        verbose_name = "outbox event"
        permissions = [("retry_outboxevent", "Can retry dead outbox events")]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=EventStatus.values), name="outbox_event_status_valid"
            ),
            models.CheckConstraint(
                condition=Q(max_attempts__isnull=True) | Q(max_attempts__gte=1),
                name="outbox_event_max_attempts_positive",
            ),
            models.CheckConstraint(
                condition=~Q(status="dispatched") | Q(published_at__isnull=False),
                name="outbox_event_dispatched_has_published_at",
            ),
        ]
        indexes = [
            # The relay claim reads only this index: dispatched and dead rows are not in it.
            models.Index(
                fields=["next_attempt_at", "id"],
                condition=Q(status="pending"),
                name="outbox_event_due",
            ),
            models.Index(fields=["status", "-id"], name="outbox_event_status"),
            models.Index(fields=["type", "-id"], name="outbox_event_type"),
            models.Index(
                fields=["published_at"],
                condition=Q(status="dispatched"),
                name="outbox_event_dispatched",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.type} #{self.pk} ({self.status})"

    @property
    def run_key(self) -> str:
        """The idempotency key for the run this event's route starts: pass it to `enqueue`.
        When the engine's tables are on another database than the outbox's
        (TASKS_ENGINE["DATABASE"]), the run commits there at once, apart from the relay's
        transaction; a relay that dies before marking the event dispatched leaves the event
        due, and the next dispatch's `enqueue` with this key finds that run instead of starting
        a second one (docs/DATABASES.md)."""
        return f"outbox-event:{self.pk}"
