"""enqueue_many: one statement for many runs, all or nothing, idempotency within and across
calls, the caller's transaction; the same rows as enqueue."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pydantic
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

import tasks_engine
from tasks_engine import IdempotencyConflict, UnknownTaskError
from tasks_engine.models import WorkflowRun
from tests.testapp.workflows import N

pytestmark = pytest.mark.django_db


def test_every_input_becomes_a_pending_run_in_order() -> None:
    res = tasks_engine.enqueue_many("noop", [{"n": i} for i in range(5)], priority=3, queue="q1")
    assert [r.deduplicated for r in res] == [False] * 5
    assert len({r.run_id for r in res}) == 5
    for i, r in enumerate(res):
        run = WorkflowRun.objects.get(pk=r.run_id)
        assert (run.status, run.input, run.priority, run.queue) == ("pending", {"n": i}, 3, "q1")
        assert run.task_name == "noop" and run.input_hash and run.available_at is not None


def test_a_thousand_runs_take_a_few_statements_not_one_each() -> None:
    with CaptureQueriesContext(connection) as queries:
        res = tasks_engine.enqueue_many("noop", [{"n": i} for i in range(1000)])
    assert len(res) == 1000 and WorkflowRun.objects.count() == 1000
    assert len(queries) <= 4  # the INSERT, and a savepoint around it


def test_the_rows_are_the_ones_enqueue_writes() -> None:
    when = datetime.now(UTC) + timedelta(hours=1)
    [many] = tasks_engine.enqueue_many("noop", [{"n": "7"}], available_at=when, tags={"a": "b"})
    one = tasks_engine.enqueue("noop", {"n": "7"}, available_at=when, tags={"a": "b"})
    columns = [f.attname for f in WorkflowRun._meta.concrete_fields]
    differ = {"id", "created_at", "updated_at"}
    a = WorkflowRun.objects.filter(pk=many.run_id).values(*columns).get()
    b = WorkflowRun.objects.filter(pk=one.run_id).values(*columns).get()
    assert {k: v for k, v in a.items() if k not in differ} == {
        k: v for k, v in b.items() if k not in differ
    }


def test_one_bad_input_names_its_index_and_writes_nothing() -> None:
    good = [{"n": i} for i in range(10)]
    with pytest.raises(pydantic.ValidationError) as caught:
        tasks_engine.enqueue_many("noop", [*good[:7], {"n": "not a number"}, *good[7:]])
    assert [e["loc"] for e in caught.value.errors()] == [(7, "n")]
    assert "7.n" in str(caught.value)
    assert WorkflowRun.objects.count() == 0


def test_an_unstorable_input_names_its_index_and_writes_nothing() -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        tasks_engine.enqueue_many("b", [{}, {"x": float("nan")}])
    assert caught.value.errors()[0]["loc"][0] == 1
    assert WorkflowRun.objects.count() == 0


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"queue": ""}, ValueError),
        ({"queue": 5}, ValueError),
        ({"priority": "high"}, TypeError),
        ({"available_at": datetime(2030, 1, 1)}, ValueError),  # naive
        ({"idempotency_keys": ["k"]}, ValueError),  # one key for two inputs
        ({"idempotency_keys": "kk"}, TypeError),
        ({"idempotency_keys": ["k", "x" * 256]}, ValueError),
        ({"tags": {"bad key": "v"}}, ValueError),
    ],
)
def test_bad_arguments_write_nothing(kwargs: dict, error: type[Exception]) -> None:
    with pytest.raises(error):
        tasks_engine.enqueue_many("noop", [{"n": 1}, {"n": 2}], **kwargs)
    assert WorkflowRun.objects.count() == 0


def test_inputs_must_be_a_list_and_the_task_known() -> None:
    with pytest.raises(TypeError):
        tasks_engine.enqueue_many("noop", {"n": 1})
    with pytest.raises(UnknownTaskError):
        tasks_engine.enqueue_many("no-such-task", [{}])
    assert tasks_engine.enqueue_many("noop", []) == []
    assert WorkflowRun.objects.count() == 0


def test_idempotency_within_one_call() -> None:
    res = tasks_engine.enqueue_many(
        "noop", [{"n": 1}, {"n": 2}, {"n": 1}], idempotency_keys=["k1", "k2", "k1"]
    )
    assert res[2] == tasks_engine.Enqueued(res[0].run_id, True)
    assert [r.deduplicated for r in res[:2]] == [False, False]
    assert WorkflowRun.objects.count() == 2


def test_a_key_repeated_with_another_input_in_one_call_writes_nothing() -> None:
    with pytest.raises(IdempotencyConflict):
        tasks_engine.enqueue_many("noop", [{"n": 1}, {"n": 2}], idempotency_keys=["k", "k"])
    assert WorkflowRun.objects.count() == 0


def test_idempotency_across_calls_and_with_enqueue() -> None:
    single = tasks_engine.enqueue("noop", {"n": 1}, idempotency_key="k1")
    first = tasks_engine.enqueue_many("noop", [{"n": 1}, {"n": 2}], idempotency_keys=["k1", None])
    assert first[0] == tasks_engine.Enqueued(single.run_id, True)
    again = tasks_engine.enqueue_many("noop", [{"n": 2}, {"n": 1}], idempotency_keys=["k2", "k1"])
    assert again[1] == tasks_engine.Enqueued(single.run_id, True)
    assert again[0].deduplicated is False
    assert tasks_engine.enqueue("noop", {"n": 2}, idempotency_key="k2") == tasks_engine.Enqueued(
        again[0].run_id, True
    )
    assert WorkflowRun.objects.count() == 3


def test_a_conflict_with_an_earlier_run_writes_nothing_of_the_call() -> None:
    tasks_engine.enqueue("noop", {"n": 1}, idempotency_key="taken")
    with pytest.raises(IdempotencyConflict):
        tasks_engine.enqueue_many(
            "noop", [{"n": 5}, {"n": 6}, {"n": 2}], idempotency_keys=["new", None, "taken"]
        )
    assert WorkflowRun.objects.count() == 1
    assert not WorkflowRun.objects.filter(idempotency_key="new").exists()


def test_queueing_keys_answer_with_the_queued_run() -> None:
    res = tasks_engine.enqueue_many("flow-scan", [{"disk": "a"}, {"disk": "b"}, {"disk": "a"}])
    assert res[2] == tasks_engine.Enqueued(res[0].run_id, True)
    later = tasks_engine.enqueue("flow-scan", {"disk": "b"})
    assert later == tasks_engine.Enqueued(res[1].run_id, True)
    assert WorkflowRun.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_rolled_back_with_the_callers_transaction() -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        tasks_engine.enqueue_many("noop", [{"n": i} for i in range(50)])
        assert WorkflowRun.objects.count() == 50  # visible inside the transaction
        raise Boom
    assert WorkflowRun.objects.count() == 0
    with transaction.atomic():
        tasks_engine.enqueue_many("noop", [{"n": i} for i in range(3)])
    assert WorkflowRun.objects.count() == 3


@pytest.mark.django_db(transaction=True)
def test_a_conflict_inside_the_callers_transaction_keeps_its_earlier_writes() -> None:
    with transaction.atomic():
        kept = tasks_engine.enqueue("noop", {"n": 1}, idempotency_key="taken")
        with pytest.raises(IdempotencyConflict):
            tasks_engine.enqueue_many(
                "noop", [{"n": 3}, {"n": 2}], idempotency_keys=[None, "taken"]
            )
    assert list(WorkflowRun.objects.values_list("pk", flat=True)) == [kept.run_id]


def test_the_workflow_object_and_its_defaults() -> None:
    from tests.testapp.workflows import tagged

    [r] = tasks_engine.enqueue_many(tagged, [{"n": 1}], tags={"tier": "2"})
    assert tasks_engine.get_run(r.run_id).tags == {"team": "media", "tier": "2"}


# One enqueue_many against enqueue per input, at one instant: every column alike but the id.
# Inputs that differ, repeat, or are the same object; columns the same for every run of the
# call (sent once) and columns that differ (a callable key, the idempotency keys).
SAME_ROWS = [
    ("noop", [{"n": 1}, {"n": 2}, {"n": 1}], {"tags": {"a": "b"}, "priority": 4}),
    ("bench_noop", [{}, {}, {"x": [1.5, "é", None]}], {"queue": "q2"}),
    ("bench_noop", [None, {"k": 1e20}, {"k": -0.0}, (1, 2)], {}),
    # equal in Python, not as JSON; a model inside: the full checks, not the one pass
    ("bench_noop", [{"a": 1, "m": N(n=1)}, {"a": True, "m": N(n=1)}, {"a": 1.0, "m": N(n=1)}], {}),
    ("flow-disk", [{"disk": "a"}, {"disk": "b"}], {}),
    ("flow-pair", [{"disk": "a"}, {"disk": "b"}], {}),
    ("flow-key-rate", [{"disk": "a"}, {"disk": "b"}], {}),
    ("deadline_sleeper", [{"seconds": 1}, {"seconds": 2}], {}),
    ("tagged", [{"n": 1}, {"n": 2}], {"tags": {"tier": "2"}}),
    ("bench_debounced", [{"k": "x"}, {"k": "y"}], {}),
]


@pytest.mark.parametrize(("task", "inputs", "kwargs"), SAME_ROWS)
def test_many_runs_are_the_rows_enqueue_writes(
    task: str, inputs: list, kwargs: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tasks_engine import clock

    at = datetime.now(UTC).replace(microsecond=123456)
    monkeypatch.setattr(clock, "now", lambda: at)
    keys = [f"k{i}" if i % 2 else None for i in range(len(inputs))]
    columns = [f.attname for f in WorkflowRun._meta.concrete_fields if f.attname != "id"]

    def rows(found: list[tasks_engine.Enqueued]) -> list[dict]:
        assert not any(r.deduplicated for r in found)
        by_id = WorkflowRun.objects.filter(pk__in=[r.run_id for r in found]).in_bulk()
        # repr: {"a": 1} == {"a": True} == {"a": 1.0} in Python, not as stored
        return [{c: repr(getattr(by_id[r.run_id], c)) for c in columns} for r in found]

    got = rows(tasks_engine.enqueue_many(task, inputs, idempotency_keys=keys, **kwargs))
    WorkflowRun.objects.all().delete()  # no key held for the enqueues
    each = [
        tasks_engine.enqueue(task, inp, idempotency_key=key, **kwargs)
        for inp, key in zip(inputs, keys, strict=True)
    ]
    assert got == rows(each)


def test_a_thousand_equal_inputs_and_a_thousand_different_ones() -> None:
    same = tasks_engine.enqueue_many("bench_noop", [{}] * 1000)
    different = tasks_engine.enqueue_many("bench_noop", [{"i": i} for i in range(1000)])
    assert len({r.run_id for r in same + different}) == 2000
    stored = dict(WorkflowRun.objects.values_list("pk", "input"))
    assert [stored[r.run_id] for r in same] == [{}] * 1000
    assert [stored[r.run_id] for r in different] == [{"i": i} for i in range(1000)]


@pytest.mark.postgres_only("NOTIFY")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("keys", [None, ["a", "b", None]])
def test_many_runs_wake_the_workers_of_their_queue_once(keys: list | None) -> None:
    import psycopg

    from tasks_engine.db import notify

    with psycopg.connect(**notify.listen_params(), autocommit=True) as conn:
        conn.execute(f"LISTEN {notify.CHANNEL}")
        inputs = [{"n": 1}, {"n": 2}, {"n": 3}]
        tasks_engine.enqueue_many("noop", inputs, queue="q7", idempotency_keys=keys)
        heard = [n.payload for n in conn.notifies(timeout=1.0)]
    assert heard == ["q7"]


PLAIN_OR_NOT = [
    {},
    {"b": 1, "a": [1, 2.5, None, True], "é": "ü"},
    {"big": 1e20, "neg": -0.0, "small": 1e-7},
    {1: "int key", 2: "sorted as text", 10: "x"},
    {"t": (1, 2)},
    [{"z": 1, "a": 2}],
    "text",
    7,
    {"nul": "a\x00b"},
    {"nan": float("nan")},
    {"when": datetime(2030, 1, 1, tzinfo=UTC)},
    {"deep": [[[[]]]] * 300},
    {"surrogate": "\ud800"},
]


@pytest.mark.parametrize("value", PLAIN_OR_NOT)
def test_one_pass_over_an_input_answers_as_the_full_checks(value: object) -> None:
    """plain_stored: the stored form, canonical text and hash the full checks give, or None
    (the full checks then run and name what is wrong)."""
    from tasks_engine.values.serialization import (
        canonical_json,
        input_hash,
        plain_stored,
        to_jsonable,
    )

    found = plain_stored(value)
    try:
        stored = to_jsonable(value)
        want = (stored, canonical_json(stored), input_hash(stored))
    except (TypeError, ValueError, UnicodeEncodeError):
        assert found is None
        return
    assert found is None or found == want
    if found is not None:
        assert json.dumps(found[0]) == json.dumps(want[0])  # floats alike too (-0.0, 1e20)
