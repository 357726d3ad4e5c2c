"""Debounce (docs/FLOW_CONTROL.md, "Debounce"): enqueues with one key inside the window
collapse into one queued run, due `debounce` after the last of them (at most `debounce_max`
after the first), with the last one's input; once it has started, the next enqueue opens a
new window."""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

import tasks_engine
from tasks_engine import transitions
from tasks_engine.definitions import workflow
from tasks_engine.models import WorkflowRun
from tasks_engine.transitions import claim_mode
from tests.engine.transitions.test_flow_race import in_threads
from tests.helpers import FakeClock

pytestmark = pytest.mark.django_db(transaction=True)

DEBOUNCED = [("flow-debounce", 1), ("flow-debounce-max", 1)]


@pytest.fixture(autouse=True)
def _plain_claims_after() -> Iterator[None]:
    yield
    claim_mode.forget_keyed()


def claim(n: int = 10) -> list[transitions.Claimed]:
    return transitions.claim_runs("w", DEBOUNCED, None, n, 600.0)


def test_enqueues_in_the_window_collapse_into_one_run_with_the_last_input(
    fake_clock: FakeClock,
) -> None:
    start = fake_clock.now()
    first = tasks_engine.enqueue("flow-debounce", {"disk": "a", "n": 1})
    assert not first.deduplicated
    assert WorkflowRun.objects.get().available_at == start + timedelta(seconds=0.3)
    fake_clock.advance(0.2)
    second = tasks_engine.enqueue("flow-debounce", {"disk": "a", "n": 2})
    assert second.deduplicated and second.run_id == first.run_id
    run = WorkflowRun.objects.get()
    assert run.input["n"] == 2
    assert run.available_at == start + timedelta(seconds=0.5)  # 0.3 after the last enqueue
    assert tasks_engine.get_run(first.run_id).debounce_key == "d:a"
    fake_clock.advance(0.2)
    assert claim() == []  # not due yet: the window moved on with the second enqueue
    other = tasks_engine.enqueue("flow-debounce", {"disk": "b", "n": 3})
    assert not other.deduplicated  # another key, another window
    fake_clock.advance(0.1)
    [started] = claim()
    assert started.run.pk == first.run_id and started.run.input["n"] == 2


def test_once_the_run_has_started_the_next_enqueue_opens_a_new_window(
    fake_clock: FakeClock,
) -> None:
    first = tasks_engine.enqueue("flow-debounce", {"disk": "a", "n": 1}).run_id
    fake_clock.advance(1)
    [started] = claim()
    assert started.run.pk == first
    nxt = tasks_engine.enqueue("flow-debounce", {"disk": "a", "n": 2})
    assert not nxt.deduplicated and nxt.run_id != first
    assert WorkflowRun.objects.get(pk=first).input["n"] == 1  # the started run is left alone
    # Handed back to pending (a stopping worker): it has started, it is no window's run.
    transitions.requeue_run(started.lease, fake_clock.now())
    assert tasks_engine.enqueue("flow-debounce", {"disk": "a", "n": 3}).run_id == nxt.run_id


def test_debounce_max_caps_how_late_the_run_becomes_due(fake_clock: FakeClock) -> None:
    start = fake_clock.now()
    run_id = tasks_engine.enqueue("flow-debounce-max", {"disk": "a"}).run_id
    for _ in range(4):  # every 8 s: each pushes the due time to 10 s later, up to 25 s
        fake_clock.advance(8)
        assert tasks_engine.enqueue("flow-debounce-max", {"disk": "a"}).run_id == run_id
    assert WorkflowRun.objects.get().available_at == start + timedelta(seconds=25)


def test_the_key_is_per_workflow_and_an_enqueue_may_give_its_own(fake_clock: FakeClock) -> None:
    a = tasks_engine.enqueue("flow-debounce", {"disk": "a"}).run_id
    assert tasks_engine.enqueue("flow-debounce-max", {"disk": "a"}).run_id != a
    mine = tasks_engine.enqueue("flow-debounce", {"disk": "a"}, debounce_key="mine").run_id
    assert mine != a
    assert tasks_engine.enqueue("flow-debounce", {"disk": "z"}, debounce_key="mine").run_id == mine


def test_a_canceled_window_run_frees_the_key() -> None:
    first = tasks_engine.enqueue("flow-debounce", {"disk": "a"}).run_id
    assert tasks_engine.cancel(first)
    assert tasks_engine.enqueue("flow-debounce", {"disk": "a"}).run_id != first


def test_enqueue_many_collapses_repeats_into_the_first_with_the_last_input() -> None:
    got = tasks_engine.enqueue_many(
        "flow-debounce", [{"disk": "a", "n": 1}, {"disk": "b", "n": 2}, {"disk": "a", "n": 3}]
    )
    assert got[0].run_id == got[2].run_id and got[2].deduplicated
    assert WorkflowRun.objects.get(pk=got[0].run_id).input["n"] == 3
    assert WorkflowRun.objects.count() == 2


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"debounce": timedelta(seconds=1)}, ValueError, "needs a debounce_key"),
        ({"debounce_key": "k"}, ValueError, "needs debounce="),
        ({"debounce": timedelta(seconds=-1), "debounce_key": "k"}, ValueError, "debounce"),
        ({"debounce": timedelta(0), "debounce_key": "k"}, ValueError, "debounce"),
        ({"debounce": 5, "debounce_key": "k"}, TypeError, "timedelta"),
        ({"debounce": timedelta(seconds=5), "debounce_key": 5}, TypeError, "debounce_key"),
        (
            {"debounce": timedelta(seconds=5), "debounce_key": "k", "debounce_max": timedelta(1)},
            None,
            None,
        ),
        (
            {
                "debounce": timedelta(seconds=5),
                "debounce_key": "k",
                "debounce_max": timedelta(seconds=1),
            },
            ValueError,
            "at least debounce",
        ),
        ({"debounce_max": timedelta(seconds=1)}, ValueError, "needs debounce="),
        (
            {"debounce": timedelta(seconds=5), "debounce_key": "k", "queueing_key": "q"},
            ValueError,
            "exclusive",
        ),
    ],
)
def test_bad_definitions_are_refused_where_the_workflow_is_defined(
    kwargs: dict[str, Any], error: type[Exception] | None, match: str | None
) -> None:
    if error is None:
        wf = workflow(name="never-registered-debounce", **kwargs)(lambda ctx: None)
        tasks_engine.definitions.registry.unregister(wf.name, wf.version)
        return
    with pytest.raises(error, match=match):
        workflow(name="never-registered-debounce", **kwargs)(lambda ctx: None)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"debounce_key": ""}, "debounce_key"),
        ({"debounce_key": "k" * 256}, "debounce_key"),
        ({"debounce_key": 7}, "debounce_key"),
        ({"debounce_key": "k", "queueing_key": "q"}, "cannot both apply"),
        ({"available_at": "soon"}, "available_at"),
    ],
)
def test_bad_enqueues_are_refused_and_write_nothing(kwargs: dict[str, Any], match: str) -> None:
    if kwargs.get("available_at") == "soon":
        kwargs["available_at"] = tasks_engine.clock.now() + timedelta(seconds=5)
    with pytest.raises(ValueError, match=match):
        tasks_engine.enqueue("flow-debounce", {"disk": "a"}, **kwargs)
    with pytest.raises(ValueError, match="declares no debounce"):
        tasks_engine.enqueue("flow-disk", {"disk": "a"}, debounce_key="k")
    assert not WorkflowRun.objects.exists()


def test_enqueues_racing_with_claims_never_make_two_runs_of_one_window() -> None:
    """Four threads enqueue one key while a fifth claims. One window at a time: no enqueue
    that began after a run had started was answered with it, and none that ended before a run
    started was answered with the next one (times from the one clock of this machine). The
    last input: each run holds the input of an enqueue that no other enqueue answered with
    that run followed."""
    stop = threading.Event()
    calls: list[tuple[float, float, int, Any]] = []  # (began, ended, n, run id)
    lock = threading.Lock()
    counter = iter(range(1, 10**6))
    claims: dict[Any, tuple[float, float]] = {}  # run -> when its claim call began, ended
    passes = threading.Condition()
    passes_done = [0]

    def wait_for_a_claim_pass() -> None:
        # SQLite serialises writers and may let the enqueuers starve the claimer for the whole
        # test; waiting for a whole claim pass (two ends) every few enqueues closes windows.
        with passes:
            seen = passes_done[0]
            passes.wait_for(lambda: passes_done[0] > seen + 1 or stop.is_set(), timeout=30)

    def enqueue(_i: int) -> None:
        for i in range(40):
            if i % 8 == 7:
                wait_for_a_claim_pass()
            with lock:
                n = next(counter)
            began = time.time()
            got = tasks_engine.enqueue("flow-debounce", {"disk": "a", "n": n})
            with lock:
                calls.append((began, time.time(), n, got.run_id))

    def claimer() -> None:
        try:
            while not stop.is_set():
                began = time.time()
                for c in transitions.claim_runs("w", DEBOUNCED, None, 5, 600.0):
                    claims[c.run.pk] = (began, time.time())
                with passes:
                    passes_done[0] += 1
                    passes.notify_all()
        finally:
            connection.close()

    # Due at once: the claimer races every enqueue.
    wf = tasks_engine.definitions.registry.get("flow-debounce")
    saved = wf.debounce
    wf.debounce = timedelta(0)
    t = threading.Thread(target=claimer)
    t.start()
    try:
        assert in_threads(enqueue, 4, 120) == []
    finally:
        stop.set()
        t.join(60)
        wf.debounce = saved
    # In the order of their windows: claimed one after the other (one claimer), the last not.
    runs = sorted(WorkflowRun.objects.all(), key=lambda r: claims.get(r.pk, (math.inf,))[0])
    assert len(runs) > 1 and sum(1 for r in runs if r.started_at is None) <= 1
    answered: dict[Any, list[tuple[float, float, int]]] = {}
    for began, ended, n, run_id in calls:
        answered.setdefault(run_id, []).append((began, ended, n))
    for before, after in itertools.pairwise(runs):
        claim_began, claim_ended = claims[before.pk]
        late = [(b - claim_ended, n) for b, _e, n in answered[before.pk] if b > claim_ended]
        assert not late, (before.pk, late)
        early = [(claim_began - e, n) for _b, e, n in answered[after.pk] if e < claim_began]
        assert not early, (after.pk, early)
    for run in runs:
        mine = answered[run.pk]
        [ended] = [e for _b, e, n in mine if n == run.input["n"]]
        later = [n for b, _e, n in mine if b > ended]
        assert not later, f"run {run.pk} holds input {run.input['n']}, enqueued before {later}"
