"""Testing workflows: run them to completion in the test's own process, on the test database.

    from tasks_engine import testing

    def test_acquire(db):
        with testing.WorkflowTester() as t:
            run = t.start(acquire, {"plan_id": 1})
            t.run_until_idle()                      # runs until it waits on the fact
            t.signal(run, "download-done", {"path": "/tmp/x"})
            view = t.run_to_completion(run)         # the 7-day retention sleep is jumped
            assert view.status == "completed"
            assert [s.name for s in t.steps(run)] == [...]

The room's modules: `tester` (`WorkflowTester`, `FakeClock`, `drain`), `assertions`
(`assert_enqueued`, `assert_not_enqueued`) and `pytest_plugin` (the fixtures `tasks_tester`
and `tasks_clock`, registered by the `pytest11` entry point: docs/testing.md).

Import-safe before apps load, as the package `tasks_engine` is: pytest imports the plugin,
and so this package, in every run of a project that has the engine installed, before
pytest-django configures Django. The names below are imported from their modules (which need
the models) when first read.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .assertions import ANY, assert_enqueued, assert_not_enqueued
    from .tester import (
        FINISHED,
        FakeClock,
        WorkflowTester,
        check_worker_id,
        drain,
        next_timer,
        rate_window_frees,
    )

# name -> the module of this package that defines it
_LAZY = {
    "FINISHED": "tester",
    "FakeClock": "tester",
    "WorkflowTester": "tester",
    "check_worker_id": "tester",
    "drain": "tester",
    "next_timer": "tester",
    "rate_window_frees": "tester",
    "ANY": "assertions",
    "assert_enqueued": "assertions",
    "assert_not_enqueued": "assertions",
}

__all__ = [
    "ANY",
    "FINISHED",
    "FakeClock",
    "WorkflowTester",
    "assert_enqueued",
    "assert_not_enqueued",
    "check_worker_id",
    "drain",
    "next_timer",
    "rate_window_frees",
]
assert sorted(__all__) == sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # read once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
