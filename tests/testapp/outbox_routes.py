"""Outbox routes the tests drive, in-process and in real relay processes."""

from __future__ import annotations

import os
import time

from django.db import IntegrityError, transaction

import tasks_engine
from outbox import route
from outbox.models import OutboxEvent

from .models import Marker, SideEffect

TRACE_ENV = "OUTBOX_TEST_TRACE"  # a file that records every route call, even rolled-back ones


class RouteBroken(Exception):
    pass


def trace(event: OutboxEvent) -> None:
    path = os.environ.get(TRACE_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{event.payload.get('key', event.pk)}\n")


@route("test.enqueue_noop")
def enqueue_noop(event: OutboxEvent) -> None:
    """Enqueue a `noop` run; the trace id names the relay that dispatched the event."""
    tasks_engine.enqueue("noop", {"n": event.payload["n"]}, trace_id=os.environ.get("WORKER_TAG"))


@route("test.start_run_once")
def start_run_once(event: OutboxEvent) -> None:
    """Start a `noop` run keyed by the event (`event.run_key`; none with payload "unkeyed"),
    then stop the relay here when a test asks (umt.testpoints): between the run, committed on
    the engine's database, and the event's outcome, in the relay's transaction."""
    from umt.testpoints import stop_here

    key = None if event.payload.get("unkeyed") else event.run_key
    tasks_engine.enqueue("noop", {"n": event.payload["n"]}, idempotency_key=key)
    stop_here("outbox-run-started")


@route("test.record")
def record(event: OutboxEvent) -> None:
    """Write one row per call, after an optional pause (a slow route)."""
    trace(event)
    time.sleep(float(event.payload.get("sleep", 0)))
    SideEffect.objects.create(
        key=f"outbox:{event.payload['key']}", worker=os.environ.get("WORKER_TAG", "")
    )


@route("test.always_fails")
def always_fails(event: OutboxEvent) -> None:
    raise RouteBroken(f"route is broken (attempt {event.attempts})")


@route("test.write_then_fail")
def write_then_fail(event: OutboxEvent) -> None:
    SideEffect.objects.create(key=f"outbox:{event.payload['key']}")
    raise RouteBroken("failed after writing")


@route("test.flaky")
def flaky(event: OutboxEvent) -> None:
    """Fails on the first `fail_times` attempts, then writes a row."""
    if event.attempts <= event.payload["fail_times"]:
        raise RouteBroken(f"flaky failure on attempt {event.attempts}")
    SideEffect.objects.create(key=f"outbox:{event.payload['key']}")


@route("test.needs_marker")
def needs_marker(event: OutboxEvent) -> None:
    """Fails until a Marker with the payload's key exists (someone fixed the outside world)."""
    key = event.payload["key"]
    if not Marker.objects.filter(key=key).exists():
        raise RouteBroken(f"marker {key!r} is missing")
    SideEffect.objects.create(key=f"outbox:{key}")


@route("test.swallows_db_error")
def swallows_db_error(event: OutboxEvent) -> None:
    """Catches an IntegrityError from an atomic block without a savepoint, then returns."""
    SideEffect.objects.create(key=f"outbox:{event.payload['key']}")
    try:
        with transaction.atomic(savepoint=False):
            Marker.objects.create(key="twice")
            Marker.objects.create(key="twice")
    except IntegrityError:
        pass


@route("test.poison")
def poison(event: OutboxEvent) -> None:
    """Kills the relay process that dispatches it, every time."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


HOOKS: dict[str, object] = {}  # payload["hook"] -> a callable of the event, set by a test


@route("test.hook")
def hook(event: OutboxEvent) -> None:
    """Calls the test's hook named in the payload (to block, or to move a fake clock), then
    writes a row as test.record does."""
    call = HOOKS[event.payload["hook"]]
    assert callable(call)
    call(event)
    SideEffect.objects.create(key=f"outbox:{event.payload['key']}")
