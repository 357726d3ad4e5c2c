"""A deploy that retires a workflow version while a run of it is mid-way, with real
`manage.py runworker` processes."""

from __future__ import annotations

import signal

import pytest

import tasks_engine
from tasks_engine.models import StepAttempt, Worker, WorkflowRun
from tasks_engine.services.fleet import unserved_runs
from tests.helpers import SHORT_PERIODS, wait_for
from tests.testapp.models import SideEffect

pytestmark = [
    pytest.mark.process,
    pytest.mark.django_db(transaction=True),
    pytest.mark.one_db("the leader's rule for a retired version's runs"),
]


def test_cancel_ends_a_run_whose_dead_holder_no_live_worker_replaces(workers) -> None:
    """The old generation's worker is SIGKILLed mid-step; the new one no longer serves that
    workflow version (retired too early), so nobody will ever claim the run again. W002 says
    so and hints "or cancel the runs": the cancel must end the run. It was only recorded as
    a request for a holder that is dead, and the run stayed `running` for good."""
    run_id = tasks_engine.enqueue("slow_middle", {"seconds": 60}).run_id
    old = workers("--poll-interval", "0.2", tag="old", env=SHORT_PERIODS)
    wait_for(lambda: SideEffect.objects.filter(key="middle-start").exists(), 30, "the step")
    old.send(signal.SIGKILL)
    old.wait(10)
    new = workers("--task", "a@2", "--poll-interval", "0.2", tag="new", env=SHORT_PERIODS)
    # The new worker's leader reaps the dead one (DEAD_WORKER_SECONDS): the run is unserved.
    only_new = [new.pid]
    wait_for(
        lambda: list(Worker.objects.values_list("pid", flat=True)) == only_new,
        40,
        "the dead worker to be reaped",
    )
    assert unserved_runs() == [
        {"task": "slow_middle", "version": 1, "queue": "default", "runs": 1, "at_least": False}
    ], new.log()
    assert tasks_engine.cancel(run_id, "version retired") is True
    wait_for(
        lambda: WorkflowRun.objects.get(pk=run_id).status == "canceled",
        10,
        "the cancel to end the run",
    )
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.cancel_reason, run.lease_token, run.waiting_on) == ("version retired", None, "")
    middle = StepAttempt.objects.get(run_id=run_id, name="middle")
    assert (middle.status, middle.counted) == ("abandoned", False)
    assert unserved_runs() == []
    assert tasks_engine.cancel(run_id) is False


def test_a_cancel_requested_before_the_holder_was_killed_ends_the_run(workers) -> None:
    """The cancel reaches the old worker as a request (it is alive, deep in a step that does
    not watch its abort), then the worker is SIGKILLed and the new deploy does not serve the
    version: the leader of the new generation ends the run."""
    run_id = tasks_engine.enqueue("slow_middle", {"seconds": 60}).run_id
    old = workers("--poll-interval", "0.2", tag="old", env=SHORT_PERIODS)
    wait_for(lambda: SideEffect.objects.filter(key="middle-start").exists(), 30, "the step")
    assert tasks_engine.cancel(run_id, "version retired") is True
    assert WorkflowRun.objects.get(pk=run_id).status == "running"  # a request for the holder
    old.send(signal.SIGKILL)
    old.wait(10)
    workers("--task", "a@2", "--poll-interval", "0.2", tag="new", env=SHORT_PERIODS)
    wait_for(
        lambda: WorkflowRun.objects.get(pk=run_id).status == "canceled",
        60,
        "the new generation's leader to end the run",
    )
    middle = StepAttempt.objects.get(run_id=run_id, name="middle")
    assert (middle.status, middle.counted) == ("abandoned", False)
