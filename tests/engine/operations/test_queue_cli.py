"""manage.py tasks queues [--json] and tasks queue pause|resume NAME [--reason TEXT]."""

from __future__ import annotations

import json
import subprocess
import sys
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

import tasks_engine
from tasks_engine.models import Queue
from tests.helpers import ROOT, database_url

pytestmark = pytest.mark.django_db


def tasks(*args: str) -> str:
    out = StringIO()
    call_command("tasks", *args, stdout=out)
    return out.getvalue()


def test_pause_list_resume(settings: Any) -> None:
    settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "QUEUES": {"io": {"concurrency": 3}}}
    tasks_engine.enqueue("b", {}, queue="io")
    assert tasks("queue", "pause", "io", "--reason", "nas offline") == "paused io\n"
    assert tasks("queue", "pause", "io") == "io was already paused\n"
    listed = {q["name"]: q for q in json.loads(tasks("queues", "--json"))}
    io = listed["io"]
    assert (io["paused"], io["reason"], io["concurrency"], io["rate_limit"]) == (
        True,
        "nas offline",
        3,
        None,
    )
    assert (io["pending"], io["running"]) == (1, 0)
    assert "io" in tasks("queues") and "paused" in tasks("queues")
    assert json.loads(tasks("queue", "resume", "io", "--json")) == {
        "name": "io",
        "paused": False,
        "changed": True,
    }
    assert tasks("queue", "resume", "io") == "io was not paused\n"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["queue", "stop", "io"], "invalid choice: 'stop'"),
        (["queue", "pause"], "the following arguments are required: NAME"),
        (["queue", "pause", ""], "queue must be a non-empty string"),
        (["queue", "pause", "x" * 101], "at most 100"),
        (["queue", "pause", "io", "--reason", "r" * 5000], "reason is 5000 characters long"),
        (["queue", "resume", "io", "--reason", "why"], "--reason is for pause only"),
    ],
)
def test_errors_are_one_line_exit_non_zero_and_write_nothing(args: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "tasks", *args],
        cwd=ROOT,
        env={
            "DATABASE_URL": database_url(),
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PATH": "",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert Queue.objects.count() == 0
