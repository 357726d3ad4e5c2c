"""SQLite, the embedded default, has one write lock: the atomic-step bound, planner statistics,
per-event relay transactions, and the checks that go with them."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.test import override_settings

import tasks_engine
from outbox import publish
from outbox.relay import relay_once
from outbox.routes import registry as routes
from tasks_engine import clock
from tasks_engine.checks import check_settings
from tasks_engine.db import sqlite_bounds
from tasks_engine.definitions import registry
from tasks_engine.models import StepAttempt, WorkflowRun
from tasks_engine.transitions.claims import ClaimRequest, claim_sql
from tests.helpers import ROOT, drain, wait_for
from tests.testapp import sqlite_workflows
from tests.testapp.models import Marker

ON_SQLITE = settings.DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3"
sqlite_only = pytest.mark.skipif(not ON_SQLITE, reason="SQLite only")

RUN = WorkflowRun._meta.db_table


def engine(**overrides: Any) -> Any:
    return override_settings(TASKS_ENGINE={**settings.TASKS_ENGINE, **overrides})


@pytest.fixture
def held() -> Iterator[None]:
    sqlite_workflows.entered.clear()
    sqlite_workflows.release.clear()
    yield
    sqlite_workflows.release.set()


def watchdogs() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tasks-sqlite-atomic-bound"]


def failed_with(run_id: Any) -> dict[str, Any]:
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == "failed", (run.status, run.output, run.error)
    step = StepAttempt.objects.get(run_id=run_id, name="hold")
    assert step.status == "failed" and step.error["terminal"] is True  # not retried
    assert run.error is not None
    return run.error


# -- the atomic step's bound ------------------------------------------------------------------


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_atomic_step_past_the_bound_releases_the_lock_and_fails(held: None) -> None:
    """The step waits (10 s at most) holding the write lock; another connection's write gets
    through once the bound (0.5 s) passes, long before the step returns; the step's writes,
    before and after that moment, are rolled back and the run fails at once, no retry."""
    run = tasks_engine.enqueue("sqlite_atomic_hold", {"key": "held", "hold": 10, "write_after": 1})
    other: dict[str, float] = {}

    def other_writer() -> None:
        try:
            assert sqlite_workflows.entered.wait(10)
            started = time.monotonic()
            Marker.objects.create(key="other")  # waits for the write lock the step holds
            other["waited"] = time.monotonic() - started
        finally:
            connection.close()
            sqlite_workflows.release.set()  # only now does the step's code go on

    thread = threading.Thread(target=other_writer)
    thread.start()
    started = time.monotonic()
    with engine(SQLITE_ATOMIC_STEP_SECONDS=0.5):
        assert drain() == ["failed"]
    thread.join(10)
    assert other["waited"] < 2.0  # the bound, not the step's 10 s
    assert time.monotonic() - started < 5
    assert sorted(Marker.objects.values_list("key", flat=True)) == ["other"]
    error = failed_with(run.run_id)
    assert error["type"] == "tasks_engine.exceptions.AtomicStepTimeoutError"
    assert "atomic step 'hold'" in error["message"]
    assert "SQLITE_ATOMIC_STEP_SECONDS" in error["message"] and "0.5s" in error["message"]
    wait_for(lambda: not watchdogs(), timeout=5, what="the watchdog thread to end")


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_a_statement_running_past_the_bound_is_interrupted(held: None) -> None:
    run = tasks_engine.enqueue("sqlite_atomic_hold", {"key": "counts", "statement": True})
    started = time.monotonic()
    with engine(SQLITE_ATOMIC_STEP_SECONDS=0.3):
        assert drain() == ["failed"]
    assert time.monotonic() - started < 5  # the statement alone would never end
    assert not Marker.objects.exists()
    assert failed_with(run.run_id)["type"] == "tasks_engine.exceptions.AtomicStepTimeoutError"


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_the_workflow_can_catch_the_bound_and_go_on(held: None) -> None:
    run = tasks_engine.enqueue("sqlite_atomic_catches", {"key": "caught", "hold": 1.0})
    with engine(SQLITE_ATOMIC_STEP_SECONDS=0.2):
        assert drain() == ["completed"]
    assert WorkflowRun.objects.get(pk=run.run_id).output == "caught AtomicStepTimeoutError"
    assert not Marker.objects.exists()


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_an_atomic_step_within_the_bound_commits(held: None) -> None:
    sqlite_workflows.release.set()
    run = tasks_engine.enqueue("sqlite_atomic_hold", {"key": "quick", "hold": 10})
    with engine(SQLITE_ATOMIC_STEP_SECONDS=5):
        assert drain() == ["completed"]
    assert WorkflowRun.objects.get(pk=run.run_id).output == "committed"
    assert Marker.objects.filter(key="quick").exists()
    wait_for(lambda: not watchdogs(), timeout=5, what="the watchdog thread to end")


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_a_disabled_bound_lets_the_step_commit_late(held: None) -> None:
    run = tasks_engine.enqueue("sqlite_atomic_hold", {"key": "late", "hold": 0.5})
    with engine(SQLITE_ATOMIC_STEP_SECONDS=None):
        assert drain() == ["completed"]
    assert WorkflowRun.objects.get(pk=run.run_id).output == "committed"


@pytest.mark.django_db
def test_the_bound_applies_on_sqlite_only() -> None:
    assert (sqlite_bounds.atomic_step_bound() == 5.0) is ON_SQLITE
    with engine(SQLITE_ATOMIC_STEP_SECONDS=0):
        assert sqlite_bounds.atomic_step_bound() is None


@pytest.mark.django_db
def test_a_worker_lease_caps_the_bound_at_a_third(monkeypatch: pytest.MonkeyPatch) -> None:
    """runworker --lease-seconds 6 with the default 5 s bound let an atomic step hold the lock
    past other workers' leases: in a worker the bound follows the lease it actually uses."""
    monkeypatch.setattr(sqlite_bounds, "_worker_lease", None)
    assert (sqlite_bounds.bound_by_lease(6.0) == 2.0) is ON_SQLITE
    assert (sqlite_bounds.bound_by_lease(30.0) == 5.0) is ON_SQLITE  # the setting is shorter
    with engine(SQLITE_ATOMIC_STEP_SECONDS=None):
        assert sqlite_bounds.bound_by_lease(6.0) is None  # disabled stays disabled (W001)


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_the_bound_cut_by_the_lease_says_so(held: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_bounds, "_worker_lease", None)
    sqlite_bounds.bound_by_lease(0.9)
    run = tasks_engine.enqueue("sqlite_atomic_hold", {"key": "cut", "hold": 1})
    assert drain() == ["failed"]  # under the 5 s setting, 1 s would have committed
    assert not Marker.objects.exists()
    message = failed_with(run.run_id)["message"]
    assert "0.3s" in message and "a third of the worker's 0.9s lease" in message, message


# -- durability -------------------------------------------------------------------------------


@sqlite_only
@pytest.mark.skipif("SQLITE_SYNCHRONOUS" in os.environ, reason="SQLITE_SYNCHRONOUS is set")
@pytest.mark.django_db
def test_every_commit_is_synced_by_default() -> None:
    with connection.cursor() as cur:
        cur.execute("PRAGMA synchronous")
        assert cur.fetchone()[0] == 2  # FULL
        cur.execute("PRAGMA journal_mode")
        assert cur.fetchone()[0] == "wal"


@pytest.mark.parametrize(("value", "level"), [("normal", "1"), ("FULL", "2"), ("off", None)])
def test_sqlite_synchronous_comes_from_the_environment(
    tmp_path: Path, value: str, level: str | None
) -> None:
    script = (
        "import django; django.setup(); from django.db import connection; "
        "c = connection.cursor(); c.execute('PRAGMA synchronous'); print(c.fetchone()[0])"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "umt.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "SQLITE_SYNCHRONOUS": value,
    }
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True
    )
    if level is None:
        assert out.returncode != 0
        assert "SQLITE_SYNCHRONOUS must be full or normal, not 'OFF'" in out.stderr
    else:
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == level


# -- a plain DATABASES entry ------------------------------------------------------------------

STARTPROJECT = {"ENGINE": "django.db.backends.sqlite3"}  # what startproject writes, NAME aside


@pytest.fixture
def plain_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, django_db_blocker: Any
) -> Iterator[Any]:
    """The engine's alias configured by `DATABASES` alone, to a new file, beside the test
    database (on either pass): `configure(**OPTIONS)` gives this thread's connection, every
    thread its own, and `transaction.atomic()` uses them."""
    import django.db.transaction
    from django.db.utils import ConnectionHandler

    handlers: list[Any] = []

    def configure(**options: Any) -> Any:
        db = {**STARTPROJECT, "NAME": str(tmp_path / "plain.sqlite3")}
        handler = ConnectionHandler({"default": {**db, "OPTIONS": options} if options else db})
        handlers.append(handler)
        monkeypatch.setattr(django.db.transaction, "connections", handler)
        return handler["default"]

    with django_db_blocker.unblock():
        yield configure
        for handler in handlers:
            handler.close_all()


def pragmas(conn: Any) -> dict[str, Any]:
    with conn.cursor() as cur:
        found = {}
        for name in ("journal_mode", "busy_timeout", "synchronous"):
            cur.execute(f"PRAGMA {name}")
            found[name] = cur.fetchone()[0]
    return {**found, "transaction_mode": conn.transaction_mode}


def test_a_plain_sqlite_database_gets_the_engines_connection_settings(plain_database: Any) -> None:
    """startproject's DATABASES (no OPTIONS): BEGIN IMMEDIATE, a 30 s busy timeout, WAL and
    synchronous=FULL all the same, so that W026 need not ask for them."""
    assert pragmas(plain_database()) == {
        "journal_mode": "wal",
        "busy_timeout": 30_000,
        "synchronous": 2,  # FULL
        "transaction_mode": "IMMEDIATE",
    }


def test_the_projects_own_sqlite_options_win(plain_database: Any) -> None:
    conn = plain_database(
        transaction_mode="EXCLUSIVE",
        timeout=7,
        init_command="PRAGMA journal_mode=TRUNCATE; PRAGMA synchronous=NORMAL;",
    )
    assert pragmas(conn) == {
        "journal_mode": "truncate",
        "busy_timeout": 7_000,
        "synchronous": 1,  # NORMAL
        "transaction_mode": "EXCLUSIVE",
    }
    # one left out is still the engine's
    assert pragmas(plain_database(timeout=7))["transaction_mode"] == "IMMEDIATE"


def test_a_second_writer_on_a_plain_sqlite_database_waits_instead_of_failing(
    plain_database: Any,
) -> None:
    """The writer that read first, then wrote after another connection had committed, failed
    at once with "database is locked" (a deferred BEGIN cannot upgrade a stale read); with
    BEGIN IMMEDIATE it holds the write lock from the start and the other writer waits."""
    with plain_database().cursor() as cur:
        cur.execute("CREATE TABLE counted (n integer)")
    read, written = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def in_thread(body: Any) -> Any:
        def run() -> None:
            try:
                body()
            except (DatabaseError, AssertionError) as exc:  # reported below
                failures.append(exc)
            finally:
                transaction.get_connection().close()

        return threading.Thread(target=run)

    def read_then_write() -> None:
        with transaction.atomic(), transaction.get_connection().cursor() as cur:
            cur.execute("SELECT count(*) FROM counted")
            read.set()
            written.wait(1)  # the other writer commits meanwhile, or waits for this one
            cur.execute("INSERT INTO counted VALUES (1)")

    def write() -> None:
        assert read.wait(10)
        with transaction.atomic(), transaction.get_connection().cursor() as cur:
            cur.execute("INSERT INTO counted VALUES (2)")
        written.set()

    threads = [in_thread(read_then_write), in_thread(write)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert failures == []
    with plain_database().cursor() as cur:
        cur.execute("SELECT n FROM counted ORDER BY rowid")
        assert [n for (n,) in cur.fetchall()] == [1, 2]


# -- checks -----------------------------------------------------------------------------------


def check_ids(**overrides: Any) -> list[str]:
    with engine(**overrides):
        return [m.id for m in check_settings() if m.id]


def test_a_sound_bound_is_not_reported() -> None:
    assert check_ids() == []
    assert check_ids(SQLITE_ATOMIC_STEP_SECONDS=15, LEASE_SECONDS=30) == []


def test_a_disabled_or_too_long_bound_is_a_warning_on_sqlite() -> None:
    expected = ["tasks_engine.W001"] if ON_SQLITE else []
    assert check_ids(SQLITE_ATOMIC_STEP_SECONDS=None) == expected
    assert check_ids(SQLITE_ATOMIC_STEP_SECONDS=0) == expected
    assert check_ids(SQLITE_ATOMIC_STEP_SECONDS=16, LEASE_SECONDS=30) == expected
    assert check_ids(SQLITE_ATOMIC_STEP_SECONDS=-1) == ["tasks_engine.E005"]


# -- planner statistics -----------------------------------------------------------------------


def claim_plan(conn: Any) -> str:
    req = ClaimRequest("w", registry.pairs(), None, 1, 30.0)
    sql, params = claim_sql(req, clock.now())
    with conn.cursor() as cur:
        cur.execute(f"EXPLAIN QUERY PLAN {sql}", params)
        return "\n".join(str(row[-1]) for row in cur.fetchall())


def uses_the_claim_indexes(plan: str) -> bool:
    return all(
        re.search(rf"USING INDEX {index}(\s|$)", plan)
        for index in ("run_lease_expiry", "run_wake_due", "run_claim_pending")
    ) and ("run_status_created" not in plan)


@sqlite_only
@pytest.mark.django_db
def test_after_migrate_the_claim_reads_its_partial_indexes() -> None:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM sqlite_stat1 WHERE tbl = %s", [RUN])
        assert cur.fetchone()[0] > 0
    plan = claim_plan(connection)
    assert uses_the_claim_indexes(plan), plan


@sqlite_only
@pytest.mark.django_db
def test_the_outbox_registers_its_own_statistics_hints() -> None:
    """The outbox's events get hints from the outbox's ready(), not from the engine naming the
    outbox's model: with no rows for ANALYZE to count, the relay's indexes get the seeds."""
    from outbox.models import SQLITE_HINTS, OutboxEvent

    assert sqlite_bounds.optimize(connection) is True
    with connection.cursor() as cur:
        cur.execute(
            "SELECT idx, stat FROM sqlite_stat1 WHERE tbl = %s", [OutboxEvent._meta.db_table]
        )
        stats = dict(cur.fetchall())
    assert stats == dict(SQLITE_HINTS.seeds)


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_optimize_reaches_connections_that_are_already_open() -> None:
    """A worker's connections live as long as it does: new statistics must reach them, and
    ANALYZE alone reaches only its own connection."""
    other = sqlite3.connect(
        connection.settings_dict["NAME"], isolation_level=None, cached_statements=0
    )
    try:
        # A database that never had statistics (made before this release).
        with connection.cursor() as cur:
            cur.execute("DELETE FROM sqlite_stat1 WHERE tbl = %s", [RUN])
        assert "run_status_created" in claim_plan(_Raw(other))  # why the claim was slow
        for i in range(50):
            tasks_engine.enqueue("noop", {"n": i})
        assert sqlite_bounds.optimize(connection) is True
        # EXPLAIN alone does not look at the schema cookie; any real statement does.
        other.execute(f"SELECT count(*) FROM {RUN}").fetchall()
        assert uses_the_claim_indexes(claim_plan(_Raw(other)))
        with connection.cursor() as cur:  # real statistics now, not the seeds
            cur.execute("SELECT stat FROM sqlite_stat1 WHERE idx = 'run_claim_pending'")
            assert cur.fetchone()[0].startswith("50 ")
    finally:
        other.close()


class _Raw:
    """A plain sqlite3 connection with Django's `%(name)s` placeholders."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def cursor(self) -> Any:
        conn = self.conn

        class Cursor:
            def __enter__(self) -> Any:
                self.cur = conn.cursor()
                return self

            def __exit__(self, *exc: object) -> None:
                self.cur.close()

            def execute(self, sql: str, params: dict[str, Any]) -> None:
                self.cur.execute(re.sub(r"%\((\w+)\)s", r":\1", sql), params)

            def fetchall(self) -> list[Any]:
                return self.cur.fetchall()

        return Cursor()


@sqlite_only
@pytest.mark.django_db
def test_optimize_runs_once_a_period(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_bounds, "_next_optimize", None)
    assert sqlite_bounds.optimize_periodically(connection) is True
    assert sqlite_bounds.optimize_periodically(connection) is False
    monkeypatch.setattr(sqlite_bounds, "_next_optimize", time.monotonic() - 1)
    assert sqlite_bounds.optimize_periodically(connection) is True


@pytest.mark.django_db
def test_optimize_is_a_no_op_on_postgresql() -> None:
    assert sqlite_bounds.optimize(connection) is ON_SQLITE


# -- the relay --------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_relay_commits_each_event_alone_on_sqlite_and_the_batch_on_postgresql() -> None:
    """The route still runs inside the transaction that marks its event dispatched; on SQLite
    that transaction ends before the next event's route starts."""
    log: list[str] = []

    def route(event: Any) -> None:
        n = event.payload["n"]
        log.append(f"route {n}")
        transaction.on_commit(lambda: log.append(f"commit {n}"))

    routes.register("test.commit_order", route)
    try:
        for n in range(3):
            publish("test.commit_order", {"n": n})
        assert relay_once(10).dispatched == 3
    finally:
        routes.unregister("test.commit_order")
    if ON_SQLITE:
        assert log == ["route 0", "commit 0", "route 1", "commit 1", "route 2", "commit 2"]
    else:
        assert log == ["route 0", "route 1", "route 2", "commit 0", "commit 1", "commit 2"]
