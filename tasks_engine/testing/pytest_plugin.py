"""The engine's pytest plugin: fixtures over `tasks_engine.testing` (docs/testing.md).

Registered by the distribution's `pytest11` entry point, so pytest loads it in every run of a
project that has the engine installed, whether its tests use the fixtures or not. Importing
it therefore imports nothing of Django's models nor settings (the fixtures do, when a test
asks for them), and it defines only fixtures named `tasks_*` and one marker:

    def test_welcome_mail(tasks_tester):
        run = tasks_tester.start(send_welcome, {"email": "ada@example.com"})
        assert tasks_tester.run_to_completion(run).status == "completed"

    @pytest.mark.tasks_tester(start=datetime(2025, 1, 1, tzinfo=UTC))
    def test_new_year(tasks_tester, tasks_clock): ...

- `tasks_tester`: an open `WorkflowTester` (its fake clock installed) on the test database
  (it needs pytest-django's `db`: `transactional_db` when the test asks for that);
  `tasks_tester.assert_enqueued(...)` and `assert_not_enqueued(...)` check what the code
  under test enqueued.
- `tasks_clock`: that tester's `FakeClock` (`now()`, `advance()`, `jump_to()`): the engine's
  time for the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .tester import FakeClock, WorkflowTester

MARKER = "tasks_tester"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(start=None, worker_id=..., limit=None): the arguments of the"
        " `tasks_tester` fixture's WorkflowTester (tasks_engine.testing)",
    )


@pytest.fixture
def tasks_tester(request: pytest.FixtureRequest, db: None) -> Iterator[WorkflowTester]:
    """A `tasks_engine.testing.WorkflowTester`, entered: the engine's clock is its fake clock
    for the test (the real one is back after it). On the test database: pytest-django's `db`
    (a transaction rolled back after the test), or `transactional_db` when the test asks for
    it; named in the signature, so that pytest-django sets the test database up and orders
    the test among its database tests."""
    from . import tester  # the models: Django is set up by now

    marker = request.node.get_closest_marker(MARKER)
    if marker is not None and marker.args:
        pytest.fail(
            f"@pytest.mark.{MARKER} takes keyword arguments only (start=, worker_id=, limit=)",
            pytrace=False,
        )
    with tester.WorkflowTester(**(marker.kwargs if marker is not None else {})) as t:
        yield t


@pytest.fixture
def tasks_clock(tasks_tester: WorkflowTester) -> FakeClock:
    """The engine's fake clock for this test: the `tasks_tester` fixture's."""
    return tasks_tester.clock
