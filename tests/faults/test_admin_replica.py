"""TASKS_ENGINE["ADMIN_READ_DATABASE"] against a real streaming replica: a standby made with
`pg_basebackup -R` from the throwaway cluster. The admin's list and run page, and its queues,
workers and schedules pages, read the replica (with its replay paused, they show what only the
replica still holds); the operator's cancel, from the run page and as a list action, and the
pause of a queue or a schedule write the primary (the replica is read-only: a write there
raises, so an action that went to it would fail the request)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.cache import cache
from django.db import InternalError, connections
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import tasks_engine
import tasks_engine.schedules
from tasks_engine.models import Queue, Schedule, WorkflowRun
from tasks_engine.services.leader import Elector
from tests import aliases
from tests.engine.admin.test_workers_admin import live_worker
from tests.helpers import wait_for
from tests.pgcluster import Cluster, pg_bin

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.one_db("its own cluster")]

PRIMARY, REPLICA = "engine_primary", "engine_replica"


@pytest.fixture
def replica(cluster: Cluster) -> Iterator[Cluster]:
    """A hot standby of `cluster`, streaming from it, on a port and folder of its own."""
    standby = Cluster()
    if standby._as_postgres:
        shutil.chown(standby.base, "postgres", "postgres")
    standby._run(
        pg_bin("pg_basebackup"),
        "-D",
        str(standby.data),
        "-R",  # standby.signal and primary_conninfo: a streaming replica
        "-X",
        "stream",
        "-h",
        "127.0.0.1",
        "-p",
        str(cluster.port),
        "-U",
        "postgres",
    )
    with open(standby.data / "postgresql.conf", "a") as f:
        f.write(f"port = {standby.port}\nunix_socket_directories = '{standby.base}'\n")
        f.write("hot_standby = on\n")
    standby.start()
    standby.wait_ready()
    yield standby
    standby.destroy()


def replay(replica: Cluster, db: str, paused: bool) -> None:
    with replica.connect(db) as conn:
        conn.execute("SELECT pg_wal_replay_pause()" if paused else "SELECT pg_wal_replay_resume()")
        if paused:
            wait_for(
                lambda: (
                    conn.execute("SELECT pg_get_wal_replay_pause_state()").fetchone()[0] == "paused"
                ),
                what="replay paused",
            )


def on_replica(run_id: Any) -> WorkflowRun | None:
    return WorkflowRun.objects.using(REPLICA).filter(pk=run_id).first()


@pytest.fixture
def replica_db(cluster: Cluster, replica: Cluster) -> Iterator[str]:
    name = "umt_enginedb_replicated"
    cluster.createdb(name)
    with (
        aliases.alias(PRIMARY, aliases.pg_settings(cluster.url(name))),
        aliases.alias(REPLICA, aliases.pg_settings(replica.url(name))),
        aliases.engine_on(PRIMARY, ADMIN_READ_DATABASE=REPLICA),
    ):
        aliases.migrate(PRIMARY)
        yield name
    with cluster.connect() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_admin_reads_the_replica_and_cancels_on_the_primary(
    replica: Cluster, replica_db: str
) -> None:
    cache.clear()
    seen, page_cancel, list_cancel = (tasks_engine.enqueue("noop", {"n": i}) for i in range(3))
    wait_for(lambda: on_replica(list_cancel.run_id), what="the runs replicated")
    replay(replica, replica_db, paused=True)
    tasks_engine.cancel(seen.run_id, "on the primary only")  # the replica still has it pending
    unseen = tasks_engine.enqueue("noop", {"n": 9})  # not on the replica

    client = Client()
    client.force_login(User.objects.create_superuser("boss", password="pw"))
    listed = client.get(reverse("admin:tasks_engine_workflowrun_changelist")).content.decode()
    assert str(seen.run_id)[-8:] in listed
    assert str(unseen.run_id)[-8:] not in listed
    with (
        CaptureQueriesContext(connections[REPLICA]) as replica_sql,
        CaptureQueriesContext(connections[PRIMARY]) as primary_sql,
    ):  # the search by an id's last characters (a scan of its own) reads the replica too
        searched = client.get(
            reverse("admin:tasks_engine_workflowrun_changelist"), {"q": str(seen.run_id)[-8:]}
        ).content.decode()
    assert str(seen.run_id)[-8:] in searched
    assert any("REPLACE" in q["sql"].upper() for q in replica_sql.captured_queries)
    assert not any("REPLACE" in q["sql"].upper() for q in primary_sql.captured_queries)
    pending_only = client.get(
        reverse("admin:tasks_engine_workflowrun_changelist"), {"status__exact": "pending"}
    ).content.decode()
    assert str(seen.run_id)[-8:] in pending_only  # canceled on the primary, pending on the replica
    page = client.get(reverse("admin:tasks_engine_workflowrun_change", args=[unseen.run_id]))
    assert page.status_code == 302  # "doesn't exist": the replica has not replayed it

    # The replica refuses writes: an action that wrote there would fail its request.
    with pytest.raises(InternalError, match="read-only"):
        WorkflowRun.objects.using(REPLICA).filter(pk=page_cancel.run_id).update(priority=1)

    cancel = reverse("admin:tasks_engine_workflowrun_cancel", args=[page_cancel.run_id])
    assert client.post(cancel, {"reason": "from the run page"}).status_code == 302
    selected = client.post(
        reverse("admin:tasks_engine_workflowrun_changelist"),
        {
            "action": "cancel_selected",
            "_selected_action": [str(list_cancel.run_id)],
            "confirm": "yes",
            "reason": "from the list",
        },
    )
    assert selected.status_code == 302
    primary = WorkflowRun.objects.using(PRIMARY)
    assert primary.get(pk=page_cancel.run_id).status == "canceled"
    assert primary.get(pk=list_cancel.run_id).status == "canceled"
    assert on_replica(page_cancel.run_id).status == "pending"  # replay still paused

    replay(replica, replica_db, paused=False)
    wait_for(
        lambda: on_replica(list_cancel.run_id).status == "canceled", what="the cancels replayed"
    )
    with psycopg.connect(replica.url(replica_db)) as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone()[0] is True


PAGES_READ = (
    "runs list (its fleet line and due-runs banner)",
    "run page (its unserved-run warning)",
    "queues",
    "workers",
    "schedules",
    "schedule page",
)


def test_queue_worker_and_schedule_pages_read_only_the_replica(
    replica: Cluster, replica_db: str
) -> None:
    """Every read of these pages goes to the replica (not one statement on the primary while
    they render, with the replica showing what only it still holds); their actions (pause a
    queue, pause a schedule) write the primary, which the read-only replica would refuse."""
    cache.clear()
    schedule = {"nightly-scan": {"task": "repeat_names", "cron": "0 3 * * *"}}
    with override_settings(TASKS_ENGINE={**settings.TASKS_ENGINE, "SCHEDULES": schedule}):
        seen_worker = live_worker("noop")
        assert Elector(seen_worker.id).refresh()
        unserved = tasks_engine.enqueue("repeat_names")  # no live worker serves it
        tasks_engine.pause_queue("mail", reason="paused before the replay stopped")
        tasks_engine.schedules.ensure_rows()
        wait_for(
            lambda: (
                Schedule.objects.using(REPLICA).exists()
                and Queue.objects.using(REPLICA).filter(name="mail").exists()
            ),
            what="the rows replicated",
        )
        replay(replica, replica_db, paused=True)
        tasks_engine.resume_queue("mail")  # on the primary only
        unseen_worker = live_worker("noop")  # on the primary only

        client = Client()
        client.force_login(User.objects.create_superuser("boss", password="pw"))
        row = Schedule.objects.using(REPLICA).get()
        urls = (
            reverse("admin:tasks_engine_workflowrun_changelist"),
            reverse("admin:tasks_engine_workflowrun_change", args=[unserved.run_id]),
            reverse("admin:tasks_engine_workflowrun_queues"),
            reverse("admin:tasks_engine_worker_changelist"),
            reverse("admin:tasks_engine_schedule_changelist"),
            reverse("admin:tasks_engine_schedule_change", args=[row.pk]),
        )
        pages = {}
        for name, url in zip(PAGES_READ, urls, strict=True):
            with CaptureQueriesContext(connections[PRIMARY]) as primary_sql:
                got = client.get(url, follow=False)
            assert got.status_code == 200, name
            assert [q["sql"] for q in primary_sql.captured_queries] == [], name
            pages[name] = got.content.decode()
        assert "repeat_names" in pages[PAGES_READ[0]]  # the banner: due and unserved
        assert "No live worker serves repeat_names" in pages[PAGES_READ[1]]
        assert "paused before the replay stopped" in pages["queues"]  # resumed on the primary
        assert seen_worker.id in pages["workers"] and unseen_worker.id not in pages["workers"]
        assert "nightly-scan" in pages["schedules"] and "nightly-scan" in pages["schedule page"]

        pause_queue = reverse("admin:tasks_engine_workflowrun_queue_pause", args=["io"])
        assert client.post(pause_queue, {"reason": "from the queues page"}).status_code == 302
        pause_schedule = reverse("admin:tasks_engine_schedule_pause", args=[row.pk])
        assert client.post(pause_schedule, {"reason": "from the list"}).status_code == 302
        assert Queue.objects.using(PRIMARY).get(name="io").paused
        assert Schedule.objects.using(PRIMARY).get().paused
        assert not Queue.objects.using(REPLICA).filter(name="io").exists()  # replay paused
        assert not Schedule.objects.using(REPLICA).get().paused

        replay(replica, replica_db, paused=False)
        wait_for(lambda: Schedule.objects.using(REPLICA).get().paused, what="the pauses replayed")
