"""The workers page, the fleet line and unserved-run warnings on the runs list and run page, and
the `check --deploy` warning for runs no live worker serves."""

from __future__ import annotations

import html
from datetime import timedelta

import pytest
from django.core import checks
from django.db.models import F
from django.test import Client
from django.urls import reverse

import tasks_engine
from tasks_engine import transitions
from tasks_engine.checks import check_unserved_runs
from tasks_engine.db.sql import db_clock
from tasks_engine.definitions import registry
from tasks_engine.models import Worker as WorkerRow
from tasks_engine.models import WorkflowRun
from tasks_engine.services.leader import Elector
from tasks_engine.worker import Worker, WorkerConfig
from tests.engine.admin.test_admin import VIEW_ALL, staff_client

pytestmark = pytest.mark.django_db

WORKERS = reverse("admin:tasks_engine_worker_changelist")
RUNS = reverse("admin:tasks_engine_workflowrun_changelist")


def live_worker(*names: str) -> Worker:
    w = Worker(WorkerConfig(workflows=tuple(registry.get(n) for n in names), concurrency=2))
    w.registration.beat()
    return w


@pytest.fixture
def viewer() -> Client:
    return staff_client(*VIEW_ALL, "view_worker")


def test_the_workers_page_shows_beat_liveness_leader_and_runs_held(viewer: Client) -> None:
    leader, dead = live_worker("noop"), live_worker("noop")
    WorkerRow.objects.filter(pk=dead.id).update(last_heartbeat=db_clock() - timedelta(minutes=5))
    assert Elector(leader.id).refresh()
    tasks_engine.enqueue("noop")
    transitions.claim_runs(leader.id, leader.pairs, None, 1, 30.0)
    page = viewer.get(WORKERS).content.decode()
    assert leader.id in page and dead.id in page
    assert ">alive<" in page and ">dead<" in page
    # The leader column: a badge on the leader; nothing on the others (no red ✗: not leading
    # is not a fault).
    assert page.count('<span class="te-badge te-running te-leader"') == 1
    assert 'alt="False"' not in page and "icon-no" not in page
    assert "te-badge" in page and "_styles" not in page and "--te-running" in page  # styled
    held = f"worker_id={leader.id.replace(':', '%3A')}&amp;status__exact=running"
    assert held in page
    # The runs list behind that link shows the worker's run.
    runs = viewer.get(f"{RUNS}?worker_id={leader.id}&status__exact=running")
    assert runs.status_code == 200 and "noop" in runs.content.decode()


def test_the_workers_page_is_read_only(viewer: Client) -> None:
    w = live_worker("noop")
    assert viewer.get(reverse("admin:tasks_engine_worker_add")).status_code == 403
    delete = reverse("admin:tasks_engine_worker_delete", args=[w.id])
    assert viewer.post(delete, {"post": "yes"}).status_code == 403
    assert WorkerRow.objects.filter(pk=w.id).exists()


def test_the_runs_list_links_the_workers_and_flags_unserved_runs(viewer: Client) -> None:
    pending = tasks_engine.enqueue("a", version=2).run_id
    page = viewer.get(RUNS).content.decode()
    assert WORKERS in page and "0 alive" in page and "te-unserved" not in page
    # With no worker alive, what the fleet serves is unknown; the due run is flagged by the
    # banner of `manage.py tasks health`'s lines instead (test_admin_operator_asks.py).
    assert "no worker is alive" in page
    live_worker("noop")
    page = viewer.get(RUNS).content.decode()
    assert "1 alive" in page
    assert "1 unfinished run of a@2 in queue default" in page
    done = tasks_engine.enqueue("a", version=2).run_id  # a finished run of the same version
    WorkflowRun.objects.filter(pk=done).update(status="completed", finished_at=F("created_at"))
    link = page.split('class="messagelist te-unserved"')[1].split('href="')[1].split('"')[0]
    listed = viewer.get(html.unescape(link))
    assert listed.status_code == 200
    assert str(pending) in listed.content.decode()
    assert str(done) not in listed.content.decode()  # the link lists the unfinished ones


def test_the_run_page_warns_when_no_live_worker_serves_it(viewer: Client) -> None:
    served = tasks_engine.enqueue("noop").run_id
    unserved = tasks_engine.enqueue("b").run_id
    live_worker("noop")
    page = viewer.get(reverse("admin:tasks_engine_workflowrun_change", args=[unserved]))
    assert "No live worker serves b@1" in page.content.decode()
    page = viewer.get(reverse("admin:tasks_engine_workflowrun_change", args=[served]))
    assert "No live worker serves" not in page.content.decode()


def test_deploy_check_warns_only_once_workers_are_known() -> None:
    tasks_engine.enqueue("b")
    assert check_unserved_runs() == []  # no worker row: nothing is known
    w = live_worker("noop")
    [warning] = check_unserved_runs()
    assert (warning.id, warning.level, warning.obj) == ("tasks_engine.W002", checks.WARNING, "b@1")
    assert "tasks_engine.W002" in {m.id for m in checks.run_checks(include_deployment_checks=True)}
    assert "tasks_engine.W002" not in {m.id for m in checks.run_checks()}  # a deploy check
    WorkerRow.objects.filter(pk=w.id).update(last_heartbeat=db_clock() - timedelta(minutes=5))
    assert check_unserved_runs() == []  # its only worker is dead: nothing known again
    live_worker("noop", "b")
    assert check_unserved_runs() == []
    ids = {m.id for m in checks.run_checks(include_deployment_checks=True)}
    assert "tasks_engine.W002" not in ids
