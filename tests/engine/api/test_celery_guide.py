"""docs/migrating-from-celery.md runs: every ```python block of the page that is not marked
`# Celery` is executed here, in order, in one namespace (the engine's side of each example),
and the workflows it defines are driven to their end with the tester. A block that stopped
matching the engine's API fails here."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from tasks_engine import testing
from tasks_engine.definitions import registry
from tasks_engine.models import WorkflowRun
from tasks_engine.schedules import collect
from tests.helpers import ROOT

pytestmark = pytest.mark.django_db

PAGE = (ROOT / "docs" / "migrating-from-celery.md").read_text()
BLOCKS = re.findall(r"^```python\n(.*?)^```$", PAGE, re.S | re.M)
CELERY = [b for b in BLOCKS if b.startswith("# Celery\n")]
SETTINGS = [b for b in BLOCKS if b.startswith("# settings.py\n")]
TESTS = [b for b in BLOCKS if "testing.WorkflowTester()" in b]
ENGINE = [b for b in BLOCKS if b not in CELERY and b not in SETTINGS and b not in TESTS]


def test_the_page_has_the_blocks_this_test_runs() -> None:
    """Each block is one of the kinds below: none is left out unnoticed."""
    assert len(BLOCKS) == 10
    assert (len(CELERY), len(SETTINGS), len(TESTS), len(ENGINE)) == (2, 1, 1, 6)
    assert all("celery" not in b for b in ENGINE + SETTINGS + TESTS)


@pytest.fixture
def page() -> Iterator[dict[str, Any]]:
    """The namespace of the page's engine blocks, executed in order; the workflows they
    register are unregistered after the test."""
    before = set(registry.pairs())
    namespace: dict[str, Any] = {"__name__": "celery_guide"}
    try:
        for block in ENGINE:
            exec(compile(block, "docs/migrating-from-celery.md", "exec"), namespace)
        yield namespace
    finally:
        for name, version in set(registry.pairs()) - before:
            registry.unregister(name, version)


def test_the_invoice_runs_its_steps_and_sleeps_a_week(page: dict[str, Any]) -> None:
    # The enqueue block ran: one run, deduplicated by its key if enqueued again.
    (run,) = WorkflowRun.objects.filter(task_name="send-invoice")
    assert run.idempotency_key == "invoice:42" and run.input == {"order_id": 42}
    with testing.WorkflowTester() as t:
        started = t.now
        view = t.run_to_completion(run.pk)
        assert view.output == {"pdf": "/invoices/42.pdf", "reminded": True}
        assert t.now - started >= timedelta(days=7)
        assert [(s.name, s.status) for s in view.steps] == [
            ("render", "completed"),
            ("mail", "completed"),
            ("a-week", "completed"),
            ("paid?", "completed"),
            ("remind", "completed"),
        ]
        again = page["send_invoice"].enqueue({"order_id": 42}, idempotency_key="invoice:42")
        assert (again.run_id, again.deduplicated) == (run.pk, True)


def test_the_tests_block_runs(page: dict[str, Any]) -> None:
    (block,) = TESTS
    exec(compile(block, "docs/migrating-from-celery.md", "exec"), page)


def test_a_step_is_retried_alone_and_non_retryable_fails_at_once(page: dict[str, Any]) -> None:
    with testing.WorkflowTester() as t:
        run = t.start(page["charge_order"])
        assert t.run_to_completion(run).output == "ch_123"
        assert page["CALLS"] == ["reserve", "charge", "charge", "charge"]
        assert [(s.name, s.status) for s in t.steps(run)] == [
            ("reserve-stock", "completed"),
            ("charge", "failed"),
            ("charge", "failed"),
            ("charge", "completed"),
        ]
        refund = t.start("refund-order")
        view = t.run_to_completion(refund)
        assert view.status == "failed" and "already refunded" in str(view.error)
        assert [(s.name, s.status) for s in t.steps(refund)] == [("refund", "failed")]


def test_a_group_in_turn_is_child_runs(page: dict[str, Any]) -> None:
    with testing.WorkflowTester() as t:
        run = t.start("thumbnails-in-turn", {"image_ids": [1, 2, 3]})
        assert t.run_to_completion(run).output == [{"image_id": i, "width": 320} for i in (1, 2, 3)]
        children = t.assert_enqueued(page["make_thumbnail"], count=3, parent=run)
        assert {c.status for c in children} == {"completed"}


def test_a_chord_starts_its_children_and_joins_their_facts(page: dict[str, Any]) -> None:
    with testing.WorkflowTester() as t:
        run = t.start("album-chord", {"image_ids": [3, 1, 2]})
        assert t.run_to_completion(run).output == {"album": [1, 2, 3]}
        children = t.assert_enqueued("make-thumbnail", count=3)
        assert {c.status for c in children} == {"completed"}
        assert {c.tags["album"] for c in children} == {str(run)}
        assert [s.name for s in t.steps(run)] == [
            "start-thumbnails",
            "thumbnail-done",  # the n-th wait of one name is name#n
            "thumbnail-done#2",
            "thumbnail-done#3",
            "publish",
        ]


def test_the_schedules_are_valid_and_the_report_runs(page: dict[str, Any]) -> None:
    (block,) = SETTINGS
    ns: dict[str, Any] = {}
    exec(compile(block, "docs/migrating-from-celery.md", "exec"), ns)
    with override_settings(TASKS_ENGINE={**settings.TASKS_ENGINE, **ns["TASKS_ENGINE"]}):
        specs, problems = collect()
    assert problems == []
    nightly, weekly = specs["nightly-report"], specs["weekly-report"]
    assert (nightly.cron.expr, nightly.cron.timezone) == ("0 3 * * *", "Europe/Berlin")
    assert (weekly.task, weekly.cron.expr, weekly.source) == (
        "nightly-report",
        "0 4 * * MON",
        "settings",
    )
    with testing.WorkflowTester() as t:
        run = t.start(page["nightly_report"])
        assert t.run_to_completion(run).output == "report built"
