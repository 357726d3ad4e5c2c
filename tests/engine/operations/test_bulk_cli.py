"""manage.py tasks enqueue --inputs, cancel-matching, retry-matching, list --tag: --json,
progress on stderr, one-line errors that write nothing."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

import tasks_engine
from tasks_engine.models import WorkflowRun
from tests.helpers import FakeClock, database_url, drain

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[3]


def tasks(*args: str, stderr: StringIO | None = None) -> str:
    out = StringIO()
    call_command("tasks", *args, stdout=out, stderr=stderr or StringIO())
    return out.getvalue()


def test_enqueue_inputs_from_a_file(tmp_path: Path) -> None:
    inputs = tmp_path / "inputs.jsonl"
    inputs.write_text('{"n": 1}\n\n{"n": "2"}\n{"n": 3}\n')
    rows = json.loads(
        tasks("enqueue", "noop", "--inputs", str(inputs), "--queue", "bulk", "--json")
    )
    assert [r["deduplicated"] for r in rows] == [False, False, False]
    runs = [WorkflowRun.objects.get(pk=r["run_id"]) for r in rows]
    assert [(r.input, r.queue) for r in runs] == [({"n": i}, "bulk") for i in (1, 2, 3)]


def test_enqueue_inputs_from_standard_input(monkeypatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO('{"n": 5}\n{"n": 6}\n'))
    text = tasks("enqueue", "tagged", "--inputs", "-", "--tag", "batch=9")
    assert len(text.split()) == 2
    assert (
        list(WorkflowRun.objects.values_list("tags", flat=True))
        == [{"team": "media", "tier": "1", "batch": "9"}] * 2
    )


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ('{"n": 1}\nnot json\n', "line 2 is not JSON"),
        ('{"n": 1}\n{"n": "x"}\n', "invalid input: 1.n"),
    ],
)
def test_a_bad_line_is_one_error_and_writes_nothing(
    tmp_path: Path, lines: str, message: str
) -> None:
    inputs = tmp_path / "inputs.jsonl"
    inputs.write_text(lines)
    with pytest.raises(CommandError, match=message):
        tasks("enqueue", "noop", "--inputs", str(inputs))
    assert WorkflowRun.objects.count() == 0


def test_enqueue_inputs_errors(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="No such file"):
        tasks("enqueue", "noop", "--inputs", str(tmp_path / "missing"))
    inputs = tmp_path / "inputs.jsonl"
    inputs.write_text('{"n": 1}\n')
    with pytest.raises(CommandError, match="unknown task"):
        tasks("enqueue", "nope", "--inputs", str(inputs))
    with pytest.raises(CommandError, match="KEY=VALUE"):
        tasks("enqueue", "noop", "--inputs", str(inputs), "--tag", "novalue")
    assert WorkflowRun.objects.count() == 0


def test_cancel_matching_json_and_progress() -> None:
    tasks_engine.enqueue_many("noop", [{"n": i} for i in range(4)], tags={"customer": "42"})
    tasks_engine.enqueue("noop", {"n": 9})
    err = StringIO()
    out = tasks("cancel-matching", "--tag", "customer=42", "--reason", "bulk", "--json", stderr=err)
    assert json.loads(out) == {"canceled": 4}
    assert "canceled 4 of 4" in err.getvalue()
    assert WorkflowRun.objects.filter(status="pending").count() == 1


def test_cancel_matching_needs_a_filter_and_a_reason() -> None:
    tasks_engine.enqueue("noop", {"n": 1})
    with pytest.raises(CommandError, match="at least one filter"):
        tasks("cancel-matching", "--reason", "x")
    with pytest.raises((CommandError, SystemExit)):  # argparse: --reason is required
        tasks("cancel-matching", "--task", "noop")
    with pytest.raises((CommandError, SystemExit)):
        tasks("cancel-matching", "--status", "nope", "--reason", "x")
    assert WorkflowRun.objects.get().status == "pending"


def test_retry_matching(fake_clock: FakeClock) -> None:
    for _ in range(3):
        tasks_engine.enqueue("fatal")
    drain(fake_clock)
    out = tasks("retry-matching", "--task", "fatal", "--status", "failed", "--json")
    assert json.loads(out) == {"retried": 3}
    assert set(WorkflowRun.objects.values_list("status", flat=True)) == {"pending"}
    assert WorkflowRun.objects.first().retries[0]["by"].startswith("cli")


def test_list_by_tag() -> None:
    a = tasks_engine.enqueue("noop", {"n": 1}, tags={"customer": "42"})
    tasks_engine.enqueue("noop", {"n": 2})
    rows = json.loads(tasks("list", "--tag", "customer=42", "--json"))
    assert [r["run_id"] for r in rows] == [str(a.run_id)]
    assert rows[0]["tags"] == {"customer": "42"}


@pytest.mark.django_db(transaction=True)
def test_the_command_line_process_exits_non_zero_with_one_line(tmp_path: Path) -> None:
    env = {"DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run(
        [sys.executable, "manage.py", "tasks", "cancel-matching", "--reason", "x"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, **env},
        timeout=60,
    )
    assert done.returncode != 0
    assert len(done.stderr.strip().splitlines()) == 1
    assert "at least one filter" in done.stderr
