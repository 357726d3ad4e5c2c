"""manage.py check reports misconfiguration before it shows at run time (tasks_engine/checks.py):
settings the database in use ignores or cannot honour, a lease too short for its heartbeats,
a queue name that looks misspelt; runworker checks its own arguments the same way."""

from __future__ import annotations

from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from tasks_engine import TaskContext, workflow
from tasks_engine.checks import (
    check_durable_backend_has_django_tasks,
    check_misconfiguration,
    worker_checks,
)
from tasks_engine.conf import django_has_tasks
from tasks_engine.definitions import registry
from tasks_engine.models import WorkflowRun

SQLITE = "django.db.backends.sqlite3"
POSTGRES = "django.db.backends.postgresql"
IMMEDIATE = {"transaction_mode": "IMMEDIATE", "timeout": 30}


def ids(found: list[Any]) -> list[str]:
    return sorted(m.id for m in found)


@pytest.fixture
def engine(settings: Any) -> Iterator[Any]:
    """Set TASKS_ENGINE for one test (a copy of the project's)."""

    def configure(**values: Any) -> None:
        settings.TASKS_ENGINE = {**django_settings.TASKS_ENGINE, **values}

    yield configure


@pytest.fixture
def database(monkeypatch: pytest.MonkeyPatch) -> Any:
    """What the default database's settings say (the checks read settings, not the
    connection, so the other database's case is checked on either)."""

    def configure(engine: str, **options: Any) -> None:
        monkeypatch.setitem(django_settings.DATABASES["default"], "ENGINE", engine)
        for key, value in options.items():
            monkeypatch.setitem(django_settings.DATABASES["default"], key, value)

    return configure


@pytest.fixture
def odd_queue() -> Iterator[str]:
    @workflow(name="checks_odd_queue", queue="reports")
    def odd(ctx: TaskContext) -> None:
        return None

    yield "checks_odd_queue"
    registry.unregister("checks_odd_queue", 1)


def test_the_project_settings_pass_clean_on_either_database() -> None:
    assert check_misconfiguration() == []


def test_a_lease_shorter_than_three_heartbeats_is_a_warning(engine: Any) -> None:
    engine(LEASE_SECONDS=20, HEARTBEAT_SECONDS=8)
    (found,) = check_misconfiguration()
    assert found.id == "tasks_engine.W020" and "three heartbeats" in found.msg
    assert "24s" in found.hint
    engine(LEASE_SECONDS=24, HEARTBEAT_SECONDS=8)
    assert check_misconfiguration() == []
    engine(LEASE_SECONDS=20, HEARTBEAT_SECONDS=None)  # a third of the lease, by default
    assert check_misconfiguration() == []


def test_postgres_only_settings_on_sqlite_are_warned_as_ignored(engine: Any, database: Any) -> None:
    database(SQLITE, OPTIONS=IMMEDIATE)
    engine(NOTIFY=True, PREPARED_STATEMENTS=True, GROUP_COMMIT=False)
    found = check_misconfiguration()
    assert ids(found) == ["tasks_engine.W021", "tasks_engine.W021"]
    notify = next(m for m in found if "NOTIFY" in m.msg)
    assert "ignored on SQLite" in notify.msg and "poll" in notify.msg
    engine(NOTIFY=False, PREPARED_STATEMENTS=False)  # said off: nothing to warn about
    assert check_misconfiguration() == []
    database(POSTGRES)
    engine(NOTIFY=True, PREPARED_STATEMENTS=True)
    assert check_misconfiguration() == []


def test_prepared_statements_behind_a_transaction_pooler_is_an_error(
    engine: Any, database: Any
) -> None:
    database(POSTGRES, DISABLE_SERVER_SIDE_CURSORS=True)
    engine(PREPARED_STATEMENTS=True, NOTIFY=False)
    (found,) = check_misconfiguration()
    assert found.id == "tasks_engine.E020" and found.is_serious()
    assert "PREPARED_STATEMENTS" in found.hint
    engine(PREPARED_STATEMENTS=False, NOTIFY=False)
    assert check_misconfiguration() == []


def test_notify_behind_a_pooler_without_listen_url_warns_of_polling(
    engine: Any, database: Any
) -> None:
    database(POSTGRES, DISABLE_SERVER_SIDE_CURSORS=True)
    engine(PREPARED_STATEMENTS=False, NOTIFY=True)
    (found,) = check_misconfiguration()
    assert found.id == "tasks_engine.W022" and "polling" in found.msg
    engine(PREPARED_STATEMENTS=False, NOTIFY=True, LISTEN_URL="postgres://db:5432/app")
    assert check_misconfiguration() == []


def test_a_workflow_queue_that_queues_does_not_list_is_no_warning(
    engine: Any, odd_queue: str
) -> None:
    """QUEUES declares limits, not the list of queues: limiting one queue does not make every
    other workflow's queue (UMT's own "io" too) a warning on every command."""
    engine(QUEUES={"bulk": {"concurrency": 2}})
    assert [m for m in check_misconfiguration() if m.id == "tasks_engine.W023"] == []


def test_a_workflow_queue_close_to_a_declared_one_is_warned_as_a_likely_typo(
    engine: Any, odd_queue: str
) -> None:
    def about_odd(found: list[Any]) -> list[Any]:
        return [m for m in found if m.id == "tasks_engine.W023" and f" {odd_queue}@1 " in m.msg]

    engine(QUEUES={"reprots": {"concurrency": 2}})  # the limit meant for the workflow's queue
    (found,) = about_odd(check_misconfiguration())
    assert "'reports'" in found.msg and "'reprots'" in found.msg and "typo" in found.msg
    assert not found.is_serious()
    engine(QUEUES={"REPORTS": {}})  # a different queue only by case: a typo too
    assert len(about_odd(check_misconfiguration())) == 1
    engine(QUEUES={"reprots": {}, "reports": {}})  # both declared: both meant
    assert about_odd(check_misconfiguration()) == []
    engine(QUEUES=None)
    assert check_misconfiguration() == []


@pytest.mark.django_db
def test_manage_py_check_fails_on_the_pooler_error(engine: Any, database: Any) -> None:
    database(POSTGRES, DISABLE_SERVER_SIDE_CURSORS=True)
    engine(PREPARED_STATEMENTS=True)
    with pytest.raises(SystemCheckError, match=r"tasks_engine\.E020"):
        call_command("check", stdout=StringIO(), stderr=StringIO())


@pytest.mark.django_db
def test_worker_queue_checks(engine: Any, odd_queue: str) -> None:
    """Queues are open: a worker may serve a queue that neither QUEUES nor a workflow names
    (runs enqueued to it with queue=); only a likely typo of a known queue is a warning."""
    assert worker_checks(["anything"]) == []  # no QUEUES declared: any queue may be served
    engine(QUEUES={"default": {}})
    assert worker_checks(["default", "reports"]) == []  # declared, or a workflow's own queue
    assert worker_checks(["bulk"]) == []  # named by nobody: served all the same
    (found,) = worker_checks(["default", "repots"])
    assert found.id == "tasks_engine.W023" and not found.is_serious()
    assert "'repots'" in found.msg and "'reports'" in found.msg
    engine(QUEUES=None)
    (found,) = worker_checks(["repots"])  # with or without QUEUES
    assert found.id == "tasks_engine.W023"


@pytest.mark.django_db
def test_several_processes_on_sqlite_warn(database: Any) -> None:
    database(SQLITE)
    (found,) = worker_checks([], processes=3)
    assert found.id == "tasks_engine.W024" and "one writer" in found.msg
    assert worker_checks([], processes=1) == []
    database(POSTGRES)
    assert worker_checks([], processes=3) == []


@pytest.mark.django_db
def test_runworker_serves_a_queue_nobody_names_and_warns_of_a_likely_typo(
    engine: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tasks_engine.management.commands import runworker

    served: list[tuple[str, ...]] = []

    class Started:
        def __init__(self, config: Any) -> None:
            served.append(config.queues)

        def run(self) -> int:
            return 0

    monkeypatch.setattr(runworker, "Worker", Started)
    engine(QUEUES={"default": {}, "io": {}})
    call_command("runworker", "--queue", "bulk", "--burst")
    assert served == [("bulk",)] and capsys.readouterr().err == ""
    call_command("runworker", "--queue", "IO", "--burst")
    assert served[-1] == ("IO",)
    err = capsys.readouterr().err
    assert "warning: " in err and "'IO'" in err and "'io'" in err and "tasks_engine.W023" in err
    assert err.count("\n") == 1
    assert not WorkflowRun.objects.exists()


@pytest.mark.django_db
def test_a_second_worker_process_on_sqlite_warns(is_postgres: bool) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from tasks_engine.models import Worker

    assert worker_checks([]) == []  # no other worker yet
    now = timezone.now()
    Worker.objects.create(
        id="other:1:abc", host="other", pid=1, concurrency=4, started_at=now, last_heartbeat=now
    )
    found = [c.id for c in worker_checks([])]
    assert found == ([] if is_postgres else ["tasks_engine.W025"])
    Worker.objects.update(last_heartbeat=now - timedelta(hours=1))  # dead: no warning
    assert worker_checks([]) == []


@pytest.mark.parametrize(
    ("values", "error_id"),
    [
        ({"HEARTBEAT_SECONDS": "abc"}, "tasks_engine.E001"),
        ({"HEARTBEAT_SECONDS": -1}, "tasks_engine.E003"),
        ({"HEARTBEAT_SECONDS": 0}, "tasks_engine.E003"),
        ({"LEASE_SECONDS": float("nan")}, "tasks_engine.E002"),
        ({"MAX_STEP_ATTEMPTS_PER_RUN": 0}, "tasks_engine.E007"),
        ({"DEAD_WORKER_SECONDS": -5}, "tasks_engine.E008"),
        ({"DEAD_WORKER_SECONDS": 0}, "tasks_engine.E008"),
        ({"LEADER_LEASE_SECONDS": float("inf")}, "tasks_engine.E008"),
        ({"RETENTION_DAYS": {"failed": -3}}, "tasks_engine.E001"),
        ({"RETENTION_DAYS": {"failed": float("nan")}}, "tasks_engine.E001"),
        ({"MAX_PAYLOAD_BYTES": "16M"}, "tasks_engine.E001"),
        ({"MAX_PAYLOAD_BYTES": 2.0**20}, "tasks_engine.E001"),
        ({"MAX_PAYLOAD_BYTES": True}, "tasks_engine.E001"),
        ({"MAX_PAYLOAD_BYTES": 64 * 2**10 - 1}, "tasks_engine.E001"),
        ({"MAX_PAYLOAD_BYTES": 32 * 2**20 + 1}, "tasks_engine.E001"),
        ({"MAX_PAYLOAD_BYTES": None}, "tasks_engine.E001"),
    ],
)
def test_out_of_range_engine_settings_are_check_errors(
    engine: Any, values: dict[str, Any], error_id: str
) -> None:
    """A zero or negative DEAD_WORKER_SECONDS passed before, and the leader then reaped every
    live worker (its runs retaken while their steps still ran)."""
    from tasks_engine.checks import check_settings

    engine(**values)
    assert error_id in ids(check_settings())
    with pytest.raises(SystemCheckError):
        call_command("check", stdout=StringIO(), stderr=StringIO())


@pytest.mark.parametrize("bound", [64 * 2**10, 32 * 2**20])
def test_the_payload_bound_takes_its_range(engine: Any, bound: int) -> None:
    from tasks_engine.checks import check_settings
    from tasks_engine.conf import engine_settings

    assert engine_settings().max_payload_bytes == 16 * 2**20  # the default
    engine(MAX_PAYLOAD_BYTES=bound)
    assert check_settings() == []
    assert engine_settings().max_payload_bytes == bound


def test_a_misspelt_engine_setting_is_warned_with_the_nearest_key(engine: Any) -> None:
    from tasks_engine.checks import check_settings

    engine(LEASE_SECOND=60)
    [found] = check_settings()
    assert found.id == "tasks_engine.W003" and "'LEASE_SECOND'" in found.msg
    assert found.hint == "Did you mean 'LEASE_SECONDS'?"


def test_sqlite_with_a_transaction_mode_other_than_immediate_is_warned(database: Any) -> None:
    """The engine's writes on SQLite take the write lock at BEGIN (IMMEDIATE); deferred ones
    fail with "database is locked" under a concurrent writer. Without OPTIONS (startproject's
    DATABASES) the engine sets IMMEDIATE itself (db/sqlite_connections.py): nothing to warn about,
    on every command; a mode the project chose wins, and is warned about."""

    def w026() -> list[Any]:
        return [m for m in check_misconfiguration() if m.id == "tasks_engine.W026"]

    database(SQLITE, OPTIONS={})
    assert w026() == []
    database(SQLITE, OPTIONS={"timeout": 10})
    assert w026() == []
    database(SQLITE, OPTIONS={"transaction_mode": "DEFERRED"})
    (found,) = w026()
    assert "transaction_mode 'DEFERRED'" in found.msg and "database is locked" in found.msg
    assert found.hint is not None and "IMMEDIATE" in found.hint
    database(SQLITE, OPTIONS=IMMEDIATE)
    assert w026() == []
    database(POSTGRES, OPTIONS={"transaction_mode": "DEFERRED"})
    assert w026() == []


def test_workflows_on_the_default_queue_need_no_declaration(engine: Any) -> None:
    """QUEUES lists the queues it limits; "default" (every workflow's that names none, the
    engine's own django_task's too) is never a typo."""
    engine(QUEUES={"io": {"concurrency": 2}})
    assert [m for m in check_misconfiguration() if "'default'" in m.msg] == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("queue", "message"),
    [
        ("", "queue must be a non-empty string"),  # was served as nothing, exit 0
        ("i\x00o", "must not contain a NUL character"),
        ("q" * 101, "queue is 101 characters long: at most 100"),
    ],
)
def test_runworker_refuses_a_queue_no_run_can_have_as_a_usage_error(
    queue: str, message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tasks_engine.management.commands import runworker

    def no_worker(config: Any) -> Any:
        raise AssertionError(f"a worker started, serving queues {config.queues!r}")

    monkeypatch.setattr(runworker, "Worker", no_worker)
    with pytest.raises(SystemExit) as exited:
        call_command("runworker", "--queue", "default", "--queue", queue, "--burst")
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "--queue" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not WorkflowRun.objects.exists()


# -- the django.tasks backend and the Django version (make test runs 6.x, make test-django52 5.2)

BACKEND = {"default": {"BACKEND": "tasks_engine.backends.DurableBackend"}}


@pytest.mark.one_db("a check on settings and the Django version")
@pytest.mark.skipif(django_has_tasks(), reason="Django 5.2 only: django.tasks is new in 6.0")
def test_on_django_5_2_a_tasks_setting_naming_the_backend_fails_check(settings: Any) -> None:
    settings.TASKS = BACKEND
    with pytest.raises(SystemCheckError, match=r"tasks_engine\.E030.*needs Django 6\.0 or later"):
        call_command("check", stdout=StringIO(), stderr=StringIO())
    with pytest.raises(ImportError, match=r"needs Django 6\.0 or later .* this is Django 5\.2"):
        import tasks_engine.backends  # noqa: F401


@pytest.mark.one_db("a check on settings and the Django version")
@pytest.mark.skipif(not django_has_tasks(), reason="Django 6.0 or later: it has django.tasks")
def test_from_django_6_0_the_backend_in_tasks_passes_check(settings: Any) -> None:
    settings.TASKS = BACKEND
    assert check_durable_backend_has_django_tasks() == []
    call_command("check", stdout=StringIO(), stderr=StringIO())
