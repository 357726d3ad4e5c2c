"""A worker whose PostgreSQL connections are cut again and again (`pg_terminate_backend`, as a
failover, a pooler restart or an operator would) while its runs execute steps, sit between
steps, sleep and wait for a fact. A database error is an outage, never the workflow's failure:
the worker reconnects, backs off and the run is replayed; every run completes, none ends
`failed`, and a step whose result was checkpointed never runs again.

Only this test database's sessions are terminated (never the server, never another database),
except the test's own."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from django.db import connection

import tasks_engine
from tasks_engine.models import StepAttempt, WorkflowRun
from tests.helpers import wait_for
from tests.testapp.process_workflows import trace_lines

pytestmark = [
    pytest.mark.process,
    pytest.mark.postgres_only("pg_terminate_backend drops a worker's sessions"),
    pytest.mark.django_db(transaction=True),
]

RUNS = 6
ROUNDS = 10
STEPS = ["work-0", "work-1", "work-2", "last"]
FINISHED = {"completed", "failed", "canceled"}
MIX = {"step_seconds": 0.8, "sleep_seconds": 1.0}


def terminate_others() -> int:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        row = cur.fetchone()
    return int(row[0]) if row else 0


def statuses(ids: list) -> Counter[str]:
    return Counter(WorkflowRun.objects.filter(pk__in=ids).values_list("status", flat=True))


def starts_of(trace: Path) -> int:
    return sum(1 for r in trace_lines(trace) if r["event"] == "start")


def in_a_step(ids: list) -> bool:
    return StepAttempt.objects.filter(run_id__in=ids, kind="function", status="running").exists()


def all_finished(ids: list) -> bool:
    return WorkflowRun.objects.filter(pk__in=ids, status__in=FINISHED).count() == len(ids)


def parked(ids: list) -> bool:
    return WorkflowRun.objects.filter(pk__in=ids, status="waiting").exists()


@pytest.mark.parametrize("db", [False, True], ids=["engine-queries-only", "step-bodies-query-too"])
def test_terminated_worker_sessions_are_an_outage_not_a_failure(
    workers, tmp_path: Path, db: bool
) -> None:
    """With `db`, each step body also writes a row when it is done: a cut that lands while the
    body runs is then met first by the body's own query, on the slot's dropped connection."""
    w = workers(
        "--lease-seconds", "3", "--poll-interval", "0.2", "--concurrency", "4", tag="victim"
    )
    ids = [
        tasks_engine.enqueue("outage_mix", {"trace_dir": str(tmp_path), "db": db, **MIX}).run_id
        for _ in range(RUNS)
    ]
    killed = 0
    cut_while: Counter[str] = Counter()
    for i in range(ROUNDS):
        if i == ROUNDS // 2:  # some runs already wait for the fact, others get it before
            for run_id in ids:
                tasks_engine.signal(run_id, "go", {"round": i})
        # Alternately while a step body runs and while a run is parked (sleep or fact wait);
        # the last rounds may find every run finished (a cut then costs a worker nothing).
        where, there = ("in a step", in_a_step) if i % 2 == 0 else ("parked", parked)
        wait_for(lambda: there(ids) or all_finished(ids), 30, f"round {i}: a run {where}")  # noqa: B023 - called at once
        if all_finished(ids):
            break
        killed += terminate_others()
        cut_while[where] += 1
        time.sleep(1.0)  # let the worker reconnect and the runs move on before the next cut
    assert cut_while["in a step"] >= 3 and cut_while["parked"] >= 3, cut_while
    assert killed >= sum(cut_while.values()), "the worker's sessions were not terminated"
    wait_for(
        lambda: WorkflowRun.objects.filter(pk__in=ids, status__in=FINISHED).count() == RUNS,
        120,
        "every run to finish",
    )
    assert w.proc.poll() is None, w.log()
    unfinished = WorkflowRun.objects.filter(pk__in=ids).exclude(status="completed")
    assert not unfinished.exists(), list(unfinished.values_list("status", "error"))
    assert "database unavailable" in w.log()  # the cuts were seen, and survived
    abandoned = StepAttempt.objects.filter(run_id__in=ids, status="abandoned").count()
    print(f"\n{killed} sessions cut in {sum(cut_while.values())} rounds; {abandoned} abandoned")
    for run_id in ids:
        view = tasks_engine.get_run(run_id)
        assert view.output["fact"] == {"round": ROUNDS // 2}
        trace = trace_lines(tmp_path / f"{run_id}.jsonl")
        for step in STEPS:
            attempts = list(
                StepAttempt.objects.filter(run_id=run_id, name=step)
                .order_by("attempt")
                .values_list("status", "output")
            )
            states = [s for s, _ in attempts]
            assert states[-1] == "completed" and states.count("completed") == 1, (step, states)
            assert "failed" not in states, (step, attempts)
            starts = sum(1 for r in trace if r["step"] == step and r["event"] == "start")
            # The body whose result was checkpointed is the last one that started: a completed
            # step never ran again.
            assert attempts[-1][1]["start"] == starts, (step, attempts, starts)
            assert starts <= len(attempts), (step, attempts, starts)


@contextmanager
def database_down() -> Iterator[None]:
    """An outage of this test database for everyone but the test: no new session can connect
    and every other session is cut, until the block ends. (A database cannot refuse
    connections to itself from one of its own sessions: this is done from `postgres`.)"""
    name = connection.settings_dict["NAME"]
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        (mine,) = cur.fetchone()
    conninfo = {**connection.get_connection_params(), "dbname": "postgres"}
    with psycopg.connect(**conninfo, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
        try:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> %s",
                [name, mine],
            )
            yield
        finally:
            admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')


def ends_of(trace: Path) -> int:
    return sum(1 for r in trace_lines(trace) if r["event"] == "end")


@pytest.mark.parametrize("concurrency", ["4", "16"])
def test_a_step_lost_to_outages_more_often_than_its_retries_allow_still_completes(
    workers, tmp_path: Path, concurrency: str
) -> None:
    """A step with the default 3 attempts loses 4 attempts in a row to outages longer than the
    lease: each time its body ends while the database is down, so its result cannot be
    written, the hand-back fails too and the lease expires; the same worker, alive all along,
    takes the run again once the database is back. An outage is not the step's failure: it
    must not use up the step's retries, so the run completes instead of failing as
    'interrupted 3 times'. At 16 slots too, where most slots sit idle on dead sessions."""
    trace = tmp_path / "trace.jsonl"
    lease = 2.0
    w = workers(
        "--lease-seconds", str(lease), "--poll-interval", "0.2", "--concurrency", concurrency,
        tag="victim",
    )  # fmt: skip
    res = tasks_engine.enqueue("outage_step", {"trace": str(trace), "seconds": 1.0})
    cuts = 4

    def ended() -> bool:
        return WorkflowRun.objects.get(pk=res.run_id).status in FINISHED

    for i in range(cuts):
        n = i + 1
        wait_for(lambda: starts_of(trace) == n or ended(), 30, f"attempt {n} to run")  # noqa: B023
        assert not ended(), tasks_engine.get_run(res.run_id).error
        with database_down():
            wait_for(lambda: ends_of(trace) == n, 10, f"attempt {n}'s body to end")  # noqa: B023
            time.sleep(lease + 0.5)  # its completion and hand-back fail; the lease expires
    wait_for(ended, 60, "the run to end")
    view = tasks_engine.get_run(res.run_id)
    attempts = [(s.attempt, s.status) for s in view.steps if s.name == "work"]
    assert view.status == "completed", (view.error, attempts, w.log())
    starts = starts_of(trace)
    assert starts == cuts + 1 and view.output == {"starts": starts}, (starts, view.output)
    assert attempts[-1] == (starts, "completed"), attempts
    assert all(s == "abandoned" for _, s in attempts[:-1]), attempts


def test_sessions_cut_while_a_worker_idles_cost_no_attempt(workers, tmp_path: Path) -> None:
    """Every session of a 16-slot worker is cut while one step's body runs and the other
    slots sit idle: the next statement of each thread finds its session dead before sending
    anything and reconnects, so the step's result is written at once (no rerun, no lease
    wait) and the next runs start on the first slot they reach."""
    trace = tmp_path / "trace.jsonl"
    w = workers("--lease-seconds", "2", "--poll-interval", "0.2", "--concurrency", "16")
    res = tasks_engine.enqueue("outage_step", {"trace": str(trace), "seconds": 1.0})
    wait_for(lambda: starts_of(trace) == 1, 30, "the step to run")
    assert terminate_others() >= 17  # the slots, the group writer, the heartbeat, the claim
    wait_for(
        lambda: WorkflowRun.objects.get(pk=res.run_id).status in FINISHED, 30, "the run to end"
    )
    view = tasks_engine.get_run(res.run_id)
    assert view.status == "completed" and starts_of(trace) == 1, (view.steps, w.log())
    assert [(s.attempt, s.status) for s in view.steps] == [(1, "completed")]
    runs = [tasks_engine.enqueue("noop", {"n": n}).run_id for n in range(20)]
    wait_for(
        lambda: WorkflowRun.objects.filter(pk__in=runs, status="completed").count() == 20,
        30,
        "the next runs to complete",
    )
    assert WorkflowRun.objects.filter(pk__in=runs, attempts__gt=1).count() == 0, w.log()
