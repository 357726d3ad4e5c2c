"""What operators see never shows a secret: progress messages are stored redacted."""

from __future__ import annotations

import pytest

import tasks_engine
from tasks_engine.models import WorkflowRun
from tests.helpers import FakeClock, drain

pytestmark = pytest.mark.django_db


# -- progress messages (stored redacted) ------------------------------------------------------


def test_a_progress_message_is_stored_redacted(fake_clock: FakeClock) -> None:
    message = "connecting to postgres://umt:hunter2@db.example/umt with token=tok-QWERTY"
    run_id = tasks_engine.enqueue("progress_says", {"message": message}).run_id
    drain(fake_clock, horizon=0)
    stored = WorkflowRun.objects.get(pk=run_id)
    assert stored.status == "waiting"
    assert stored.progress == {
        "done": 1,
        "total": 2,
        "message": "connecting to postgres://umt:[redacted]@db.example/umt with token=[redacted]",
    }
    view = tasks_engine.get_run(run_id)
    assert view is not None and view.progress == stored.progress
    assert view.input == {"message": message}  # the input is the workflow's: kept as given
