"""Promises the engine makes under racing cancels, poisoned values and engine-side database
errors (each test failed on the engine before its fix). Both databases, in-process."""

from __future__ import annotations

import json
import math
import threading
import uuid
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import OperationalError, connection
from pydantic import BaseModel, ValidationError

import tasks_engine
from tasks_engine import RetryPolicy, UnstorableValueError, transitions
from tasks_engine.exceptions import EngineUnavailable, FencingError
from tasks_engine.models import OpLedger, StepAttempt, WorkflowRun
from tasks_engine.runtime import executor, fencing
from tasks_engine.values.serialization import to_jsonable
from tests.helpers import FakeClock, drain
from tests.testapp.models import SideEffect
from tests.testapp.promise_workflows import Reading, Stamped

pytestmark = pytest.mark.django_db


def run(run_id: Any) -> WorkflowRun:
    return WorkflowRun.objects.get(pk=run_id)


def claim(task: str, worker: str = "w") -> tuple[transitions.Claimed, Any, Any]:
    [c] = transitions.claim_runs(worker, [(task, 1)], None, 1, 30)
    wf, ctx = executor.build_context(c.run, c.lease, threading.Event(), c.prestarted)
    return c, wf, ctx


# -- a cancel that lands while a step runs --------------------------------------------------


@pytest.mark.parametrize("then", ["sleep", "fact", "child", "step"])
def test_a_cancel_during_a_step_is_not_lost_when_the_run_then_parks(
    fake_clock: FakeClock, then: str
) -> None:
    rid = tasks_engine.enqueue("cancel_then_park", {"then": then}).run_id
    assert drain(fake_clock, horizon=0) == ["canceled"]
    r = run(rid)
    assert (r.status, r.cancel_reason) == ("canceled", "from the step")
    assert not WorkflowRun.objects.filter(parent_run_id=rid).exists()  # no child started
    assert not SideEffect.objects.filter(key="after").exists()  # no step started
    assert not StepAttempt.objects.filter(run_id=rid, status="running").exists()


def test_a_cancel_that_commits_as_the_handler_returns_wins_over_the_completion(
    fake_clock: FakeClock,
) -> None:
    """cancel() answered True: the run must not then end completed (the completion's write
    saw the cancel only as a row it replaced, and wrote over it)."""
    rid = tasks_engine.enqueue("canceled_as_it_returns").run_id
    drain(fake_clock, horizon=0)
    r = run(rid)
    assert (r.status, r.cancel_reason, r.output) == ("canceled", "late", None)
    assert StepAttempt.objects.get(run_id=rid, name="work").status == "completed"
    assert r.finished_at is not None and r.lease_token is None


def test_a_cancel_that_commits_as_the_handler_fails_wins_over_the_failure(
    fake_clock: FakeClock,
) -> None:
    rid = tasks_engine.enqueue("canceled_as_it_fails").run_id
    drain(fake_clock, horizon=0)
    r = run(rid)
    assert (r.status, r.cancel_reason) == ("canceled", "late")
    assert r.error["message"] == "broke at the end"  # kept for the record


def test_a_child_completing_as_its_parent_is_canceled_ends_canceled_too(
    fake_clock: FakeClock,
) -> None:
    parent = tasks_engine.enqueue("parent_of_late_child").run_id
    drain(fake_clock, horizon=0)
    [child] = WorkflowRun.objects.filter(parent_run_id=parent)
    assert (run(parent).status, run(child.pk).status) == ("canceled", "canceled")
    assert run(child.pk).output is None


def test_a_child_started_before_the_cancel_is_canceled_with_its_parent(
    fake_clock: FakeClock,
) -> None:
    parent = tasks_engine.enqueue("parent", {"value": 1, "sleep": 60}).run_id
    drain(fake_clock, horizon=0)  # the parent waits on its child, which sleeps
    [child] = WorkflowRun.objects.filter(parent_run_id=parent)
    assert tasks_engine.cancel(parent) is True
    assert (run(parent).status, run(child.pk).status) == ("canceled", "canceled")


def test_a_run_that_fails_leaves_no_child_running(fake_clock: FakeClock) -> None:
    parent = tasks_engine.enqueue(
        "parent", {"value": 1, "sleep": 3600}, deadline_at=fake_clock.now()
    ).run_id
    c, wf, ctx = claim("parent")
    # The child was started by an earlier pass; the parent now fails on its deadline.
    child = tasks_engine.enqueue("child_echo", {"sleep": 3600}, parent_run_id=parent).run_id
    fake_clock.advance(1)
    assert executor.execute(c.run, wf, ctx) == "failed"
    assert (run(parent).status, run(child).status) == ("failed", "canceled")


# -- engine-side database errors are outages ------------------------------------------------


def break_statements(monkeypatch: pytest.MonkeyPatch, module: Any, needle: str) -> list[str]:
    """The next statement of `module` whose SQL contains `needle` fails as a dropped
    connection would; returns the log of statements that failed."""
    failed: list[str] = []
    for name in ("execute", "fetchall"):
        real = getattr(module, name, None)
        if real is None:
            continue

        def broken(sql: str, params: Any = (), _real: Any = real) -> Any:
            if needle in sql and not failed:
                failed.append(sql)
                raise OperationalError("server closed the connection unexpectedly")
            return _real(sql, params)

        monkeypatch.setattr(module, name, broken)
    return failed


@pytest.mark.parametrize(
    ("module", "needle"),
    [
        (transitions.outcomes, "status = 'waiting'"),  # parking
        (transitions.hot, "INSERT INTO"),  # the sleep's timer
    ],
)
def test_a_database_error_in_an_engine_write_is_an_outage_not_a_failure(
    fake_clock: FakeClock, module: Any, needle: str
) -> None:
    rid = tasks_engine.enqueue("swallows_suspension").run_id
    c, wf, ctx = claim("swallows_suspension")
    with pytest.MonkeyPatch.context() as mp:
        failed = break_statements(mp, module, needle)
        with pytest.raises(EngineUnavailable):  # user code's `except Exception` can't catch it
            executor.execute(c.run, wf, ctx)
    assert failed
    assert run(rid).status == "running"  # nothing ended: the run is replayed
    transitions.requeue_run(c.lease, fake_clock.now())  # what the worker's slot does next
    drain(fake_clock)
    assert (run(rid).status, run(rid).output) == ("completed", "slept")


def test_a_database_error_while_taking_a_fact_is_an_outage(fake_clock: FakeClock) -> None:
    rid = tasks_engine.enqueue("fact_waiter", {"count": 1}).run_id
    tasks_engine.signal(rid, "item", "x")
    c, wf, ctx = claim("fact_waiter")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            transitions.waiting.Fact.objects,
            "filter",
            lambda *a, **k: (_ for _ in ()).throw(OperationalError("deadlock detected")),
        )
        with pytest.raises(EngineUnavailable):
            executor.execute(c.run, wf, ctx)
    fake_clock.advance(31)
    drain(fake_clock)
    assert (run(rid).status, run(rid).output) == ("completed", ["x"])


def test_a_deferred_completion_whose_flush_failed_still_rides_on_the_next_write() -> None:
    tasks_engine.enqueue("b")
    c, _, _ = claim("b")
    step = transitions.start_step(c.lease, "s", "function", 1, 1)
    transitions.defer_step_completion(c.lease, step, "out")
    # A completion leaves the queue only once a statement carrying it commits: a flush whose
    # write failed leaves it there (test_hot_path_faults.py fails one for real).
    assert [item.step_id for item in c.lease.deferred.pending()] == [step]
    transitions.complete_run(c.lease, "done", [])
    assert StepAttempt.objects.get(pk=step).status == "completed"


# -- values that cannot be stored ---------------------------------------------------------


@pytest.mark.parametrize(
    "kind", ["datetime", "set", "nan", "inf", "nul", "nul-key", "deep", "deep-model"]
)
def test_an_unstorable_step_result_fails_the_step_once_without_retrying(
    fake_clock: FakeClock, kind: str
) -> None:
    rid = tasks_engine.enqueue("bad_step_result", {"kind": kind}).run_id
    assert drain(fake_clock) == ["failed"]
    r = run(rid)
    assert SideEffect.objects.filter(key="produce", run_id=rid).count() == 1
    assert r.error["type"] == "tasks_engine.exceptions.UnstorableValueError"
    assert "cannot be stored as JSON" in r.error["message"]
    [attempt] = StepAttempt.objects.filter(run_id=rid, name="produce")
    assert attempt.status == "failed"


@pytest.mark.parametrize("kind", ["datetime", "nan", "nul", "deep"])
def test_an_unstorable_run_output_fails_the_run_instead_of_looping(
    fake_clock: FakeClock, kind: str
) -> None:
    rid = tasks_engine.enqueue("bad_output_after_sleep", {"kind": kind}).run_id
    drain(fake_clock)
    r = run(rid)
    assert (r.status, r.error["type"]) == ("failed", "tasks_engine.exceptions.UnstorableValueError")


def test_unstorable_values_are_named_in_the_message() -> None:
    with pytest.raises(UnstorableValueError, match=r"a date at \['when'\]"):
        to_jsonable({"when": __import__("datetime").date(2026, 1, 1)}, "step 'x' result")
    with pytest.raises(UnstorableValueError, match=r"float nan at \[1\]"):
        to_jsonable([1, math.nan])
    with pytest.raises(UnstorableValueError, match="NUL"):
        to_jsonable("a\x00b")
    assert to_jsonable({"text": "the six characters \\u0000"}) == {
        "text": "the six characters \\u0000"
    }


def test_pydantic_results_are_stored_in_json_mode(fake_clock: FakeClock) -> None:
    rid = tasks_engine.enqueue("model_results").run_id
    assert drain(fake_clock) == ["suspended", "completed"]
    r = run(rid)
    written = {"when": "2026-01-01T03:00:00Z", "id": str(uuid.UUID(int=5))}
    assert r.output == {**written, "reading": 1.5}
    assert StepAttempt.objects.get(run_id=rid, name="stamp").output == {**written, "reading": 0.0}


def test_a_model_holding_what_json_cannot_is_still_refused() -> None:
    class Odd(BaseModel):
        model_config = {"arbitrary_types_allowed": True}
        thing: object

    when = __import__("datetime").datetime(2026, 1, 1)
    assert to_jsonable(Stamped(when=when, id=uuid.UUID(int=1)))["when"] == "2026-01-01T00:00:00"
    with pytest.raises(UnstorableValueError, match=r"float nan at \['reading'\]"):
        to_jsonable(Stamped(when=when, id=uuid.UUID(int=1), reading=math.nan))
    with pytest.raises(UnstorableValueError, match=r"NUL"):
        to_jsonable({"nested": [Reading(celsius=1.0, label="a\x00b")]})
    with pytest.raises(UnstorableValueError, match="cannot be stored as JSON"):
        to_jsonable(Odd(thing=threading.Lock()), "step 'x' result")


@pytest.mark.parametrize("celsius", [math.nan, math.inf, -math.inf])
def test_non_finite_input_is_a_validation_error_and_writes_nothing(celsius: float) -> None:
    with pytest.raises(ValidationError, match="cannot be stored as JSON"):
        tasks_engine.enqueue("reading", {"celsius": celsius})
    with pytest.raises(ValidationError):
        tasks_engine.enqueue("b", {"x": celsius})  # a workflow without an input model
    assert not WorkflowRun.objects.exists()


def test_a_nul_in_input_is_a_validation_error_and_writes_nothing() -> None:
    with pytest.raises(ValidationError):
        tasks_engine.enqueue("reading", {"celsius": 1.0, "label": "a\x00b"})
    assert not WorkflowRun.objects.exists()


@pytest.mark.parametrize("levels", [201, 600, 2_000, 50_000])
def test_values_nested_too_deeply_are_refused_with_a_clear_error(levels: int) -> None:
    """Past Python's recursion limit they raised a RecursionError from deep inside (a
    traceback of thousands of lines); past SQLite's 1,000 levels its JSON check failed the
    row; a model's input past pydantic's own bound was "Maximum serialization depth exceeded".
    MAX_JSON_DEPTH (200) is the deepest, on both databases."""
    from outbox import publish
    from outbox.models import OutboxEvent
    from tests.testapp.promise_workflows import deep

    too_deep = "cannot be stored as JSON: it is nested too deeply"
    with pytest.raises(ValueError, match=too_deep):
        tasks_engine.enqueue("b", {"x": deep(levels - 1)})  # a workflow without an input model
    with pytest.raises(ValueError, match=too_deep):
        tasks_engine.enqueue("anything", {"data": deep(levels)})  # a model with an Any field
    rid = tasks_engine.enqueue("fact_waiter").run_id
    with pytest.raises(UnstorableValueError, match=too_deep):
        tasks_engine.signal(rid, "item", deep(levels))
    with pytest.raises(UnstorableValueError, match=too_deep):
        publish("test.record", {"x": deep(levels)})
    assert not run(rid).facts.exists()
    assert not OutboxEvent.objects.exists()
    assert WorkflowRun.objects.count() == 1


def test_values_nested_as_deep_as_the_limit_are_stored() -> None:
    from outbox import publish
    from tests.testapp.promise_workflows import deep

    tasks_engine.enqueue("b", {"x": deep(199)})  # 200 levels with its object
    tasks_engine.enqueue("anything", {"data": deep(199)})
    rid = tasks_engine.enqueue("fact_waiter").run_id
    assert tasks_engine.signal(rid, "item", deep(200)).delivered
    assert publish("test.record", {"x": deep(199)}).payload == {"x": deep(199)}
    assert WorkflowRun.objects.get(task_name="b").input == {"x": deep(199)}


SMALLEST_BOUND = 64 * 2**10


@pytest.fixture
def small_bound(settings: Any) -> int:
    settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "MAX_PAYLOAD_BYTES": SMALLEST_BOUND}
    return SMALLEST_BOUND


def blobs(bound: int, char: str) -> tuple[dict[str, str], dict[str, str], int]:
    """{"blob": char * n} as large as fits in `bound` bytes of compact JSON (11 bytes around
    the characters), the same with one character more, and the size of that one."""
    width = len(char.encode())
    fits = (bound - 11) // width
    return {"blob": char * fits}, {"blob": char * (fits + 1)}, 11 + (fits + 1) * width


@pytest.mark.parametrize("char", ["x", "\u00e9", "\U0001f600"])  # 1, 2 and 4 bytes of UTF-8
def test_payloads_past_max_payload_bytes_are_refused_and_write_nothing(
    small_bound: int, char: str
) -> None:
    """No bound was kept: a 200 MB signal payload was accepted, and past PostgreSQL's jsonb
    limit it would have been a raw DataError. The size is that of the compact JSON in UTF-8."""
    from outbox import publish
    from outbox.models import OutboxEvent

    fits, over, size = blobs(small_bound, char)
    message = rf"too large to store: {size} bytes as JSON, at most {small_bound}"
    before = WorkflowRun.objects.count()
    with pytest.raises(ValueError, match=f"the input of b@1 is {message}"):
        tasks_engine.enqueue("b", over)
    with pytest.raises(ValueError, match=f"the input of anything@1 is {message}"):
        tasks_engine.enqueue("anything", {"data": over["blob"]})  # {"data":...}: 11 too
    rid = tasks_engine.enqueue("fact_waiter").run_id
    with pytest.raises(ValueError, match=message):
        tasks_engine.signal(rid, "item", over)
    with pytest.raises(ValueError, match=message):
        publish("test.record", over)
    assert (WorkflowRun.objects.count(), run(rid).facts.count()) == (before + 1, 0)
    assert not OutboxEvent.objects.exists()
    tasks_engine.enqueue("b", fits)
    assert tasks_engine.signal(rid, "item", fits).delivered
    assert publish("test.record", fits).payload == fits
    assert tasks_engine.signal(rid, "item", fits["blob"]).delivered  # a string: 2 + its bytes


def test_a_signal_payload_past_the_default_bound_is_refused() -> None:
    rid = tasks_engine.enqueue("fact_waiter").run_id
    with pytest.raises(ValueError, match=r"\d+ bytes as JSON, at most 16777216"):
        tasks_engine.signal(rid, "item", ["x" * 2**20] * 16)
    assert not run(rid).facts.exists()


def test_a_step_result_past_the_bound_fails_the_step_at_once(
    fake_clock: FakeClock, small_bound: int
) -> None:
    rid = tasks_engine.enqueue("bad_step_result", {"kind": "large"}).run_id
    assert drain(fake_clock) == ["failed"]
    assert SideEffect.objects.filter(key="produce", run_id=rid).count() == 1  # not retried
    [attempt] = StepAttempt.objects.filter(run_id=rid, name="produce")
    assert (attempt.status, attempt.error["terminal"]) == ("failed", True)
    message = attempt.error["message"]
    assert "step 'produce'" in message and "70011 bytes as JSON, at most 65536" in message
    assert run(rid).error["type"] == "tasks_engine.exceptions.UnstorableValueError"


def test_a_run_output_past_the_bound_fails_the_run(fake_clock: FakeClock, small_bound: int) -> None:
    rid = tasks_engine.enqueue("bad_output_after_sleep", {"kind": "large"}).run_id
    drain(fake_clock)
    r = run(rid)
    assert (r.status, r.error["type"]) == ("failed", "tasks_engine.exceptions.UnstorableValueError")
    assert "70011 bytes as JSON, at most 65536" in r.error["message"]
    assert r.output is None


def test_a_signal_payload_that_cannot_be_stored_is_refused() -> None:
    rid = tasks_engine.enqueue("fact_waiter").run_id
    with pytest.raises(UnstorableValueError):
        tasks_engine.signal(rid, "item", {"x": math.nan})
    assert not run(rid).facts.exists()


@pytest.mark.parametrize("value", ['{"celsius": NaN}', '{"celsius": Infinity}', "[-Infinity]"])
def test_the_cli_refuses_non_standard_json(value: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises((SystemExit, CommandError)) as refused:  # argparse's own exit, code 2
        call_command("tasks", "enqueue", "reading", "--input", value, stdout=StringIO())
    assert "not standard JSON" in str(refused.value) + capsys.readouterr().err
    assert not WorkflowRun.objects.exists()


# -- retries --------------------------------------------------------------------------------


def test_a_workflow_retry_starts_a_failed_child_again(fake_clock: FakeClock) -> None:
    rid = tasks_engine.enqueue("retrying_parent").run_id
    drain(fake_clock)
    r = run(rid)
    assert (r.status, r.output) == ("completed", "second child ok")
    # Under the fake clock both children may share one created_at: order by status, then
    # check that the failed one came first.
    failed, completed = WorkflowRun.objects.filter(parent_run_id=rid).order_by("-status")
    assert (failed.status, completed.status) == ("failed", "completed")
    assert failed.created_at <= completed.created_at


def test_a_long_retry_budget_does_not_overflow_the_backoff() -> None:
    policy = RetryPolicy(max_attempts=5000, initial_interval=1.0, backoff_coefficient=10.0)
    assert policy.delay(1100) == policy.max_interval
    assert RetryPolicy(max_attempts=5000).delay(4999) == 60.0


# -- the op ledger across runs ----------------------------------------------------------------


def test_an_op_in_progress_in_another_run_is_not_entered_beside_it(fake_clock: FakeClock) -> None:
    a = tasks_engine.enqueue("op_user", {"op_key": "download:42"}, idempotency_key="a").run_id
    b = tasks_engine.enqueue("op_user", {"op_key": "download:42"}, idempotency_key="b").run_id
    ca, _, _ = claim("op_user")
    assert ca.lease.run_id == a
    assert fencing._record_start(ca.lease, "download:42") is False  # A is inside the op
    cb, wf, ctx = claim("op_user", "w2")
    assert executor.execute(cb.run, wf, ctx) == "suspended"  # B waits for A instead
    assert not SideEffect.objects.filter(key="op-fn").exists()
    assert run(b).status == "pending"
    # A's worker dies; B takes the op over once A's lease is gone.
    fake_clock.advance(31)
    WorkflowRun.objects.filter(pk=a).update(status="pending", lease_token=None)
    drain(fake_clock)
    assert {run(a).status, run(b).status} == {"completed"}
    # A's old attempt can no longer store a result for the op B finished.
    with pytest.raises(FencingError):
        fencing._store_result(ca.lease, "download:42", "stale")
    entry = OpLedger.objects.get(op_key="download:42")
    assert (entry.status, entry.result) == ("done", "done")
    assert SideEffect.objects.filter(key="op-fn").count() == 1


def test_a_stale_attempt_cannot_mark_an_op_done_after_another_took_it_over(
    fake_clock: FakeClock,
) -> None:
    tasks_engine.enqueue("op_user", {"op_key": "k"})
    old, _, _ = claim("op_user")
    assert fencing._record_start(old.lease, "k") is False
    fake_clock.advance(31)
    new, _, _ = claim("op_user", "w2")  # the lease expired and another worker took the run
    assert fencing._record_start(new.lease, "k") is True  # resumed
    with pytest.raises(FencingError):
        fencing._store_result(old.lease, "k", "stale")
    assert json.dumps(OpLedger.objects.get(op_key="k").result) == "null"


def test_a_run_aborted_by_a_graceful_stop_is_handed_back_at_once(fake_clock: FakeClock) -> None:
    """Found by the simulation: a step aborted at shutdown unwound as a lost lease and the run
    waited for its lease to expire instead of going back to any worker."""
    rid = tasks_engine.enqueue("abortable").run_id
    c, wf, ctx = claim("abortable")
    ctx.abort_signal.abort(tasks_engine.exceptions.WorkerStopping("worker shutting down"))
    assert executor.execute(c.run, wf, ctx) == "handed-back"
    r = run(rid)
    assert (r.status, r.available_at) == ("pending", fake_clock.now())
    assert not StepAttempt.objects.filter(run_id=rid, status="running").exists()


def test_a_failing_begin_around_a_child_start_is_an_outage(fake_clock: FakeClock) -> None:
    """Found by the simulation (SQLite): the transaction run_child opens failed at BEGIN
    IMMEDIATE ("database is locked"), outside every engine write, and failed the parent."""
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL sends no BEGIN statement of its own (psycopg begins implicitly)")
    rid = tasks_engine.enqueue("parent", {"value": 1}).run_id
    c, wf, ctx = claim("parent")
    failed: list[str] = []

    def locked(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if not failed and (sql.startswith("BEGIN") or "cancel_requested_at FROM" in sql):
            failed.append(sql)
            raise OperationalError("database is locked")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(locked), pytest.raises(EngineUnavailable):
        executor.execute(c.run, wf, ctx)
    assert failed and run(rid).status == "running"
    transitions.requeue_run(c.lease, fake_clock.now())
    drain(fake_clock)
    assert run(rid).status == "completed"


# -- async code in a plain engine ----------------------------------------------------------


@pytest.mark.filterwarnings("error::RuntimeWarning")  # "coroutine ... was never awaited"
@pytest.mark.parametrize("kind", ["function", "lambda"])
def test_an_async_step_function_fails_its_step_at_once_saying_what_to_write(
    fake_clock: FakeClock, kind: str
) -> None:
    import gc

    rid = tasks_engine.enqueue("async_step_function", {"kind": kind}).run_id
    assert drain(fake_clock) == ["failed"]
    gc.collect()  # a coroutine left unawaited would warn (an error here) when collected
    r = run(rid)
    assert r.error["type"] == "tasks_engine.exceptions.AsyncStepError"
    assert "a plain workflow would never await" in r.error["message"]
    assert "make the workflow an async def and write `await ctx.step.run(" in r.error["message"]
    assert "or define the step function with def" in r.error["message"]
    [attempt] = StepAttempt.objects.filter(run_id=rid, name="fetch")
    assert (attempt.status, attempt.error["terminal"]) == ("failed", True)
