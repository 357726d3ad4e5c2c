"""Flow control, in-process on both databases: keys, queue concurrency, rate limits, settings."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core import checks
from django.db import connection

import tasks_engine
from tasks_engine import clock, transitions
from tasks_engine.checks import check_settings
from tasks_engine.conf import engine_settings
from tasks_engine.db import sql
from tasks_engine.definitions import workflow
from tasks_engine.models import QueueClaim, WorkflowRun
from tasks_engine.runtime import executor
from tasks_engine.transitions import claim_floor, claim_mode, queue_state
from tests.helpers import FakeClock

pytestmark = pytest.mark.django_db

FLOW = [("flow-disk", 1), ("flow-pair", 1), ("flow-plain", 1), ("b", 1)]


@pytest.fixture(autouse=True)
def _plain_claims_after() -> Iterator[None]:
    yield
    claim_mode.forget_keyed()


def limit_queues(settings: Any, queues: dict[str, Any]) -> None:
    settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "QUEUES": queues}


def claim(n: int = 10, queues: list[str] | None = None) -> list[transitions.Claimed]:
    return transitions.claim_runs("w", FLOW, queues, n, 600.0)  # no lease expires in a test


def finish(claimed: list[transitions.Claimed]) -> None:
    for c in claimed:
        wf, ctx = executor.build_context(c.run, c.lease, threading.Event(), c.prestarted)
        executor.execute(c.run, wf, ctx)


def ids(claimed: list[transitions.Claimed]) -> list[Any]:
    return [c.run.pk for c in claimed]


def test_one_key_runs_one_at_a_time_in_priority_then_fifo_order() -> None:
    first = tasks_engine.enqueue("flow-disk", {"disk": "a"}).run_id
    second = tasks_engine.enqueue("flow-disk", {"disk": "a"}).run_id
    urgent = tasks_engine.enqueue("flow-disk", {"disk": "a"}, priority=5).run_id
    order: list[Any] = []
    for _ in range(3):
        got = claim()
        assert len(got) == 1  # the others are held back, still pending
        assert WorkflowRun.objects.filter(status="pending").count() == 3 - len(order) - 1
        order += ids(got)
        finish(got)
    assert order == [urgent, first, second]
    assert claim() == []
    assert set(WorkflowRun.objects.values_list("status", flat=True)) == {"completed"}


def test_keys_run_side_by_side_and_a_limit_of_two_admits_two() -> None:
    for disk in ("a", "a", "b", "b"):
        tasks_engine.enqueue("flow-disk", {"disk": disk})
    for _ in range(3):
        tasks_engine.enqueue("flow-pair", {})
    got = claim()
    keys = sorted(str(c.run.concurrency_key) for c in got)
    assert keys == ["disk:a", "disk:b", "pair", "pair"]
    assert claim() == []  # every key is at its limit
    finish(got)
    assert sorted(str(c.run.concurrency_key) for c in claim()) == ["disk:a", "disk:b", "pair"]


def test_unkeyed_runs_are_not_held_back_by_a_full_key() -> None:
    tasks_engine.enqueue("flow-disk", {"disk": "a"})
    tasks_engine.enqueue("flow-disk", {"disk": "a"})
    plain = tasks_engine.enqueue("b").run_id
    got = claim()
    assert len(got) == 2 and plain in ids(got)


def test_enqueue_overrides_the_key_and_run_view_shows_it() -> None:
    a = tasks_engine.enqueue("flow-disk", {"disk": "a"}, concurrency_key="shared").run_id
    b = tasks_engine.enqueue("b", concurrency_key="shared").run_id  # a workflow with no key
    from tests.testapp.flow_workflows import flow_disk

    c = flow_disk.enqueue({"disk": "z"}).run_id
    assert tasks_engine.get_run(a).concurrency_key == "shared"
    assert tasks_engine.get_run(b).concurrency_key == "shared"
    assert tasks_engine.get_run(c).concurrency_key == "disk:z"
    assert tasks_engine.get_run(tasks_engine.enqueue("b").run_id).concurrency_key is None
    assert [v.concurrency_key for v in tasks_engine.list_runs(task="b")].count("shared") == 1
    got = claim()
    assert sorted(str(c.run.concurrency_key) for c in got) == ["None", "disk:z", "shared"]


def test_enqueue_overrides_the_limit_for_its_run() -> None:
    wide = [
        tasks_engine.enqueue("flow-disk", {"disk": "a"}, concurrency_limit=2).run_id
        for _ in range(3)
    ]
    assert ids(claim()) == wide[:2]  # the workflow's limit is 1; these runs asked for 2
    assert WorkflowRun.objects.get(pk=wide[0]).concurrency_limit == 2
    keyed = tasks_engine.enqueue("b", concurrency_key="k", concurrency_limit=3).run_id
    assert WorkflowRun.objects.get(pk=keyed).concurrency_limit == 3


def test_a_keyed_run_of_an_unkeyed_workflow_is_claimed_only_by_a_guarded_claim() -> None:
    tasks_engine.enqueue("b", concurrency_key="k")
    claim_mode.forget_keyed()  # as if another process had enqueued it
    assert transitions.claim_runs("w", [("b", 1)], None, 5, 30.0) == []  # never over a limit
    claim_mode.refresh()  # the worker loop's probe finds it
    assert len(transitions.claim_runs("w", [("b", 1)], None, 5, 30.0)) == 1


def test_waiting_runs_hold_no_place_and_a_due_timer_waits_for_one(fake_clock: FakeClock) -> None:
    sleeper = tasks_engine.enqueue("flow-disk", {"disk": "a", "sleep": 60}).run_id
    other = tasks_engine.enqueue("flow-disk", {"disk": "a"}).run_id
    finish(claim())  # the sleeper parks: waiting, its place is free
    assert tasks_engine.get_run(sleeper).status == "waiting"
    [running] = claim()
    assert running.run.pk == other
    fake_clock.advance(61)  # the sleeper's timer is due, but its key is full
    assert claim() == []
    assert tasks_engine.get_run(sleeper).status == "waiting"
    finish([running])
    [woken] = claim()
    assert woken.run.pk == sleeper


def test_queue_concurrency_counts_running_runs(settings: Any) -> None:
    limit_queues(settings, {"flow-io": {"concurrency": 2}})
    for _ in range(5):
        tasks_engine.enqueue("flow-plain", {})
    other = tasks_engine.enqueue("b").run_id  # queue "default": not limited
    got = claim()
    assert len([c for c in got if c.run.queue == "flow-io"]) == 2 and other in ids(got)
    assert claim() == []
    finish(got[:1])
    assert len(claim()) == (1 if got[0].run.queue == "flow-io" else 0)


def test_a_queue_limit_and_a_key_limit_both_hold(settings: Any) -> None:
    limit_queues(settings, {"flow-io": {"concurrency": 3}})
    for disk in ("a", "a", "b", "c", "d"):
        tasks_engine.enqueue("flow-plain", {}, concurrency_key=f"disk:{disk}")
    got = claim()
    assert len(got) == 3
    assert len({c.run.concurrency_key for c in got}) == 3


def test_rate_limit_is_a_sliding_window(settings: Any, fake_clock: FakeClock) -> None:
    limit_queues(settings, {"flow-io": {"rate_limit": "3/m"}})
    for _ in range(8):
        tasks_engine.enqueue("flow-plain", {})
    first = claim(2)
    assert len(first) == 2
    fake_clock.advance(30)
    finish(first)
    assert len(claim()) == 1  # 3 claims in the last minute
    fake_clock.advance(29)
    assert claim() == []
    fake_clock.advance(2)  # the first two claims left the window; the third did not
    assert len(claim()) == 2
    # Pruned as it goes: a row per claim (the window's second and third), its runs counted
    rows = QueueClaim.objects.filter(queue="flow-io").order_by("seq")
    assert [(r.seq, r.claims) for r in rows] == [(3, 1), (5, 2)]


@pytest.mark.parametrize(("rate", "frees_in"), [("3/m", 60), ("2/m", 70)])
def test_rate_frees_at_is_when_the_guarded_claim_admits_again(
    settings: Any, fake_clock: FakeClock, rate: str, frees_in: float
) -> None:
    """The time the tester's clock jumps to (testing.drain) over a full window: a claim of
    one run at t, one of two at t + 10 s. 3/m: the first row's leaving (t + 60) frees a place;
    2/m: the second row alone fills the window, so it must leave too (t + 70). A moment
    earlier the guarded claim admits nothing; at that time it admits one."""
    from tasks_engine.conf import QueueLimits
    from tasks_engine.transitions.flow_claims import rate_frees_at

    limit_queues(settings, {"flow-io": {"rate_limit": rate}})
    limits = engine_settings().queues["flow-io"]
    start = fake_clock.now()
    for _ in range(6):
        tasks_engine.enqueue("flow-plain", {})
    assert rate_frees_at("flow-io", limits, start) is None  # an empty log: room now
    assert len(claim(1)) == 1
    fake_clock.advance(10)
    assert len(claim(2)) == (2 if rate == "3/m" else 1)
    if rate == "2/m":  # log a second run with the second claim, as a claim of two would
        QueueClaim.objects.filter(queue="flow-io", seq=2).update(seq=3, claims=2)
    frees = rate_frees_at("flow-io", limits, fake_clock.now())
    assert frees == start + timedelta(seconds=frees_in)
    fake_clock.jump_to(frees - timedelta(microseconds=1))
    assert claim() == []
    fake_clock.jump_to(frees)
    assert rate_frees_at("flow-io", limits, frees) is None
    assert len(claim(1)) == 1
    assert rate_frees_at("flow-io", QueueLimits(concurrency=1), frees) is None  # no rate


def test_a_rate_log_row_of_a_worker_before_0014_counts_one_run(
    settings: Any, fake_clock: FakeClock
) -> None:
    """During a rolling deploy a worker of the release before migration 0014 still logs a row
    per run without `claims` (the database's default fills it in); both kinds count alike."""
    limit_queues(settings, {"flow-io": {"rate_limit": "3/m"}})
    for _ in range(5):
        tasks_engine.enqueue("flow-plain", {})
    fake_clock.advance(1)
    at = sql.p_dt(fake_clock.now())
    sql.execute(
        "INSERT INTO tasks_engine_queueclaim (queue, claimed_at, seq)"
        " VALUES ('flow-io', %s, 1), ('flow-io', %s, 2)",
        [at, at],
    )
    assert len(claim()) == 1  # two runs logged by the old worker, one place left
    rows = QueueClaim.objects.filter(queue="flow-io").order_by("seq")
    assert [(r.seq, r.claims) for r in rows] == [(1, 1), (2, 1), (3, 1)]
    assert claim() == []


def test_group_commit_claims_respect_limits(is_postgres: bool) -> None:
    if not is_postgres:
        pytest.skip("group commit is PostgreSQL's hot path; SQLite writes alone")
    from tasks_engine.transitions import HotWrite

    for _ in range(3):
        tasks_engine.enqueue("flow-disk", {"disk": "a"})
    [held] = claim()
    req = transitions.ClaimRequest("w", FLOW, None, 5, 30.0, ())
    at = held.run.created_at
    # The completion frees the key's only place: the claim after it takes exactly one run.
    got = transitions.write_group([HotWrite("complete", held.lease, (), at)], req)
    assert len(got) == 1
    assert WorkflowRun.objects.filter(status="running").count() == 1


@pytest.mark.parametrize(
    ("queues", "needle"),
    [
        ({"io": {"concurrency": 0}}, "QUEUES['io']['concurrency']"),
        ({"io": {"concurrency": "4"}}, "QUEUES['io']['concurrency']"),
        ({"io": {"rate_limit": "30/d"}}, "QUEUES['io']['rate_limit']"),
        ({"io": {"rate_limit": "0/s"}}, "QUEUES['io']['rate_limit']"),
        ({"io": {"rate_limit": 30}}, "QUEUES['io']['rate_limit']"),
        ({"io": {"burst": 3}}, "QUEUES['io']: unknown option"),
        ({"io": 4}, "QUEUES['io'] must be a dict"),
        ([], "QUEUES must be a dict"),
    ],
)
def test_bad_queue_settings_are_check_errors(settings: Any, queues: Any, needle: str) -> None:
    limit_queues(settings, queues)
    errors = [e for e in check_settings() if e.level >= checks.ERROR]
    assert [e.id for e in errors] == ["tasks_engine.E006"]
    assert needle in errors[0].msg


def test_good_queue_settings_parse(settings: Any) -> None:
    limit_queues(settings, {"io": {"concurrency": 4, "rate_limit": "30/m"}, "x": {}})
    assert not [e for e in check_settings() if e.level >= checks.ERROR]
    io = engine_settings().queues["io"]
    assert (io.concurrency, io.rate) == (4, (30, 60.0))


def test_bad_keys_and_limits_write_nothing() -> None:
    with pytest.raises(ValueError, match="concurrency_key"):
        tasks_engine.enqueue("b", concurrency_key="")
    with pytest.raises(ValueError, match="concurrency_key"):
        tasks_engine.enqueue("b", concurrency_key="k" * 256)
    for bad in (0, -1, 2**31):
        with pytest.raises(ValueError, match="concurrency_limit"):
            tasks_engine.enqueue("b", concurrency_key="k", concurrency_limit=bad)
    wrongs: list[Any] = [True, 1.5, "2"]
    for wrong in wrongs:
        with pytest.raises(TypeError, match="concurrency_limit"):
            tasks_engine.enqueue("b", concurrency_key="k", concurrency_limit=wrong)
    with pytest.raises(ValueError, match="needs a concurrency_key"):
        tasks_engine.enqueue("b", concurrency_limit=2)  # neither the workflow nor the call has one
    assert WorkflowRun.objects.count() == 0
    with pytest.raises(ValueError, match="concurrency_limit"):
        workflow(name="flow-bad", concurrency_key="k", concurrency_limit=0)(lambda ctx: None)
    with pytest.raises(TypeError, match="concurrency_key"):
        workflow(name="flow-bad", concurrency_key=3)(lambda ctx: None)  # type: ignore[arg-type]


def test_a_key_callable_that_raises_is_a_clear_value_error_and_writes_nothing() -> None:
    from tasks_engine.definitions import registry

    @workflow(name="flow-dict-key", concurrency_key=lambda inp: f"disk:{inp.disk}")
    def dict_key(ctx: Any) -> None: ...

    try:
        with pytest.raises(
            ValueError,
            match=r"concurrency_key callable of flow-dict-key@1 raised"
            r" AttributeError: .* \(it is given the input as a dict",
        ):
            tasks_engine.enqueue("flow-dict-key", {"disk": "a"})
    finally:
        registry.unregister("flow-dict-key", 1)
    assert WorkflowRun.objects.count() == 0


def test_unlimited_unkeyed_claims_stay_one_plain_statement() -> None:
    from django.test.utils import CaptureQueriesContext

    tasks_engine.enqueue("b")
    queue_state.current()  # read once per half poll interval, not per claim
    claim_floor.floor()  # partitioned tables: computed at most every REFRESH_SECONDS
    with CaptureQueriesContext(connection) as q:
        assert len(transitions.claim_runs("w", [("b", 1)], None, 5, 30.0)) == 1
    sent = [x["sql"] for x in q.captured_queries if "UPDATE" in x["sql"] or "SELECT" in x["sql"]]
    assert len(sent) == 1 and "advisory" not in sent[0]


@pytest.mark.parametrize("status", ["completed", "failed", "canceled", "pending", "waiting"])
def test_a_run_that_leaves_running_by_any_path_frees_its_place(settings: Any, status: str) -> None:
    """Nothing but the claim writes the counters: a run that leaves `running` by a path that
    knows nothing of them (here an UPDATE behind the engine's back) frees its key's and its
    queue's place for the next claim all the same."""
    limit_queues(settings, {"flow-io": {"concurrency": 1}})
    for _ in range(3):
        tasks_engine.enqueue("flow-plain", {}, concurrency_key="one")
    [first] = claim()
    assert claim() == []
    WorkflowRun.objects.filter(pk=first.run.pk).update(
        status=status,
        lease_token=None,
        available_at=None if status != "pending" else first.run.created_at,
    )
    [second] = claim()  # (a run handed back to pending, due first, may be this one again)
    assert second.run.pk != first.run.pk or status == "pending"
    assert claim() == []


def test_a_dead_workers_run_keeps_its_place_until_its_retaken_attempt_ends(
    settings: Any, fake_clock: FakeClock
) -> None:
    """A worker killed while holding a counted run: the run stays `running` (it holds its key's
    and queue's place) until its lease expires; the claim that retakes it admits nothing else
    of the key; once the retaken attempt ends, the place is free."""
    limit_queues(settings, {"flow-io": {"concurrency": 1}})
    for _ in range(2):
        tasks_engine.enqueue("flow-plain", {}, concurrency_key="one")
    [held] = transitions.claim_runs("dead", FLOW, None, 5, 10.0)
    assert transitions.claim_runs("alive", FLOW, None, 5, 10.0) == []
    fake_clock.advance(11)  # the dead worker's lease expired
    [retaken] = transitions.claim_runs("alive", FLOW, None, 5, 10.0)
    assert retaken.run.pk == held.run.pk
    finish([retaken])
    [nxt] = transitions.claim_runs("alive", FLOW, None, 5, 10.0)
    assert nxt.run.pk != held.run.pk


def test_a_rate_limits_log_never_goes_back_in_time(
    settings: Any, fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker whose clock is behind records the latest time the log holds, so the rows in a
    window are always the queue's last ones (counted by their sequence numbers)."""
    limit_queues(settings, {"flow-io": {"rate_limit": "2/m"}})
    for _ in range(6):
        tasks_engine.enqueue("flow-plain", {})
    fake_clock.advance(60)  # due for the worker behind too
    assert len(claim(1)) == 1
    with monkeypatch.context() as behind:  # another worker, half a minute behind
        behind.setattr(clock, "now", lambda: fake_clock.now() - timedelta(seconds=30))
        assert len(claim(1)) == 1
    rows = list(QueueClaim.objects.filter(queue="flow-io").order_by("seq"))
    assert [r.seq for r in rows] == [1, 2] and rows[0].claimed_at == rows[1].claimed_at
    fake_clock.advance(59)
    assert claim() == []  # both still inside the minute that ends now
    fake_clock.advance(2)
    assert len(claim()) == 2
    rows = list(QueueClaim.objects.filter(queue="flow-io").order_by("seq"))
    assert [(r.seq, r.claims) for r in rows] == [(4, 2)]  # one row for the claim's two runs
