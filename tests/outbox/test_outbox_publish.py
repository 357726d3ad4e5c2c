"""outbox.publish: transactional writes, idempotency keys, payload checks, the relay wake-up."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time
from datetime import datetime

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from outbox import publish
from outbox.models import EventStatus, OutboxEvent
from outbox.relay import relay_once
from tests.helpers import ROOT
from tests.testapp.models import Marker, SideEffect

pytestmark = pytest.mark.django_db


class Rollback(Exception):
    pass


def test_publish_in_a_rolled_back_transaction_leaves_no_event() -> None:
    with pytest.raises(Rollback), transaction.atomic():
        Marker.objects.create(key="plan:1")
        publish("test.record", {"key": "gone"}, idempotency_key="plan:1")
        raise Rollback
    assert not OutboxEvent.objects.exists()
    assert relay_once(10).claimed == 0
    assert not SideEffect.objects.exists()


def test_committed_publish_is_dispatched_by_the_relay() -> None:
    with transaction.atomic():
        Marker.objects.create(key="plan:2")
        event = publish("test.record", {"key": "kept"})
    assert (event.status, event.attempts, event.max_attempts) == ("pending", 0, None)
    assert event.next_attempt_at == event.created_at
    counts = relay_once(10)
    assert (counts.claimed, counts.dispatched) == (1, 1)
    event.refresh_from_db()
    assert event.status == EventStatus.DISPATCHED
    assert event.attempts == 1
    assert event.published_at is not None and event.published_at >= event.created_at
    assert SideEffect.objects.filter(key="outbox:kept").count() == 1


def test_same_idempotency_key_returns_the_existing_event() -> None:
    first = publish("test.record", {"key": "a"}, idempotency_key="k1")
    again = publish("test.record", {"key": "different"}, idempotency_key="k1")
    assert again.pk == first.pk
    assert again.payload == {"key": "a"}
    assert OutboxEvent.objects.count() == 1
    other = publish("test.record", {"key": "a"}, idempotency_key="k2")
    assert other.pk != first.pk


@pytest.mark.django_db(transaction=True)
def test_concurrent_duplicate_key_inside_a_caller_transaction_keeps_it_usable() -> None:
    """Two publishers race for one key: the loser's insert waits on the unique index, fails in
    publish()'s savepoint once the winner commits, and the loser's own transaction goes on."""
    if connection.vendor != "postgresql":
        pytest.skip("needs concurrent writers (PostgreSQL)")
    winner_in = threading.Event()
    release = threading.Event()
    seen: dict[str, int] = {}

    def winner() -> None:
        with transaction.atomic():
            seen["winner"] = publish("test.record", {"key": "w"}, idempotency_key="race").pk
            winner_in.set()
            release.wait(10)
        connection.close()

    def loser() -> None:
        with transaction.atomic():
            Marker.objects.create(key="before")
            seen["loser"] = publish("test.record", {"key": "l"}, idempotency_key="race").pk
            Marker.objects.create(key="after")
        connection.close()

    threads = [threading.Thread(target=winner)]
    threads[0].start()
    assert winner_in.wait(10)
    threads.append(threading.Thread(target=loser))
    threads[1].start()
    time.sleep(0.3)
    assert threads[1].is_alive(), "the loser should be waiting on the unique index"
    release.set()
    for t in threads:
        t.join(10)
    assert seen["loser"] == seen["winner"]
    assert OutboxEvent.objects.count() == 1
    assert set(Marker.objects.values_list("key", flat=True)) == {"before", "after"}


def test_unique_key_is_enforced_by_the_database() -> None:
    publish("test.record", {}, idempotency_key="db-unique")
    with pytest.raises(IntegrityError), transaction.atomic():
        OutboxEvent.objects.create(
            type="x",
            idempotency_key="db-unique",
            next_attempt_at=datetime.now().astimezone(),
            created_at=datetime.now().astimezone(),
        )


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        ({"when": datetime(2024, 1, 1)}, TypeError),
        ({"obj": object()}, TypeError),
        ({1, 2}, TypeError),
        ({"x": math.nan}, ValueError),
        ({"x": math.inf}, ValueError),
        ({"x": "a\x00b"}, ValueError),  # jsonb cannot hold it: refused on SQLite as well
        ({"a\x00": 1}, ValueError),
    ],
)
def test_payload_must_be_json_serialisable(payload: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="not JSON-serialisable"):
        publish("test.record", payload)
    assert not OutboxEvent.objects.exists()


def test_payload_is_stored_as_the_route_will_see_it() -> None:
    event = publish("test.record", {"key": "t", "pair": (1, 2), 3: "int key"})
    assert event.payload == {"key": "t", "pair": [1, 2], "3": "int key"}
    event.refresh_from_db()
    assert event.payload == {"key": "t", "pair": [1, 2], "3": "int key"}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"type": ""},
        {"type": "x" * 201},
        {"idempotency_key": ""},
        {"max_attempts": 0},
        {"max_attempts": True},
        {"max_attempts": 1.5},
    ],
)
def test_bad_arguments_raise_value_error_and_write_nothing(kwargs: dict) -> None:
    args = {"type": "test.record", **kwargs}
    event_type = args.pop("type")
    with pytest.raises(ValueError):
        publish(event_type, {}, **args)
    assert not OutboxEvent.objects.exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"type": "a\x00b"}, "outbox event type must not contain a NUL character"),
        ({"idempotency_key": "k\x00"}, "idempotency_key must not contain a NUL character"),
        ({"max_attempts": 2**31}, "max_attempts must be an integer from 1 to 2147483647"),
        ({"max_attempts": 2**63}, "max_attempts must be an integer from 1 to 2147483647"),
    ],
)
def test_values_the_columns_cannot_hold_are_refused_before_any_statement(
    kwargs: dict, message: str
) -> None:
    """They reached the INSERT: a DataError on PostgreSQL, a NUL stored on SQLite, an
    OverflowError for 2**63."""
    args = {"type": "test.record", **kwargs}
    event_type = args.pop("type")
    with CaptureQueriesContext(connection) as queries, pytest.raises(ValueError, match=message):
        publish(event_type, {}, **args)
    assert len(queries) == 0
    assert not OutboxEvent.objects.exists()


def test_the_largest_max_attempts_the_column_holds_is_stored() -> None:
    assert publish("test.record", {}, max_attempts=2**31 - 1).max_attempts == 2**31 - 1


def test_own_max_attempts_is_stored() -> None:
    assert publish("test.record", {}, max_attempts=3).max_attempts == 3


def test_outbox_package_is_import_safe_before_apps_load() -> None:
    code = (
        "import outbox; from outbox import route; "
        "assert callable(route); assert 'publish' in outbox.__all__"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.django_db(transaction=True)
def test_publish_notifies_the_relay_only_on_commit() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("NOTIFY is PostgreSQL only")
    import psycopg

    from outbox.notify import CHANNEL
    from tasks_engine.db.notify import listen_params as _listen_params

    with psycopg.connect(**_listen_params(), autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        with pytest.raises(Rollback), transaction.atomic():
            publish("test.record", {"key": "x"})
            raise Rollback
        assert list(listener.notifies(timeout=0.3, stop_after=1)) == []
        with transaction.atomic():
            for i in range(3):
                publish("test.record", {"key": i})
        got = list(listener.notifies(timeout=0.5, stop_after=2))
        assert [n.channel for n in got] == [CHANNEL]  # folded into one per transaction
