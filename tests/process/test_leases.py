"""Leases under real `runworker` processes, on PostgreSQL and on SQLite: a step that outlives
several heartbeats keeps its run (the heartbeat renews the lease and must not report a cancel
nobody asked for).

Its companion for a rerun after SIGKILL (a 2 s lease, a 3 s step: heartbeats every 0.67 s) is
tests/process/test_workers.py::test_sigkill_mid_step_reruns_only_the_interrupted_step, which
runs on both databases too."""

from __future__ import annotations

import pytest

import tasks_engine
from tasks_engine.models import StepAttempt, WorkflowRun
from tests.helpers import wait_for
from tests.testapp.models import SideEffect

pytestmark = [
    pytest.mark.process,
    pytest.mark.django_db(transaction=True),
    pytest.mark.both_dbs,  # SQLite's RETURNING in the renewal
]

STEP_SECONDS = 13  # longer than one heartbeat of the default lease (30 s, a beat every 10 s)


def effects(key: str) -> int:
    return SideEffect.objects.filter(key=key).count()


def test_a_step_longer_than_a_heartbeat_completes_under_the_default_lease(workers) -> None:
    """SQLite 3.40 answered `cancel_requested_at IS NOT NULL` in the renewal's RETURNING with
    1 for every run: the first heartbeat canceled every step that ran longer than one beat."""
    res = tasks_engine.enqueue("slow_middle", {"seconds": STEP_SECONDS})
    w = workers("--poll-interval", "0.2")  # the default lease
    wait_for(lambda: effects("middle-start") == 1, 30, "the middle step to start")
    expiries: set[object] = set()  # lease expiries seen while the middle step ran

    def finished() -> bool:
        run = WorkflowRun.objects.get(pk=res.run_id)
        if run.status == "running" and effects("middle-end") == 0:
            expiries.add(run.available_at)
        return run.status in {"completed", "failed", "canceled"}

    wait_for(finished, STEP_SECONDS + 30, "the run to finish")
    run = WorkflowRun.objects.get(pk=res.run_id)
    assert run.status == "completed", w.log()
    assert run.cancel_requested_at is None
    assert (effects("first"), effects("middle-start"), effects("middle-end"), effects("last")) == (
        1,
        1,
        1,
        1,
    )
    middle = StepAttempt.objects.filter(run_id=res.run_id, name="middle")
    assert list(middle.values_list("attempt", "status")) == [(1, "completed")]
    assert len(expiries) >= 2, "the heartbeat never renewed the lease while the step ran"
