"""`manage.py tasks health [--json]`: a readiness probe. Exit 0 when the database answers, every
migration is applied and every (task, version) with due pending runs has a live worker that
serves it; else exit 1, one line per problem. It writes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.recorder import MigrationRecorder
from django.test.utils import CaptureQueriesContext

import tasks_engine
from tasks_engine.db.sql import db_clock
from tasks_engine.definitions import registry
from tasks_engine.models import Worker as WorkerRow
from tasks_engine.models import WorkflowRun
from tasks_engine.services import run_groups
from tasks_engine.worker import Worker, WorkerConfig
from tests.helpers import ROOT


def health(*args: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("tasks", "health", *args, stdout=out, stderr=StringIO())
    except SystemExit as exit:
        return int(exit.code or 0), out.getvalue()
    return 0, out.getvalue()


def live_worker(*refs: tuple[str, int], queues: tuple[str, ...] = ()) -> Worker:
    workflows = tuple(registry.get(name, version) for name, version in refs)
    w = Worker(WorkerConfig(workflows=workflows, concurrency=2, queues=queues))
    w.registration.beat()
    return w


@pytest.mark.django_db
def test_a_migrated_database_without_due_runs_is_healthy() -> None:
    assert health() == (0, "ok\n")
    code, out = health("--json")
    assert (code, json.loads(out)) == (0, {"ok": True, "problems": []})


@pytest.mark.django_db
def test_due_pending_runs_with_no_worker_alive_are_a_problem() -> None:
    tasks_engine.enqueue("a", version=1)
    tasks_engine.enqueue("a", version=1)
    code, out = health()
    assert code == 1
    assert out.splitlines() == [
        "2 due pending run(s) of a@1 in queue 'default': no worker is alive"
    ]
    code, out = health("--json")
    assert code == 1 and json.loads(out) == {
        "ok": False,
        "problems": ["2 due pending run(s) of a@1 in queue 'default': no worker is alive"],
    }


@pytest.mark.django_db
def test_each_unserved_task_version_and_queue_is_one_line() -> None:
    live_worker(("a", 1), queues=("default",))
    tasks_engine.enqueue("a", version=1)  # served
    tasks_engine.enqueue("a", version=2)  # another version
    tasks_engine.enqueue("a", version=1, queue="io")  # another queue
    code, out = health()
    assert code == 1
    assert out.splitlines() == [
        "1 due pending run(s) of a@1 in queue 'io': no live worker serves it",
        "1 due pending run(s) of a@2 in queue 'default': no live worker serves it",
    ]


@pytest.mark.django_db
def test_served_runs_and_runs_not_yet_due_are_healthy() -> None:
    live_worker(("a", 1))  # every queue
    tasks_engine.enqueue("a", version=1, queue="io")
    later = tasks_engine.enqueue("b").run_id
    WorkflowRun.objects.filter(pk=later).update(available_at=db_clock() + timedelta(hours=1))
    assert health() == (0, "ok\n")


@pytest.mark.django_db
def test_the_groups_are_read_within_a_bound_and_a_capped_count_says_at_least(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each status's index is read for at most SAMPLE rows: past it the count is a lower
    bound, and a group that no worker serves is still found at the front of the claim order,
    where its never-claimed runs stay (run_groups says why)."""
    monkeypatch.setattr(run_groups, "SAMPLE", 3)
    live_worker(("a", 1))
    stuck = tasks_engine.enqueue("b").run_id  # no worker serves b: the oldest due run
    WorkflowRun.objects.filter(pk=stuck).update(available_at=db_clock() - timedelta(hours=1))
    for _ in range(5):
        tasks_engine.enqueue("a", version=1)
    code, out = health()
    assert (code, out) == (
        1,
        "at least 1 due pending run(s) of b@1 in queue 'default': no live worker serves it\n",
    )
    groups = run_groups.due_pending_groups()
    assert [(g.task, g.runs, g.at_least) for g in groups] == [("a", 2, True), ("b", 1, True)]
    assert [g.count_label for g in groups] == ["at least 2", "at least 1"]
    with CaptureQueriesContext(connection) as queries:
        run_groups.unfinished_groups()
    assert len(queries) == 1 and queries[0]["sql"].count("LIMIT 3") == 5


@pytest.mark.django_db
def test_a_dead_worker_serves_nothing() -> None:
    w = live_worker(("a", 1))
    tasks_engine.enqueue("a", version=1)
    assert health()[0] == 0
    WorkerRow.objects.filter(pk=w.id).update(last_heartbeat=db_clock() - timedelta(hours=1))
    assert health() == (
        1,
        "1 due pending run(s) of a@1 in queue 'default': no worker is alive\n",
    )


@pytest.mark.django_db
def test_an_unapplied_migration_is_a_problem() -> None:
    last = MigrationRecorder.Migration.objects.filter(app="outbox").order_by("-name").first()
    assert last is not None
    last.delete()  # as if a deploy brought a migration not run yet
    code, out = health()
    assert code == 1
    assert out.splitlines() == [
        f"1 migration(s) not applied (manage.py migrate): outbox.{last.name}"
    ]


@pytest.mark.django_db
def test_with_the_engine_s_migrations_unapplied_runs_are_not_read() -> None:
    """The runs table may not match the code yet: the migrations are the one problem."""
    MigrationRecorder.Migration.objects.filter(app="tasks_engine").delete()
    tasks_engine.enqueue("a", version=1)
    code, out = health()
    assert code == 1
    (line,) = out.splitlines()  # and no line about the run
    engine = len(list((ROOT / "tasks_engine" / "migrations").glob("0*.py")))
    assert line.startswith(f"{engine} migration(s) not applied (manage.py migrate): ")
    assert "tasks_engine.0001_initial, tasks_engine.0002" in line
    assert line.endswith(f" and {engine - 5} more")


@pytest.mark.django_db
def test_health_writes_nothing() -> None:
    live_worker(("a", 1))
    tasks_engine.enqueue("a", version=2)
    with CaptureQueriesContext(connection) as queries:
        assert health()[0] == 1
    statements = [q["sql"].lstrip().split()[0].upper() for q in queries.captured_queries]
    assert statements and set(statements) <= {"SELECT", "SAVEPOINT", "RELEASE"}, statements


def health_in_a_subprocess(url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "tasks", "health", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed once the socket is


@pytest.mark.one_db("a subprocess with a database URL of its own")
def test_an_unreachable_postgresql_is_one_line_and_exit_1(tmp_path: Path) -> None:
    url = f"postgres://postgres:probe-pw@127.0.0.1:{closed_port()}/umt"
    done = health_in_a_subprocess(url, tmp_path)
    assert done.returncode == 1, done.stderr
    (line,) = done.stdout.splitlines()
    assert line.startswith("database 'default' unreachable: ") and "Connection refused" in line
    assert "probe-pw" not in done.stdout + done.stderr
    done = health_in_a_subprocess(url, tmp_path, "--json")
    report: dict[str, Any] = json.loads(done.stdout)
    assert done.returncode == 1 and report["ok"] is False
    assert len(report["problems"]) == 1 and "unreachable" in report["problems"][0]


@pytest.mark.one_db("a subprocess with a database URL of its own")
def test_a_missing_sqlite_file_is_reported_not_created(tmp_path: Path) -> None:
    path = tmp_path / "none" / "db.sqlite3"
    done = health_in_a_subprocess(f"sqlite:///{path}", tmp_path)
    assert (done.returncode, done.stdout) == (
        1,
        f"database 'default' unreachable: the SQLite file {path} does not exist\n",
    )
    assert not path.exists()
