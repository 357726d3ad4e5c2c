"""The relay: hand due events to their routes, exactly once, and record every outcome.

`relay_once(batch)` is one pass: claim up to `batch` due pending events (`FOR UPDATE SKIP
LOCKED` on PostgreSQL, so relays never wait on each other; on SQLite the transaction is
`BEGIN IMMEDIATE`, which serialises relays), then run each route in its own savepoint inside
the transaction that writes the event's outcome and counts its attempt. A route's writes commit
together with its event's `dispatched` status: a relay killed mid-batch rolls the batch back
and nothing is dispatched twice. A failing route rolls back only its savepoint. On PostgreSQL
the batch shares one transaction; on SQLite each event has its own, because a transaction there
holds the database's only write lock, and one slow route must not hold it (and stall every
worker) for the routes of its whole batch. `Relay` is the loop around it (`runrelay`).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import traceback
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Case, F, PositiveIntegerField, TextField, Value, When
from django.db.models.functions import Concat

from tasks_engine import clock
from tasks_engine.db.notify import listening_possible
from tasks_engine.db.outages import DB_ERRORS, Outage
from tasks_engine.observe import tracing
from tasks_engine.observe.logs import get_logger
from tasks_engine.values.secrets import redact_text

from .conf import OutboxSettings, outbox_settings
from .models import EventStatus, OutboxEvent
from .notify import relay_listener
from .routes import registry

ERROR_TEXT_LIMIT = 8000


class NoRouteError(LookupError):
    """An event's type has no `@route`: a failed attempt like any other."""


class SwallowedDatabaseError(RuntimeError):
    """The route caught a database error that doomed its writes, and returned as if it worked."""


@dataclass(frozen=True)
class RelayCounts:
    claimed: int = 0
    dispatched: int = 0
    retried: int = 0  # failed; pending again after a backoff
    dead: int = 0  # failed for the last time


INTERRUPTED = "interrupted: the relay stopped while dispatching it"
SPENT = "its attempts were spent before this pass (its max_attempts, or MAX_ATTEMPTS, was lowered)"


def relay_once(batch: int = 100) -> RelayCounts:
    """Dispatch up to `batch` due pending events; return what happened.

    First a short transaction claims them: it hides them from other relays for CLAIM_SECONDS,
    marks them interrupted (the mark stays if this relay dies; an outcome replaces it) and
    counts the attempt of the one event it dispatches first, whose route is about to start.
    Then one transaction dispatches the batch (on SQLite: one per event); each other event's
    attempt is counted with its outcome, in the transaction that writes it.

    So a relay that dies mid-batch has spent the attempt of the batch's first event and of
    those whose outcome committed, and no other: the rest of the batch (on PostgreSQL, where
    its transaction rolls back, all of it; events whose route never started among them) come
    back as suspects with their attempts as they were. A pass claims a suspect alone, counting
    its attempt at the claim, just before its route starts: a route that kills its relay spends
    an attempt each time it runs alone, and ends `dead`, one poison event never takes its
    batch-mates down with it more than once, and an event whose route never ran never goes
    dead for a relay's crash.

    A claim hides its events for CLAIM_SECONDS, after which another relay takes them as a dead
    relay's (and may find their attempts used up). So nothing claimed waits for a route of
    another claim: on PostgreSQL the batch is locked the moment it is claimed, and on SQLite,
    where each event has its own transaction, the claims of the batch's rest are extended
    while earlier routes run.
    """
    s = outbox_settings()
    claimed, dead, hidden_until = _claim(batch, s)
    counts = {EventStatus.DISPATCHED: 0, EventStatus.PENDING: 0, EventStatus.DEAD: dead}
    sqlite = connection.vendor == "sqlite"  # one write lock for everyone: hold it per event
    groups = [[pk] for pk in claimed] if sqlite else ([claimed] if claimed else [])
    for i, ids in enumerate(groups):
        if i and s.claim_seconds and hidden_until - clock.now() < _half(s):
            hidden_until = _extend_claims([g[0] for g in groups[i:]], hidden_until, s)
        with transaction.atomic():
            events = OutboxEvent.objects.select_for_update().filter(
                pk__in=ids, status=EventStatus.PENDING
            )
            for event in events.order_by("created_at", "id"):
                # The claim counted the attempt of the first (its order is this one).
                counts[_dispatch(event, s, counted=event.pk == claimed[0])] += 1
    return RelayCounts(
        claimed=len(claimed) + dead,
        dispatched=counts[EventStatus.DISPATCHED],
        retried=counts[EventStatus.PENDING],
        dead=counts[EventStatus.DEAD],
    )


def _half(s: OutboxSettings) -> timedelta:
    return timedelta(seconds=s.claim_seconds / 2)


def _extend_claims(ids: list[int], hidden_until: datetime, s: OutboxSettings) -> datetime:
    """Hide this pass's claimed events for another CLAIM_SECONDS (those still as it left them:
    one another relay took meanwhile is that relay's)."""
    later = clock.now() + timedelta(seconds=s.claim_seconds)
    OutboxEvent.objects.filter(
        pk__in=ids, status=EventStatus.PENDING, next_attempt_at=hidden_until
    ).update(next_attempt_at=later)
    return later


def _claim(batch: int, s: OutboxSettings) -> tuple[list[int], int, datetime]:
    """Claim due events: (the ids to dispatch, in the order of their dispatch; dead count; when
    their claim runs out). The ids are a batch, or one suspect alone (the first due; the others
    wait for later passes). The attempt of the first is counted here."""
    now = clock.now()
    with transaction.atomic():
        # Reads only the partial index on pending rows. Locked rows belong to another relay.
        rows = list(
            OutboxEvent.objects.filter(status=EventStatus.PENDING, next_attempt_at__lte=now)
            .order_by("next_attempt_at", "id")
            .select_for_update(skip_locked=True)
            .values_list("pk", "attempts", "max_attempts", "last_error", "created_at")[:batch]
        )
        together, suspects, exhausted = [], [], []
        for pk, attempts, max_attempts, last_error, created_at in rows:
            if attempts >= (max_attempts or s.max_attempts):
                # Every attempt so far died with its relay (an event whose route never started
                # spent none: a batch-mate of the route that killed it, say).
                exhausted.append(pk)
            elif last_error.startswith(INTERRUPTED):
                suspects.append(pk)
            else:
                together.append((created_at, pk))
        if exhausted:
            # Interrupted on its last attempt: every attempt died with its relay. Otherwise its
            # limit was lowered below the attempts it had already made: its last error stays.
            OutboxEvent.objects.filter(pk__in=exhausted).update(
                status=EventStatus.DEAD,
                last_error=Case(
                    When(
                        last_error__startswith=INTERRUPTED,
                        then=Value(f"{INTERRUPTED} on every attempt"),
                    ),
                    default=Concat(Value(SPENT + "\n\n"), F("last_error")),
                    output_field=TextField(),
                ),
            )
        hide_until = now + timedelta(seconds=s.claim_seconds)
        if suspects:  # alone: the rest stay due for the passes after it
            claimed = suspects[:1]
            OutboxEvent.objects.filter(pk__in=claimed).update(
                attempts=F("attempts") + 1, next_attempt_at=hide_until
            )
        elif together:
            claimed = [pk for _, pk in sorted(together)]  # the dispatch's order
            # One statement: the mark stays if this relay dies too, the outcome of the dispatch
            # replaces it; the attempt of the first is counted, its route is about to start.
            OutboxEvent.objects.filter(pk__in=claimed).update(
                attempts=Case(
                    When(pk=claimed[0], then=F("attempts") + 1),
                    default=F("attempts"),
                    output_field=PositiveIntegerField(),
                ),
                next_attempt_at=hide_until,
                last_error=Concat(Value(INTERRUPTED + "\n\n"), F("last_error")),
            )
        else:
            claimed = []
    return claimed, len(exhausted), hide_until


def _dispatch(event: OutboxEvent, s: OutboxSettings, *, counted: bool) -> EventStatus:
    """Run the route of a claimed event in a savepoint; count its attempt (unless the claim
    `counted` it) with the outcome: the route sees the number of this attempt either way."""
    if not counted:
        event.attempts += 1
    found = registry.get(event.type)
    try:
        if found is None:
            raise NoRouteError(f"no route for outbox event type {event.type!r}")
        with transaction.atomic(), tracing.trace_context_activated(event.trace_context):
            found.handler(event)
            # Django would roll this savepoint back without a word: the route's writes are
            # gone, so this is a failed attempt, not a dispatch.
            if transaction.get_rollback():
                raise SwallowedDatabaseError(
                    "the route caught a database error inside an atomic block and returned; "
                    "its writes were rolled back"
                )
    except Exception as exc:  # noqa: BLE001 - any route failure is a failed attempt
        return _failed(event, exc, s)
    event.status = EventStatus.DISPATCHED
    event.published_at = clock.now()
    event.last_error = event.last_error.removeprefix(INTERRUPTED + "\n\n")
    event.save(update_fields=["status", "published_at", "last_error", "attempts"])
    return EventStatus.DISPATCHED


def _failed(event: OutboxEvent, exc: Exception, s: OutboxSettings) -> EventStatus:
    limit = event.max_attempts or s.max_attempts
    event.last_error = _describe(exc)
    log = get_logger(event_id=event.pk, type=event.type, attempts=event.attempts)
    if event.attempts >= limit:
        event.status = EventStatus.DEAD
        log.error("outbox event is dead", error=str(exc), max_attempts=limit)
    else:
        event.next_attempt_at = clock.now() + s.backoff(event.attempts)
        log.warning(
            "outbox route failed; will retry",
            error=str(exc),
            next_attempt_at=event.next_attempt_at.isoformat(),
        )
    event.save(update_fields=["status", "last_error", "next_attempt_at", "attempts"])
    return EventStatus(event.status)


def _describe(exc: Exception) -> str:
    """One summary line, then the traceback (its tail, if long)."""
    # Shown in the admin: secrets redacted as in the logs, before the cut (a URL cut in two
    # no longer looks like one); NUL (refused by jsonb/text) replaced.
    trace = redact_text("".join(traceback.format_exception(exc)))
    if len(trace) > ERROR_TEXT_LIMIT:
        trace = "...\n" + trace[-ERROR_TEXT_LIMIT:]
    text = f"{redact_text(f'{type(exc).__name__}: {exc}')}\n\n{trace}"
    return text.replace("\x00", "\ufffd")


def next_due_in() -> float | None:
    """Seconds until the earliest pending event is due (<= 0: due now), None if none is pending."""
    at = (
        OutboxEvent.objects.filter(status=EventStatus.PENDING)
        .order_by("next_attempt_at")
        .values_list("next_attempt_at", flat=True)
        .first()
    )
    return None if at is None else (at - clock.now()).total_seconds()


# -- the loop ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RelayConfig:
    batch: int = 100
    poll_interval: float = 1.0
    burst: bool = False


class Relay:
    """`relay_once` until stopped. Woken by NOTIFY on PostgreSQL, polling otherwise (and as a
    fallback). SIGTERM/SIGINT: finish the current batch, exit 0; a second signal exits at once."""

    def __init__(self, config: RelayConfig) -> None:
        self.config = config
        self.log = get_logger(relay_id=f"{socket.gethostname()}:{os.getpid()}")
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self._signals = 0

    def run(self) -> int:
        previous = self._install_signal_handlers()
        try:
            self._loop()
        finally:
            self.stopping.set()  # also stops the listener
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            connection.close()
        self.log.info("relay stopped")
        return 0

    def _loop(self) -> None:
        self.log.info(
            "relay started",
            batch=self.config.batch,
            burst=self.config.burst,
            poll_interval=self.config.poll_interval,
        )
        if listening_possible() and not self.config.burst:
            relay_listener(self.wake.set, self.stopping, self.log).start()
        outage = Outage(self.log, "relay")
        while not self.stopping.is_set():
            self.wake.clear()  # a NOTIFY arriving during the pass triggers another pass
            try:
                counts = relay_once(self.config.batch)
                # After a non-empty pass look again at once; idle only after an empty one.
                delay = 0.0 if counts.claimed else self._idle_delay()
                outage.ok()
            except DB_ERRORS as exc:
                self.stopping.wait(outage.failed(exc))
                continue
            if counts.claimed:
                self.log.info(
                    "relay pass",
                    claimed=counts.claimed,
                    dispatched=counts.dispatched,
                    retried=counts.retried,
                    dead=counts.dead,
                )
            if self.config.burst:
                if not counts.claimed:
                    break
                continue
            if delay > 0:
                self.wake.wait(delay)

    def _idle_delay(self) -> float:
        due_in = next_due_in()
        # Due now yet not claimed: another relay holds it. Its outcome is that relay's job.
        if due_in is None or due_in <= 0:
            return self.config.poll_interval
        return min(self.config.poll_interval, due_in)

    def request_stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    def _install_signal_handlers(self) -> dict[int, Any]:
        """Returns the handlers it replaced (restored on return, for in-process callers)."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._signals += 1
        if self._signals > 1:
            os._exit(1)  # second signal: exit at once; the open batch rolls back
        self.request_stop()
