"""Real `manage.py runrelay` processes: two relays, SIGKILL and SIGTERM mid-batch (PostgreSQL and
SQLite); NOTIFY wake-ups and a database that goes away and comes back (PostgreSQL)."""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.db.models import Max, Min

from outbox import publish
from outbox.models import OutboxEvent
from outbox.relay import INTERRUPTED
from tasks_engine.models import WorkflowRun
from tests.helpers import WorkerProcess, wait_for
from tests.testapp.models import SideEffect
from tests.testapp.outbox_routes import TRACE_ENV

pytestmark = [
    pytest.mark.process,
    pytest.mark.django_db(transaction=True),
    pytest.mark.both_dbs,  # SQLite: one transaction per event
]

Start = Callable[..., WorkerProcess]


@pytest.fixture
def relays(tmp_path: Path, transactional_db: None) -> Iterator[Start]:
    """Start real `manage.py runrelay` processes; all are killed at teardown."""
    started: list[WorkerProcess] = []

    def start(
        *args: str, tag: str | None = None, env: dict[str, str] | None = None
    ) -> WorkerProcess:
        r = WorkerProcess(["runrelay", *args], tmp_path, tag or f"r{len(started)}", env or {})
        started.append(r)
        return r

    yield start
    for r in started:
        r.stop()
    connection.close()


def dispatched() -> int:
    return OutboxEvent.objects.filter(status="dispatched").count()


def route_calls(trace: Path) -> list[str]:
    """Every call of the `test.record` route, committed or rolled back."""
    return trace.read_text().splitlines() if trace.exists() else []


def publish_records(n: int, sleep: float) -> None:
    with transaction.atomic():
        for i in range(n):
            publish("test.record", {"key": i, "sleep": sleep})


def test_two_relays_dispatch_1000_events_exactly_once(relays: Start) -> None:
    with transaction.atomic():
        for i in range(1000):
            publish("test.enqueue_noop", {"n": i})
    a = relays("--burst", "--batch", "50", tag="a")
    b = relays("--burst", "--batch", "50", tag="b")
    assert a.wait(120) == 0, a.log()
    assert b.wait(120) == 0, b.log()
    runs = WorkflowRun.objects.filter(task_name="noop")
    assert runs.count() == 1000
    assert sorted(r.input["n"] for r in runs) == list(range(1000))
    assert OutboxEvent.objects.filter(status="dispatched", attempts=1).count() == 1000
    span = OutboxEvent.objects.aggregate(first=Min("published_at"), last=Max("published_at"))
    seconds = (span["last"] - span["first"]).total_seconds()
    split = Counter(runs.values_list("trace_id", flat=True))
    print(
        f"\n1000 events in {seconds:.2f} s ({1000 / max(seconds, 1e-3):.0f}/s), "
        f"by relay: {dict(split)}"
    )


def test_relay_sigkilled_mid_batch_loses_nothing_and_repeats_nothing(
    relays: Start, tmp_path: Path
) -> None:
    trace = tmp_path / "calls.txt"
    env = {TRACE_ENV: str(trace), "OUTBOX_CLAIM_SECONDS": "1"}
    publish_records(60, sleep=0.03)
    doomed = relays("--batch", "20", "--poll-interval", "0.2", tag="doomed", env=env)
    wait_for(lambda: len(route_calls(trace)) >= 30, 30, "the second batch to be under way")
    doomed.send(signal.SIGKILL)
    doomed.wait(10)
    calls_at_kill, done_at_kill = len(route_calls(trace)), dispatched()
    # Claimed by the killed relay, and not dispatched (marked interrupted).
    orphaned = OutboxEvent.objects.filter(
        status="pending", last_error__startswith=INTERRUPTED
    ).count()
    # The claim counted the attempt of its batch's first event only (if it is among them).
    charged = OutboxEvent.objects.filter(status="pending", attempts=1).count()
    # A route's writes commit with its event's `dispatched`, or roll back with it.
    assert SideEffect.objects.count() == done_at_kill
    if connection.vendor == "postgresql":  # one transaction per batch
        assert done_at_kill % 20 == 0  # whole batches commit, or none of them
        assert done_at_kill < calls_at_kill, "the kill should land inside a batch"
        assert (orphaned, charged) == (20, 1)
    else:  # SQLite: one transaction per event (one write lock for every process)
        assert calls_at_kill - 1 <= done_at_kill <= calls_at_kill
        assert orphaned > 0, "the kill should land inside a batch"
        assert charged <= 1

    rescuer = relays("--batch", "20", "--poll-interval", "0.2", tag="rescuer", env=env)
    wait_for(lambda: dispatched() == 60, 30, "every event to be dispatched")
    rescuer.send(signal.SIGTERM)
    assert rescuer.wait(30) == 0, rescuer.log()
    keys: Counter[str] = Counter(SideEffect.objects.values_list("key", flat=True))
    assert keys == Counter(f"outbox:{i}" for i in range(60))  # each effect exactly once
    assert OutboxEvent.objects.filter(status="dispatched").count() == 60
    # The killed batch's first event spent an attempt at its claim; the others one each.
    assert OutboxEvent.objects.filter(attempts=2).count() == charged
    assert OutboxEvent.objects.filter(attempts=1).count() == 60 - charged
    # The rolled-back calls ran again, and committed once.
    assert len(route_calls(trace)) == 60 + calls_at_kill - done_at_kill


def test_sigterm_finishes_the_current_batch_and_exits_0(relays: Start, tmp_path: Path) -> None:
    trace = tmp_path / "calls.txt"
    publish_records(30, sleep=0.05)
    relay = relays(
        "--batch", "10", "--poll-interval", "0.2", tag="term", env={TRACE_ENV: str(trace)}
    )
    wait_for(lambda: len(route_calls(trace)) >= 3, 30, "a batch to be under way")
    relay.send(signal.SIGTERM)
    assert relay.wait(30) == 0, relay.log()
    done = dispatched()
    assert 0 < done < 30 and done % 10 == 0
    assert len(route_calls(trace)) == done  # every route call that started was committed
    assert SideEffect.objects.count() == done
    assert "relay stopped" in relay.log()


@pytest.mark.postgres_only("NOTIFY pickup latency (SQLite polls)")
def test_notify_wakes_an_idle_relay_long_before_its_poll(relays: Start) -> None:
    relay = relays("--poll-interval", "5", tag="idle")
    wait_for(lambda: "listening for wake-ups" in relay.log(), 30, "the relay to LISTEN")
    time.sleep(1.0)  # let it settle into its 5 s idle wait
    event = publish("test.record", {"key": "wake"})
    wait_for(lambda: dispatched() == 1, 5, "the event to be dispatched")
    event.refresh_from_db()
    assert event.published_at is not None
    lag = (event.published_at - event.created_at).total_seconds()
    print(f"\npublish -> dispatch lag with --poll-interval 5: {lag * 1000:.0f} ms")
    assert lag < 1.0


@pytest.mark.postgres_only("ALLOW_CONNECTIONS false and pg_terminate_backend")
def test_relay_rides_out_a_database_outage(relays: Start) -> None:
    """This test database refuses connections for a while and every other session is cut:
    what a relay sees of a PostgreSQL restart, without restarting the shared server."""
    import psycopg

    from tasks_engine.db.notify import listen_params as _listen_params

    relay = relays("--poll-interval", "0.2", tag="survivor")
    wait_for(lambda: "listening for wake-ups" in relay.log(), 30, "the relay to LISTEN")
    db = connection.settings_dict["NAME"]
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        own_pid = cur.fetchone()[0]
    with psycopg.connect(**{**_listen_params(), "dbname": "postgres"}, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS false')
        try:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> %s",
                [db, own_pid],
            )
            wait_for(lambda: "database unavailable" in relay.log(), 10, "the relay to notice")
            event = publish("test.record", {"key": "during-outage"})  # our session survived
            time.sleep(2.0)  # several failed reconnects
            assert relay.proc.poll() is None, relay.log()
        finally:
            admin.execute(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS true')
    wait_for(
        lambda: OutboxEvent.objects.get(pk=event.pk).status == "dispatched",
        30,
        "the event published during the outage to be dispatched",
    )
    relay.send(signal.SIGTERM)
    assert relay.wait(30) == 0, relay.log()
    log = relay.log()
    assert log.count("database unavailable") == 1  # logged once per outage, not per retry
    assert log.count("database reachable again") == 1
    assert log.count("listener lost its connection") == 1


def test_a_route_that_kills_its_relay_ends_dead_and_spares_its_batch_mates(relays: Start) -> None:
    innocent = [publish("test.record", {"key": f"i{i}"}) for i in range(5)]
    poison = publish("test.poison", {}, max_attempts=3)
    codes = []
    for i in range(8):
        r = relays("--burst", "--batch", "10", tag=f"try{i}", env={"OUTBOX_CLAIM_SECONDS": "0"})
        codes.append(r.wait(60))
        poison.refresh_from_db()
        if poison.status == "dead":
            break
    assert poison.status == "dead"
    assert poison.attempts == 3
    assert "interrupted" in poison.last_error
    # One death per attempt, then no more; and one in its first batch, where it was not the
    # first event: no route of a batch but the first is known to have started when its relay
    # dies (on PostgreSQL the batch's transaction rolls back), so that death is charged to no one.
    assert codes.count(-signal.SIGKILL) == 4
    for event in innocent:
        event.refresh_from_db()
        assert event.status == "dispatched"
        assert not event.last_error
    keys = sorted(SideEffect.objects.values_list("key", flat=True))
    assert keys == [f"outbox:i{i}" for i in range(5)]  # each exactly once


def test_a_relay_killed_mid_route_costs_its_batch_mates_no_attempt(
    relays: Start, tmp_path: Path
) -> None:
    """A relay SIGKILLed while the first route of its batch runs: that route was called, so its
    event spent its one attempt and is dead; its batch-mates' routes never started, so they
    spent nothing and the next relay delivers every one of them (a relay that counted the
    attempt of every event at the batch's claim left them all dead, their routes never called).
    Half of them take one attempt from the event, half from OUTBOX["MAX_ATTEMPTS"]."""
    trace = tmp_path / "calls.txt"
    env = {TRACE_ENV: str(trace), "OUTBOX_CLAIM_SECONDS": "1", "TEST_OUTBOX_MAX_ATTEMPTS": "1"}
    with transaction.atomic():
        first = publish("test.record", {"key": "blocks", "sleep": 60}, max_attempts=1)
        for i in range(10):
            publish("test.record", {"key": f"b{i}"}, max_attempts=1 if i % 2 else None)
    doomed = relays("--batch", "20", "--poll-interval", "0.2", tag="doomed", env=env)
    wait_for(lambda: route_calls(trace) == ["blocks"], 30, "the first route to be running")
    doomed.send(signal.SIGKILL)
    assert doomed.wait(10) == -signal.SIGKILL
    assert dispatched() == 0

    time.sleep(1.2)  # the killed relay's claim runs out (OUTBOX_CLAIM_SECONDS)
    rescuer = relays("--burst", "--batch", "20", tag="rescuer", env=env)
    assert rescuer.wait(60) == 0, rescuer.log()
    events = {e.payload["key"]: e for e in OutboxEvent.objects.all()}
    bystanders = [events[f"b{i}"] for i in range(10)]
    assert [(e.status, e.attempts, e.last_error) for e in bystanders] == [
        ("dispatched", 1, "")
    ] * 10
    keys = Counter(SideEffect.objects.values_list("key", flat=True))
    assert keys == Counter(f"outbox:b{i}" for i in range(10))  # each delivered exactly once
    # The route that was running when its relay died spent its attempt: not called again.
    blocker = events["blocks"]
    assert blocker.pk == first.pk
    assert (blocker.status, blocker.attempts) == ("dead", 1)
    assert "interrupted" in blocker.last_error
    assert Counter(route_calls(trace)) == Counter(["blocks", *(f"b{i}" for i in range(10))])
