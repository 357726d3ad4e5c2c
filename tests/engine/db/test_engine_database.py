"""TASKS_ENGINE["DATABASE"]: the engine's tables on an alias of their own, a second PostgreSQL
database or an SQLite file beside whatever "default" is. Every engine statement goes there
(none to "default"), migrations put the engine's tables there only, `enqueue` inside that
alias's transaction is transactional, and the admin's list, run page and cancel work."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.apps import apps
from django.contrib.auth.models import User
from django.core import checks as django_checks
from django.core.cache import cache
from django.db import connections, transaction
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import tasks_engine
from outbox import publish
from outbox.models import OutboxEvent
from outbox.relay import relay_once
from tasks_engine.checks import check_settings
from tasks_engine.models import WorkflowRun
from tasks_engine.services.health import check_health
from tasks_engine.services.retention import prune
from tasks_engine.testing import drain
from tests import aliases

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.both_dbs]

ENGINE_TABLE = WorkflowRun._meta.db_table


@pytest.fixture(params=["postgresql", "sqlite"])
def engine_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The engine on a fresh database of the param's vendor (alias engine_<vendor>), migrated."""
    name = f"engine_{request.param}"
    with aliases.engine_database(name, request.param, tmp_path / "e.db"):
        yield name


def default_runs() -> int:
    with connections["default"].cursor() as cur:
        cur.execute(f"SELECT COUNT(*) FROM {ENGINE_TABLE}")
        return int(cur.fetchone()[0])


def test_runs_live_on_the_engine_alias_and_default_sees_no_statement(engine_db: str) -> None:
    with CaptureQueriesContext(connections["default"]) as on_default:
        handle = tasks_engine.enqueue("repeat_names")  # three steps, no business writes
        assert drain()
        run = tasks_engine.get_run(handle.run_id)
    assert run.status == "completed"
    assert [q["sql"] for q in on_default.captured_queries] == []
    assert WorkflowRun.objects.using(engine_db).filter(pk=handle.run_id).exists()
    assert WorkflowRun.objects.get(pk=handle.run_id).status == "completed"  # the router
    assert default_runs() == 0


def test_enqueue_inside_the_engine_alias_transaction_is_transactional(engine_db: str) -> None:
    with pytest.raises(RuntimeError), transaction.atomic(using=engine_db):
        tasks_engine.enqueue("noop", {"n": 1})
        raise RuntimeError("rolled back")
    with transaction.atomic(using=engine_db):
        kept = tasks_engine.enqueue("noop", {"n": 2})
    assert list(WorkflowRun.objects.using(engine_db).values_list("pk", flat=True)) == [kept.run_id]


def test_migrations_put_the_engine_tables_on_its_alias_only(tmp_path: Path) -> None:
    """Two fresh databases, business and engine: `migrate` on each under DATABASE=engine."""
    with (
        aliases.alias("biz_sqlite", aliases.sqlite_settings(tmp_path / "biz.sqlite3")),
        aliases.alias("eng_sqlite", aliases.sqlite_settings(tmp_path / "eng.sqlite3")),
        aliases.engine_on("eng_sqlite"),
    ):
        aliases.migrate("biz_sqlite")
        aliases.migrate("eng_sqlite")
        biz, eng = aliases.tables("biz_sqlite"), aliases.tables("eng_sqlite")
    engine_tables = {m._meta.db_table for m in apps.get_app_config("tasks_engine").get_models()}
    assert engine_tables <= eng
    assert not engine_tables & biz
    assert OutboxEvent._meta.db_table in biz


def test_admin_list_run_page_and_cancel_on_the_engine_alias(engine_db: str) -> None:
    cache.clear()
    run = tasks_engine.enqueue("noop", {"n": 7})
    admin = User.objects.create_superuser("boss", password="pw")
    client = Client()
    client.force_login(admin)
    listed = client.get(reverse("admin:tasks_engine_workflowrun_changelist"))
    assert listed.status_code == 200
    assert str(run.run_id)[-8:] in listed.content.decode()
    page = client.get(reverse("admin:tasks_engine_workflowrun_change", args=[run.run_id]))
    assert page.status_code == 200
    assert "noop" in page.content.decode()
    cancel = reverse("admin:tasks_engine_workflowrun_cancel", args=[run.run_id])
    assert client.post(cancel, {"reason": "not needed"}).status_code == 302
    assert WorkflowRun.objects.using(engine_db).get(pk=run.run_id).status == "canceled"
    assert default_runs() == 0


def test_health_and_retention_on_the_engine_alias(engine_db: str) -> None:
    tasks_engine.enqueue("noop", {"n": 1})
    drain()
    assert check_health().problems == []
    assert prune(timedelta(0))["runs"] == 1
    assert not WorkflowRun.objects.using(engine_db).exists()


def test_outbox_on_default_starts_the_run_on_the_engine_alias(engine_db: str) -> None:
    with transaction.atomic():  # the business alias's
        event = publish("test.start_run_once", {"n": 5})
    assert relay_once().dispatched == 1
    runs = WorkflowRun.objects.using(engine_db).filter(task_name="noop")
    assert [r.idempotency_key for r in runs] == [OutboxEvent.objects.get(pk=event.pk).run_key]
    assert default_runs() == 0


@pytest.mark.one_db("settings checks")
def test_checks_name_a_missing_alias_and_a_missing_router() -> None:
    # PARTITION=None: not the check of PARTITION on SQLite (E042, test_partitions.py), which
    # TASKS_PARTITION would add
    with aliases.engine_on("nowhere", PARTITION=None):
        assert [m.id for m in check_settings()] == ["tasks_engine.E040"]
    with aliases.engine_on("default", ADMIN_READ_DATABASE="replica", PARTITION=None):
        assert [m.id for m in check_settings()] == ["tasks_engine.E040"]
    with (
        aliases.alias("engine_sqlite_checked", aliases.sqlite_settings(Path("/tmp/enginedb/c.db"))),
        aliases.engine_on("engine_sqlite_checked", PARTITION=None),
    ):
        assert [m.id for m in check_settings()] == []
        with override_settings(DATABASE_ROUTERS=[]):
            errors = check_settings()
        assert [m.id for m in errors] == ["tasks_engine.E041"]
        assert isinstance(errors[0], django_checks.Error)
