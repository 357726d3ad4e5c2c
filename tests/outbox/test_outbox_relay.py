"""relay_once: dispatch in one transaction, savepoint per route, backoff, dead events, pruning."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.test import override_settings

from outbox import publish, retry_dead
from outbox.maintenance import prune_dispatched
from outbox.models import EventStatus, OutboxEvent
from outbox.relay import RelayCounts, next_due_in, relay_once
from tasks_engine import clock
from tasks_engine.models import WorkflowRun
from tests.helpers import FakeClock
from tests.testapp.models import Marker, SideEffect

pytestmark = pytest.mark.django_db


def effects() -> list[str]:
    return sorted(SideEffect.objects.values_list("key", flat=True))


def test_route_enqueues_a_run_in_the_dispatch_transaction() -> None:
    publish("test.enqueue_noop", {"n": 7})
    assert relay_once(10) == RelayCounts(claimed=1, dispatched=1)
    run = WorkflowRun.objects.get()
    assert (run.task_name, run.input) == ("noop", {"n": 7})
    assert relay_once(10) == RelayCounts()  # dispatched events are not claimed again


def test_batch_limits_the_claim_and_oldest_go_first() -> None:
    for i in range(5):
        publish("test.record", {"key": i})
    assert relay_once(2).dispatched == 2
    assert effects() == ["outbox:0", "outbox:1"]
    assert relay_once(10).dispatched == 3
    assert OutboxEvent.objects.filter(status="dispatched", attempts=1).count() == 5


def test_failing_route_rolls_back_only_its_own_savepoint() -> None:
    publish("test.record", {"key": "before"})
    bad = publish("test.write_then_fail", {"key": "undone"})
    publish("test.record", {"key": "after"})
    assert relay_once(10) == RelayCounts(claimed=3, dispatched=2, retried=1)
    assert effects() == ["outbox:after", "outbox:before"]  # the failed route's row is gone
    bad.refresh_from_db()
    assert (bad.status, bad.attempts, bad.published_at) == ("pending", 1, None)
    assert bad.last_error.startswith("RouteBroken: failed after writing")
    assert "Traceback" in bad.last_error


def test_route_that_swallows_a_database_error_is_a_failed_attempt() -> None:
    event = publish("test.swallows_db_error", {"key": "lost"})
    publish("test.record", {"key": "fine"})
    assert relay_once(10) == RelayCounts(claimed=2, dispatched=1, retried=1)
    event.refresh_from_db()
    assert (event.status, event.attempts) == ("pending", 1)
    assert event.last_error.startswith("SwallowedDatabaseError: the route caught")
    assert effects() == ["outbox:fine"]
    assert not Marker.objects.exists()


def test_type_without_a_route_is_a_failed_attempt() -> None:
    event = publish("test.nobody_listens", {})
    assert relay_once(10).retried == 1
    event.refresh_from_db()
    assert event.status == "pending" and event.attempts == 1
    assert "no route for outbox event type 'test.nobody_listens'" in event.last_error


def test_failures_back_off_exponentially_then_the_event_is_dead(fake_clock: FakeClock) -> None:
    event = publish("test.always_fails", {})
    for attempt in range(1, 10):
        assert relay_once(10) == RelayCounts(claimed=1, retried=1)
        event.refresh_from_db()
        assert event.attempts == attempt
        delay = event.next_attempt_at - clock.now()
        assert delay == timedelta(seconds=2 ** (attempt - 1))
        assert relay_once(10).claimed == 0  # not due before its backoff ends
        fake_clock.advance(delay.total_seconds() - 0.001)
        assert relay_once(10).claimed == 0
        fake_clock.advance(0.001)
    assert relay_once(10) == RelayCounts(claimed=1, dead=1)  # MAX_ATTEMPTS = 10
    event.refresh_from_db()
    assert (event.status, event.attempts) == (EventStatus.DEAD, 10)
    assert event.last_error.startswith("RouteBroken: route is broken (attempt 10)")
    fake_clock.advance(3600)
    assert relay_once(10).claimed == 0  # dead events are never claimed again


def test_an_event_whose_limit_was_lowered_below_its_attempts_dies_with_its_last_error(
    fake_clock: FakeClock,
) -> None:
    from outbox.relay import SPENT

    event = publish("test.always_fails", {})
    assert relay_once(10) == RelayCounts(claimed=1, retried=1)
    assert relay_once(10) == RelayCounts()  # its backoff
    with override_settings(OUTBOX={"MAX_ATTEMPTS": 1}):  # lowered by a deploy
        fake_clock.advance(1)
        assert relay_once(10) == RelayCounts(claimed=1, dead=1)
    event.refresh_from_db()
    assert (event.status, event.attempts) == (EventStatus.DEAD, 1)
    # Never interrupted: its last error is what it died of, not a relay's death.
    assert event.last_error.startswith(f"{SPENT}\n\nRouteBroken: route is broken (attempt 1)")


@override_settings(
    OUTBOX={"MAX_ATTEMPTS": 10, "BACKOFF_BASE_SECONDS": 0.5, "BACKOFF_MAX_SECONDS": 3}
)
def test_backoff_is_capped(fake_clock: FakeClock) -> None:
    event = publish("test.always_fails", {})
    delays = []
    for _ in range(6):
        relay_once(10)
        event.refresh_from_db()
        delay = (event.next_attempt_at - clock.now()).total_seconds()
        delays.append(delay)
        fake_clock.advance(delay)
    assert delays == [0.5, 1, 2, 3, 3, 3]


def test_event_max_attempts_overrides_the_setting(fake_clock: FakeClock) -> None:
    event = publish("test.always_fails", {}, max_attempts=2)
    relay_once(10)
    fake_clock.advance(1)
    assert relay_once(10).dead == 1
    event.refresh_from_db()
    assert (event.status, event.attempts) == ("dead", 2)


def test_attempts_count_the_successful_one_too(fake_clock: FakeClock) -> None:
    event = publish("test.flaky", {"fail_times": 2, "key": "f"})
    relay_once(10)
    fake_clock.advance(1)
    relay_once(10)
    fake_clock.advance(2)
    assert relay_once(10).dispatched == 1
    event.refresh_from_db()
    assert (event.status, event.attempts) == ("dispatched", 3)
    assert event.last_error.startswith("RouteBroken: flaky failure on attempt 2")
    assert effects() == ["outbox:f"]


def test_retry_dead_revives_only_dead_events(fake_clock: FakeClock) -> None:
    dead = publish("test.needs_marker", {"key": "r"}, max_attempts=1)
    pending = publish("test.always_fails", {})
    relay_once(10)
    fake_clock.advance(30)
    assert retry_dead([dead.pk, pending.pk, 999_999]) == 1
    dead.refresh_from_db()
    assert (dead.status, dead.attempts, dead.next_attempt_at) == ("pending", 0, clock.now())
    pending.refresh_from_db()
    assert pending.attempts == 1
    Marker.objects.create(key="r")
    relay_once(10)
    dead.refresh_from_db()
    assert (dead.status, dead.attempts) == ("dispatched", 1)


def test_next_due_in_reports_the_earliest_pending_event(fake_clock: FakeClock) -> None:
    assert next_due_in() is None
    publish("test.always_fails", {})
    assert next_due_in() == 0
    relay_once(10)
    assert next_due_in() == 1.0


def test_prune_deletes_only_old_dispatched_events(fake_clock: FakeClock) -> None:
    old = publish("test.record", {"key": "old"})
    relay_once(10)
    fake_clock.advance(3600)
    publish("test.record", {"key": "new"})
    relay_once(10)
    failing = publish("test.always_fails", {})
    relay_once(10)
    assert prune_dispatched(clock.now() - timedelta(minutes=30)) == 1
    assert not OutboxEvent.objects.filter(pk=old.pk).exists()
    assert OutboxEvent.objects.filter(pk=failing.pk).exists()
    assert OutboxEvent.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_runrelay_burst_dispatches_everything_due_then_returns() -> None:
    for i in range(5):
        publish("test.record", {"key": i})
    publish("test.always_fails", {})
    call_command("runrelay", "--burst", "--batch", "2")
    assert OutboxEvent.objects.filter(status="dispatched").count() == 5
    assert OutboxEvent.objects.get(type="test.always_fails").attempts == 1  # backed off, not due
    assert len(effects()) == 5


@pytest.mark.django_db(transaction=True)
def test_tasks_prune_command_prunes_dispatched_events() -> None:
    publish("test.record", {"key": "x"})
    relay_once(10)
    OutboxEvent.objects.update(published_at=clock.now() - timedelta(days=10))
    call_command("tasks", "prune", "--older-than", "7")
    assert not OutboxEvent.objects.exists()


def test_a_stored_route_error_is_redacted_like_the_logs() -> None:
    from outbox.relay import _describe

    text = _describe(ValueError("POST http://umt:hunter2@qbt.local/api failed\x00"))
    assert "hunter2" not in text and "\x00" not in text
    assert "umt:[redacted]@qbt.local" in text


def test_a_stored_route_error_cut_to_its_tail_is_redacted_before_the_cut() -> None:
    """A long traceback is cut to its tail; the cut fell inside a URL and left
    `app:cut-pw@db` with no scheme before it, which the URL rule no longer recognised: the
    password was stored (an outside audit)."""
    from outbox.relay import ERROR_TEXT_LIMIT, _describe

    after_scheme = "app:cut-pw-secret@db.internal/umt"
    padding = "y" * (ERROR_TEXT_LIMIT - len(after_scheme) - 1)  # the tail starts at "app:"
    text = _describe(ValueError(f"connect to postgres://{after_scheme}{padding}"))
    assert "cut-pw-secret" not in text
    assert text.startswith("ValueError: connect to postgres://app:[redacted]@db.internal/umt")


# -- a claim is never taken from a relay that is still at work ----------------------------------


def _interrupted(event: OutboxEvent) -> None:
    """As a relay killed while dispatching it leaves it: one attempt counted, the mark."""
    from outbox.relay import INTERRUPTED

    OutboxEvent.objects.filter(pk=event.pk).update(
        attempts=1, last_error=INTERRUPTED, next_attempt_at=clock.now()
    )


@pytest.mark.django_db(transaction=True)
def test_a_second_relay_takes_nothing_a_live_relay_claimed_while_a_suspect_runs(
    fake_clock: FakeClock, is_postgres: bool
) -> None:
    """Relay A dispatches a suspect whose route outlasts CLAIM_SECONDS; relay B then runs.
    A's claim held the suspect alone: B dispatches the other events once each, none dead
    (when A also claimed them and left them unlocked behind the suspect, B found them due with
    their one attempt used and marked them dead, their routes never called)."""
    if not is_postgres:
        pytest.skip("two relays at once: on SQLite the suspect's transaction holds the lock")
    import threading

    from django.db import connection

    from tests.testapp import outbox_routes

    started, release = threading.Event(), threading.Event()

    def block(event: OutboxEvent) -> None:
        started.set()
        assert release.wait(30)

    outbox_routes.HOOKS["block"] = block
    suspect = publish("test.hook", {"key": "suspect", "hook": "block"})
    _interrupted(suspect)
    others = [publish("test.record", {"key": f"e{i}"}, max_attempts=1) for i in range(4)]

    def relay() -> None:
        relay_once(10)
        connection.close()  # this thread's own connection

    relay_a = threading.Thread(target=relay)
    relay_a.start()
    try:
        assert started.wait(30)
        fake_clock.advance(61)  # A's claims ran out while its suspect's route runs
        relay_once(10)  # relay B
    finally:
        release.set()
        relay_a.join(30)
        outbox_routes.HOOKS.clear()
    rows = {e.pk: e for e in OutboxEvent.objects.all()}
    assert [(rows[e.pk].status, rows[e.pk].attempts) for e in others] == [("dispatched", 1)] * 4
    assert rows[suspect.pk].status == "dispatched"
    assert effects() == ["outbox:e0", "outbox:e1", "outbox:e2", "outbox:e3", "outbox:suspect"]


def test_a_batch_s_later_events_stay_hidden_while_its_earlier_routes_run(
    fake_clock: FakeClock, is_postgres: bool
) -> None:
    """On SQLite each event of a batch has its own transaction: while the first routes take
    longer than CLAIM_SECONDS, the rest of the batch must not become due for another relay."""
    if is_postgres:
        pytest.skip("PostgreSQL dispatches the batch in one transaction: its rows are locked")
    from tests.testapp import outbox_routes

    seen: list[bool] = []

    def slow(event: OutboxEvent) -> None:
        fake_clock.advance(40)  # two of these outlast CLAIM_SECONDS (60)
        later = OutboxEvent.objects.filter(status="pending").exclude(pk=event.pk)
        seen.extend(e.next_attempt_at > clock.now() for e in later)

    outbox_routes.HOOKS["slow"] = slow
    try:
        for i in range(3):
            publish("test.hook", {"key": f"s{i}", "hook": "slow"}, max_attempts=1)
        assert relay_once(10) == RelayCounts(claimed=3, dispatched=3)
    finally:
        outbox_routes.HOOKS.clear()
    assert seen == [True, True, True]  # 2 waiting during the first route, 1 during the second
    assert effects() == ["outbox:s0", "outbox:s1", "outbox:s2"]


# -- a relay's death costs an attempt only to a route known to have started ----------------------


def test_a_dead_relay_s_batch_spends_the_attempt_of_its_first_event_only(
    fake_clock: FakeClock,
) -> None:
    """A pass claims a batch and dies before any outcome commits (as on PostgreSQL, where its
    routes share one transaction). Its first event's route was about to start: that attempt is
    spent. The rest's routes may never have started: they spend nothing, come back as suspects
    one at a time, and are delivered even with one attempt each."""
    from outbox.conf import outbox_settings
    from outbox.relay import INTERRUPTED, _claim

    first = publish("test.record", {"key": "first"}, max_attempts=1)
    mates = [publish("test.record", {"key": f"m{i}"}, max_attempts=1) for i in range(3)]
    claimed, dead, _ = _claim(10, outbox_settings())  # ... and the relay died
    assert (claimed, dead) == ([first.pk, *(m.pk for m in mates)], 0)
    rows = {e.pk: e for e in OutboxEvent.objects.all()}
    assert [rows[pk].attempts for pk in claimed] == [1, 0, 0, 0]
    assert all(rows[pk].last_error.startswith(INTERRUPTED) for pk in claimed)

    fake_clock.advance(61)  # its claim runs out
    assert relay_once(10) == RelayCounts(claimed=2, dispatched=1, dead=1)  # one suspect alone
    assert relay_once(10) == RelayCounts(claimed=1, dispatched=1)
    assert relay_once(10) == RelayCounts(claimed=1, dispatched=1)
    rows = {e.pk: e for e in OutboxEvent.objects.all()}
    assert [(rows[m.pk].status, rows[m.pk].attempts, rows[m.pk].last_error) for m in mates] == [
        ("dispatched", 1, "")
    ] * 3
    assert (rows[first.pk].status, rows[first.pk].attempts) == ("dead", 1)
    assert rows[first.pk].last_error == f"{INTERRUPTED} on every attempt"
    assert effects() == ["outbox:m0", "outbox:m1", "outbox:m2"]
