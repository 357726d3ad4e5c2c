from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.db import connection

from tasks_engine import clock, first_steps, flow

from .helpers import FakeClock, WorkerProcess


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test runs on both databases (process tests too: several worker processes on one
    host share the SQLite file), except those marked `postgres_only("why")` and the fault tests,
    which bring a PostgreSQL cluster of their own (they ignore DATABASE_URL, so one run of them,
    on the PostgreSQL pass, is enough)."""
    from django.conf import settings

    if settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        return
    for item in items:
        marker = item.get_closest_marker("postgres_only")
        if marker is not None:
            why = marker.args[0] if marker.args else "PostgreSQL only"
            item.add_marker(pytest.mark.skip(reason=f"PostgreSQL only: {why}"))
        elif "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(
                pytest.mark.skip(reason="runs on a throwaway PostgreSQL cluster of its own")
            )


@pytest.fixture(autouse=True)
def _no_first_step_guesses_carried_over() -> Iterator[None]:
    """What one test's runs taught first_steps.py stays in that test."""
    first_steps.reset()
    yield
    first_steps.reset()


@pytest.fixture(autouse=True)
def _no_keyed_claims_carried_over() -> Iterator[None]:
    """A test that enqueues a keyed run switches this process's claims to the guarded claim
    (flow.note_keyed): the next tests start plain again. (A test of enqueue's argument checks
    left it on, and a later test of the group's claim-along found no claim in its group.)"""
    yield
    flow.forget_keyed()


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
