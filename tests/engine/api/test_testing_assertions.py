"""tasks_engine.testing's "assert enqueued" helpers: what they match, and what a failure says.

(The pytest plugin's fixtures over them run from an installed wheel in
tests/fresh/test_pytest_plugin.py.)"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid

import pytest

import tasks_engine
from tasks_engine import testing
from tests.helpers import ROOT
from tests.testapp.wait_workflows import child_echo, parent
from tests.testapp.workflows import noop

pytestmark = pytest.mark.django_db


def test_assert_enqueued_matches_the_task_and_its_input_as_validated() -> None:
    first = tasks_engine.enqueue(noop, {"n": 1}).run_id
    tasks_engine.enqueue("noop", {"n": 2}, queue="other")
    tasks_engine.enqueue(noop)  # the model's default: {"n": 0}
    views = testing.assert_enqueued(noop)
    assert len(views) == 3 and views[0].run_id == first  # oldest first
    assert [v.run_id for v in testing.assert_enqueued("noop", {"n": 1})] == [first]
    testing.assert_enqueued(noop, {}, count=1)  # {} is {"n": 0} once validated
    testing.assert_enqueued(noop, count=3)
    testing.assert_enqueued(noop, queue="other", count=1)
    testing.assert_not_enqueued(noop, {"n": 3})
    testing.assert_not_enqueued("three_steps")


def test_a_failure_names_what_was_expected_and_lists_the_runs_there() -> None:
    tasks_engine.enqueue(noop, {"n": 1})
    with pytest.raises(AssertionError) as failed:
        testing.assert_enqueued(noop, {"n": 2})
    assert str(failed.value) == (
        "expected at least 1 run of 'noop' with input {'n': 2}, found 0;"
        " the runs of 'noop': input {'n': 1} (pending, queue 'default')"
    )
    with pytest.raises(AssertionError) as failed:
        testing.assert_enqueued(noop, count=2)
    assert str(failed.value).startswith("expected 2 runs of 'noop', found 1;")
    with pytest.raises(AssertionError) as failed:
        testing.assert_enqueued("three_steps")
    assert str(failed.value) == (
        "expected at least 1 run of 'three_steps', found 0; runs enqueued: 'noop'"
    )
    with pytest.raises(AssertionError) as failed:
        testing.assert_not_enqueued(noop, {"n": 1})
    assert str(failed.value) == (
        "expected no run of 'noop' with input {'n': 1}, found 1:"
        " input {'n': 1} (pending, queue 'default')"
    )


def test_on_an_empty_database_a_failure_says_nothing_was_enqueued() -> None:
    with pytest.raises(AssertionError, match=r"found 0; no run enqueued$"):
        testing.assert_enqueued(noop)
    testing.assert_enqueued(noop, count=0)


def test_children_are_matched_by_their_parent() -> None:
    with testing.WorkflowTester() as t:
        run = t.start(parent, {"value": 4})
        assert t.run_to_completion(run).output == {"child": {"double": 8}}
        (child,) = t.assert_enqueued(child_echo, {"value": 4}, parent=run)
        assert child.status == "completed" and child.parent_run_id == run
        t.assert_not_enqueued(child_echo, parent=uuid.uuid4())
        with pytest.raises(AssertionError, match=r"^expected no run of 'child_echo' with"):
            t.assert_not_enqueued(child_echo, parent=str(run))


@pytest.mark.parametrize("count", [-1, 1.0, True, "1"])
def test_a_count_that_is_no_count_is_a_value_error(count: object) -> None:
    expected = f"count must be an integer >= 0, not {count!r}"
    with pytest.raises(ValueError, match=re.escape(expected)):
        testing.assert_enqueued(noop, count=count)  # type: ignore[arg-type]


def test_a_task_that_is_no_workflow_nor_name_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"^task must be a workflow or its name, not 3$"):
        testing.assert_enqueued(3)  # type: ignore[arg-type]


@pytest.mark.one_db("imports modules in a new interpreter")
def test_the_plugin_imports_no_models_nor_settings() -> None:
    """pytest imports the plugin in every run of a project that has the engine installed,
    before pytest-django (or anything) configures Django: importing it must not need them."""
    code = (
        "import sys, tasks_engine.testing.pytest_plugin\n"
        "from django.conf import settings\n"
        "print(settings.configured, 'tasks_engine.models' in sys.modules)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}  # no DJANGO_SETTINGS_MODULE
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]
