"""Which tests run on which database: a marker, not a guess.

`make test` runs the suite twice, on PostgreSQL (the production database) and then on SQLite.
A test whose behaviour can depend on the database's dialect runs on both passes: anything that
claims, writes run state, takes locks or uses transactions, SQLite's single write lock, the
relay's per-event transactions, the admin's queries (lookups differ by dialect), several
processes sharing one SQLite file. That is the default: an unmarked test runs on both, and
`both_dbs` says so explicitly where it overrides a module's `one_db`.

A test marked `one_db("why")` does not depend on the dialect (pure argument parsing, docs
reference checks, the import graph, log records and their redaction, pure-Python helpers, a
process test whose point is not the database): it runs once, on the PostgreSQL pass. Its
SQLite run is skipped only when ONE_DB_TESTS_ON_PG=1 says that this run's PostgreSQL pass runs
it (`make test` sets it when PostgreSQL is reachable); `make test-sqlite`, `make test-fast` and
a plain `pytest` on SQLite run it. The closest marker wins: a `both_dbs` test in a `one_db`
module runs on both. When in doubt, both.

After a `transaction=True` test on PostgreSQL the tables are emptied with DELETE, not with
Django's flush (a TRUNCATE of every table): see `_rows_deleted_after_transactional_tests`.

Tests marked `postgres_only("why")` need PostgreSQL itself and are skipped on SQLite, as are
the fault tests, which bring a PostgreSQL cluster of their own (they ignore DATABASE_URL, so
one run of them, on the PostgreSQL pass, is enough).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import django
import pytest
from django.core.management.sql import emit_post_migrate_signal
from django.db import connection, connections, transaction
from django.test import TransactionTestCase

from tasks_engine import clock
from tasks_engine.conf import django_has_tasks
from tasks_engine.transitions import claim_floor, claim_mode, first_steps, queue_state

from .helpers import FakeClock, WorkerProcess

# Django 5.2 LTS has no tasks framework (django.tasks is new in 6.0): the tests of the engine's
# django.tasks backend need it, everything else runs on 5.2 too (make test-django52).
DJANGO_TASKS_TESTS = ["django_tasks", "engine/api/test_backend.py", "process/test_backend.py"]
assert all((Path(__file__).parent / p).exists() for p in DJANGO_TASKS_TESTS), "a path moved"
collect_ignore = [] if django_has_tasks() else DJANGO_TASKS_TESTS


def pytest_report_header(config: pytest.Config) -> str | None:
    if django_has_tasks():
        return None
    left_out = ", ".join(f"tests/{path}" for path in DJANGO_TASKS_TESTS)
    return f"Django {django.get_version()} has no django.tasks (new in 6.0): left out {left_out}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from django.conf import settings

    if settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        return
    one_db_on_pg = os.environ.get("ONE_DB_TESTS_ON_PG") == "1"
    for item in items:
        marker = item.get_closest_marker("postgres_only")
        if marker is not None:
            why = marker.args[0] if marker.args else "PostgreSQL only"
            item.add_marker(pytest.mark.skip(reason=f"PostgreSQL only: {why}"))
        elif "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(
                pytest.mark.skip(reason="runs on a throwaway PostgreSQL cluster of its own")
            )
        elif one_db_on_pg and (why := one_db_reason(item)) is not None:
            item.add_marker(pytest.mark.skip(reason=f"one database, run on PostgreSQL: {why}"))


def one_db_reason(item: pytest.Item) -> str | None:
    """The reason of the item's closest `one_db` marker; None if a `both_dbs` is closer, or
    if it has neither."""
    for marker in item.iter_markers():
        if marker.name == "both_dbs":
            return None
        if marker.name == "one_db":
            return str(marker.args[0]) if marker.args else "does not depend on the dialect"
    return None


@pytest.fixture(autouse=True, scope="session")
def _rows_deleted_after_transactional_tests() -> Iterator[None]:
    """pytest-django empties the database after each `transaction=True` test with Django's
    flush: one TRUNCATE of every table, then post_migrate (which creates the content types and
    permissions again). On PostgreSQL a TRUNCATE gives every table and index new files, which
    costs several times what deleting the few rows a test leaves costs (0.2-0.8 s against
    0.05-0.16 s per test on this machine). The rows are deleted instead, in one transaction
    (the foreign keys are deferred); the rest is flush's: every model table emptied, sequences
    kept, post_migrate sent. Anything else (available_apps, serialized rollback, SQLite) is
    left to flush."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TransactionTestCase, "_fixture_teardown", _delete_rows_or_flush)
        yield


_flush = TransactionTestCase._fixture_teardown  # type: ignore[attr-defined]


def _delete_rows_or_flush(case: TransactionTestCase) -> None:
    aliases = case._databases_names(include_mirrors=False)  # type: ignore[attr-defined]
    if (
        case.available_apps is not None
        or case.serialized_rollback
        or any(connections[alias].vendor != "postgresql" for alias in aliases)
    ):
        _flush(case)
        return
    for alias in aliases:
        _delete_every_row(alias)
        emit_post_migrate_signal(0, False, alias)


def _delete_every_row(alias: str) -> None:
    conn = connections[alias]
    tables = conn.introspection.django_table_names(only_existing=True, include_views=False)
    with transaction.atomic(using=alias), conn.cursor() as cur:
        cur.execute("SET CONSTRAINTS ALL DEFERRED")
        for table in tables:
            cur.execute(f"DELETE FROM {conn.ops.quote_name(table)}")


@pytest.fixture(autouse=True)
def _no_first_step_guesses_carried_over() -> Iterator[None]:
    """What one test's runs taught transitions/first_steps.py stays in that test."""
    first_steps.reset()
    yield
    first_steps.reset()


@pytest.fixture(autouse=True)
def _no_keyed_claims_carried_over() -> Iterator[None]:
    """A test that enqueues a keyed run switches this process's claims to the guarded claim
    (claim_mode.note_keyed): the next tests start plain again. (A test of enqueue's argument checks
    left it on, and a later test of the group's claim-along found no claim in its group.)"""
    yield
    claim_mode.forget_keyed()


@pytest.fixture(autouse=True)
def _no_claim_floor_carried_over() -> Iterator[None]:
    """A partitioned test database's claim floor (transitions/claim_floor.py) is computed again
    in each test: another test's database had other periods."""
    claim_floor.forget()
    yield
    claim_floor.forget()


@pytest.fixture(autouse=True)
def _no_queue_state_carried_over() -> Iterator[None]:
    """A test's paused queues and limit overrides are rows its end removes: the next test
    reads the queue table again instead of this process's snapshot (queues/state.py)."""
    queue_state.reset()
    yield
    queue_state.reset()


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock(datetime.now(UTC))
    monkeypatch.setattr(clock, "now", fake.now)
    return fake


@pytest.fixture
def workers(tmp_path: Path, transactional_db: None) -> Iterator[object]:
    """Start real `manage.py runworker` processes; all are killed at teardown."""
    started: list[WorkerProcess] = []

    def start(
        *args: str, tag: str | None = None, env: dict[str, str] | None = None
    ) -> WorkerProcess:
        w = WorkerProcess(["runworker", *args], tmp_path, tag or f"w{len(started)}", env or {})
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()
    connection.close()


@pytest.fixture
def is_postgres() -> bool:
    return connection.vendor == "postgresql"
