"""Step names, fact-wait names and `patched` ids that the engine's rows cannot hold are refused
where the workflow code names them (ValueError in the workflow, nothing written for that step),
the same on both databases. Before, PostgreSQL refused the first write (varchar(300), NUL): an
outage, so the run stayed `running` and was replayed into the same refusal forever, while
SQLite stored the name (and a sleep's `waiting_on`, "sleep:" + its key, overflowed too)."""

from __future__ import annotations

import contextlib

import pytest

import tasks_engine
from tasks_engine import FactTimeoutError, TaskContext, workflow
from tasks_engine.models import Fact, StepAttempt, WorkflowRun
from tests.helpers import FakeClock, drain

pytestmark = pytest.mark.django_db(transaction=True)  # a refused write would abort a test's


@workflow(name="named_by_input")
def named_by_input(ctx: TaskContext) -> str:
    kind, name = ctx.input["kind"], ctx.input["name"].replace("<NUL>", "\x00")
    if kind == "run":
        ctx.step.run(name, lambda: 1)
    elif kind == "run-twice":
        ctx.step.run(name, lambda: 1)
        ctx.step.run(name, lambda: 2)  # its key is name#2
    elif kind == "sleep":
        ctx.step.sleep(name, 0)
    elif kind == "fact":
        with contextlib.suppress(FactTimeoutError):
            ctx.step.wait_for_fact(name, timeout=0)
    elif kind == "patch":
        ctx.patched(name)
    return "done"


def run(fake_clock: FakeClock, kind: str, name: str) -> tuple[str, str, list[str]]:
    run_id = tasks_engine.enqueue("named_by_input", {"kind": kind, "name": name}).run_id
    drain(fake_clock, horizon=5, limit=20)
    view = tasks_engine.get_run(run_id)
    assert view is not None
    steps = list(StepAttempt.objects.filter(run_id=run_id).values_list("name", flat=True))
    return view.status, (view.error or {}).get("message", ""), steps


@pytest.mark.parametrize(
    ("kind", "name", "keys"),
    [
        ("run", "r" * 300, ["r" * 300]),
        ("run-twice", "r" * 298, ["r" * 298, "r" * 298 + "#2"]),
        ("sleep", "s" * 294, ["s" * 294]),
        ("fact", "f" * 200, ["f" * 200]),
        ("patch", "p" * 294, ["patch:" + "p" * 294]),
    ],
)
def test_the_longest_names_the_rows_hold_work(
    fake_clock: FakeClock, kind: str, name: str, keys: list[str]
) -> None:
    status, message, steps = run(fake_clock, kind, name)
    assert (status, message) == ("completed", "")
    assert steps == keys


@pytest.mark.parametrize(
    ("kind", "name", "recorded", "says"),
    [
        ("run", "r" * 301, [], "at most 300"),
        ("run", "a<NUL>b", [], "no NUL character"),
        ("run-twice", "r" * 299, ["r" * 299], "is 301 characters, at most 300"),
        ("sleep", "s" * 295, [], "at most 294"),
        ("sleep", "s<NUL>", [], "no NUL character"),
        ("fact", "f" * 201, [], "at most 200"),
        ("fact", "f<NUL>", [], "no NUL character"),
        ("patch", "p" * 295, [], "at most 294 characters"),
        ("patch", "p<NUL>", [], "no NUL"),
    ],
)
def test_a_name_the_rows_cannot_hold_fails_the_run_with_a_clear_error_not_an_outage_loop(
    fake_clock: FakeClock, kind: str, name: str, recorded: list[str], says: str
) -> None:
    status, message, steps = run(fake_clock, kind, name)
    assert status == "failed", message
    assert says in message
    assert steps == recorded  # nothing written for the refused step
    assert not Fact.objects.exists()
    assert WorkflowRun.objects.get().waiting_on == ""
