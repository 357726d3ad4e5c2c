"""Assertions on what the code under test enqueued: `assert_enqueued`, `assert_not_enqueued`.

    def test_signup_sends_the_welcome_mail(client, tasks_tester):
        client.post("/signup/", {"email": "ada@example.com"})
        tasks_tester.assert_enqueued(send_welcome, input={"email": "ada@example.com"})

They read the runs in the test's database (any status: a run the tester already executed
was enqueued too), so they hold for runs enqueued by a view, a signal handler, an outbox
route or another run's child step alike. A failure says what was expected and lists the runs
of that task that are there (their inputs), or the tasks that were enqueued when none was.
"""

from __future__ import annotations

import uuid
from typing import Any, Final

from pydantic import ValidationError

from ..definitions import Workflow, registry
from ..engine import RunView, get_run
from ..exceptions import UnknownTaskError
from ..models import WorkflowRun


class _Any:
    """Any input (the default of `input=`): `input=None` means the input None stands for."""

    def __repr__(self) -> str:
        return "ANY"


ANY: Final[Any] = _Any()
SHOWN = 10  # runs a failure lists


def assert_enqueued(
    task: str | Workflow,
    input: Any = ANY,
    *,
    count: int | None = None,
    queue: str | None = None,
    parent: uuid.UUID | str | None = None,
) -> list[RunView]:
    """Assert that runs of `task` (a workflow or its name) were enqueued: at least one, or
    exactly `count`; with `input`, only runs whose stored input equals it as the workflow
    validates it (a pydantic input model's defaults filled in); with `queue` or `parent` (a
    parent run's id), only the runs of that queue or the children of that run. Returns the
    matching runs' views, oldest first."""
    __tracebackhide__ = True  # pytest shows the test's line, not this function's
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        raise ValueError(f"count must be an integer >= 0, not {count!r}")
    name, matching, every = _runs(task, input, queue, parent)
    if (count is None and matching) or (count is not None and len(matching) == count):
        return [_view(r.pk) for r in every if r.pk in matching]
    wanted = "at least 1 run" if count is None else f"{count} run{'' if count == 1 else 's'}"
    raise AssertionError(
        f"expected {wanted} of {name!r}{_where(input, queue, parent)}, found {len(matching)}"
        f"{_found(name, every)}"
    )


def assert_not_enqueued(
    task: str | Workflow,
    input: Any = ANY,
    *,
    queue: str | None = None,
    parent: uuid.UUID | str | None = None,
) -> None:
    """Assert that no run of `task` (with `input`, in `queue`, a child of `parent`, when
    given) was enqueued."""
    __tracebackhide__ = True
    name, matching, every = _runs(task, input, queue, parent)
    if matching:
        inputs = _inputs([r for r in every if r.pk in matching])
        raise AssertionError(
            f"expected no run of {name!r}{_where(input, queue, parent)}, found"
            f" {len(matching)}: {inputs}"
        )


def _runs(
    task: str | Workflow, input: Any, queue: str | None, parent: uuid.UUID | str | None
) -> tuple[str, set[uuid.UUID], list[WorkflowRun]]:
    """The task's name, the ids of the matching runs, and every run of the task in `queue`
    and of `parent` (oldest first)."""
    if isinstance(task, Workflow):
        name = task.name
    elif isinstance(task, str):
        name = task
    else:
        raise TypeError(f"task must be a workflow or its name, not {task!r}")
    runs = WorkflowRun.objects.filter(task_name=name).order_by("created_at", "pk")
    if queue is not None:
        runs = runs.filter(queue=queue)
    if parent is not None:
        runs = runs.filter(parent_run_id=uuid.UUID(str(parent)))
    every = list(runs)
    expected = ANY if input is ANY else _stored(task, name, input)
    matching = {r.pk for r in every if expected is ANY or r.input == expected}
    return name, matching, every


def _stored(task: str | Workflow, name: str, input: Any) -> Any:
    """`input` as a run of the task stores it (its workflow's validation, JSON); as given
    when the task is not registered or the value is not a valid input (no run matches it)."""
    try:
        wf = task if isinstance(task, Workflow) else registry.get(name)
        return wf.validate_input(input)
    except (UnknownTaskError, ValidationError):
        return input


def _where(input: Any, queue: str | None, parent: uuid.UUID | str | None) -> str:
    parts = [] if input is ANY else [f"input {input!r}"]
    parts += [] if queue is None else [f"queue {queue!r}"]
    parts += [] if parent is None else [f"parent {parent}"]
    return f" with {' and '.join(parts)}" if parts else ""


def _found(name: str, runs: list[WorkflowRun]) -> str:
    if runs:
        return f"; the runs of {name!r}: {_inputs(runs)}"
    tasks = sorted(set(WorkflowRun.objects.values_list("task_name", flat=True)))
    return f"; runs enqueued: {', '.join(map(repr, tasks))}" if tasks else "; no run enqueued"


def _inputs(runs: Any) -> str:
    listed = list(runs[: SHOWN + 1])  # a list or a queryset
    shown = ", ".join(f"input {r.input!r} ({r.status}, queue {r.queue!r})" for r in listed[:SHOWN])
    return shown + (" ..." if len(listed) > SHOWN else "")


def _view(run_id: uuid.UUID) -> RunView:
    view = get_run(run_id)
    assert view is not None  # just read
    return view
