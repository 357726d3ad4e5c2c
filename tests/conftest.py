from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.db import connection

from tasks_engine import clock

from .helpers import FakeClock, WorkerProcess


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from django.conf import settings

    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        skip = pytest.mark.skip(reason="process-level tests run on PostgreSQL")
        for item in items:
            if "process" in item.keywords:
                item.add_marker(skip)


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
