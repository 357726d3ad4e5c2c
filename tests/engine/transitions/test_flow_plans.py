"""The guarded claim's plans on PostgreSQL stay on their partial indexes: runs held back by a
full key cost a claim a bounded number of rows, whichever queue it serves (EXPLAIN ANALYZE of
the prepared statements the claim really runs, with their generic plans)."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from django.db import connection

import tasks_engine
from tasks_engine import clock, transitions
from tasks_engine.transitions import claim_mode, flow_claims_pg
from tests.engine.transitions.test_flow_control import FLOW, _plain_claims_after, limit_queues

pytestmark = pytest.mark.django_db
_ = _plain_claims_after  # autouse here too
HELD = 3000
RUN = "tasks_engine_workflowrun"


@pytest.fixture
def postgres_only(is_postgres: bool) -> None:
    if not is_postgres:
        pytest.skip("the plans of the PostgreSQL claim; SQLite claims under BEGIN IMMEDIATE")


def hold_back(held: int, *, analyze: bool = True) -> None:
    """Key disk:hot full (one run running) and `held` more of its runs pending, ahead of
    every other run in claim order (`analyze`: and the statistics brought up to date)."""
    tasks_engine.enqueue("flow-disk", {"disk": "hot"})
    [running] = transitions.claim_runs("holder", FLOW, None, 1, 600.0)
    assert running.run.concurrency_key == "disk:hot"
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {RUN} (id, task_name, version, queue, status, priority, input,"
            " idempotency_key, input_hash, trace_id, attempts, failures, worker_id,"
            " available_at, waiting_on, cancel_reason, parent_step, unreached_steps,"
            " concurrency_key, concurrency_limit, created_at, updated_at)"
            " SELECT gen_random_uuid(), 'flow-disk', 1, 'default', 'pending', 0, '{}', NULL,"
            " '', '', 0, 0, '', now() - interval '1 hour', '', '', '', '[]', 'disk:hot', 1,"
            " now(), now() FROM generate_series(1, %s)",
            [held],
        )
        if analyze:
            cur.execute(f"ANALYZE {RUN}")


def rows_read(plan: dict[str, Any]) -> int:
    """Rows the plan's scans of the runs table produced or filtered out, over all loops."""
    loops = int(plan.get("Actual Loops", 1))
    own = 0
    if plan.get("Relation Name") == RUN and "Scan" in plan["Node Type"]:
        produced = int(plan.get("Actual Rows", 0)) + int(plan.get("Rows Removed by Filter", 0))
        own = produced * loops
    return own + sum(rows_read(p) for p in plan.get("Plans", []))


def numbered(sql: str) -> str:
    """The statement as PostgreSQL stores it: psycopg's %s placeholders numbered $1, $2..."""
    parts = sql.split("%s")
    return "".join(p + (f"${i}" if i < len(parts) else "") for i, p in enumerate(parts, 1))


def explain_claim(queues: list[str] | None) -> list[int]:
    """Claim once (which prepares both statements on this connection), then EXPLAIN ANALYZE
    the prepared statements themselves with the next claim's parameters: rows read by each."""
    req = transitions.ClaimRequest("w", FLOW, queues, 1, 600.0)
    limited = claim_mode.limited_queues(queues)
    claim_mode.note_keyed()
    transitions.claim_runs("w", FLOW, queues, 1, 600.0)
    first, p1, second, p2 = flow_claims_pg.statements(req, limited, clock.now())
    raw = connection.connection
    prepared = dict(raw.execute("SELECT statement, name FROM pg_prepared_statements").fetchall())
    mogrify = psycopg.ClientCursor(raw).mogrify
    counts = []
    for sql, params in ((first, p1), (second, p2)):
        name = prepared[numbered(sql)]
        args = ", ".join(["%s"] * len(params))
        explain = mogrify(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {name}({args})", params)
        [[doc]] = raw.execute(explain).fetchall()
        plan = (json.loads(doc) if isinstance(doc, str) else doc)[0]["Plan"]
        counts.append(rows_read(plan))
    return counts


def test_held_back_runs_cost_a_claim_of_another_queue_a_bounded_read(
    settings: Any, postgres_only: None
) -> None:
    limit_queues(settings, {"flow-io": {"concurrency": 4, "rate_limit": "1000/s"}})
    hold_back(HELD)
    for i in range(4):
        tasks_engine.enqueue("flow-plain", {}, concurrency_key=f"io-{i}")
        tasks_engine.enqueue("flow-plain", {})
    locking, claiming = explain_claim(["flow-io"])
    assert locking < 100 and claiming < 100, (locking, claiming)


def test_held_back_runs_cost_a_claim_of_other_keys_a_bounded_read(
    settings: Any, postgres_only: None
) -> None:
    limit_queues(settings, {"default": {"concurrency": 64}})
    hold_back(HELD)
    for disk in "abcd":
        tasks_engine.enqueue("flow-disk", {"disk": disk})
    locking, claiming = explain_claim(None)
    assert locking < 100 and claiming < 100, (locking, claiming)


def test_a_plan_made_while_the_table_was_small_stays_bounded_as_it_fills(
    settings: Any, postgres_only: None
) -> None:
    """The worker's generic plans are made once per connection, often while the runs table is
    small, and the statistics lag behind a backlog: the locked keys' found runs looked up as
    `id = ANY(setting)` then walked the status index over every pending run (6fca861); looked
    up one by one on the primary key, they cost a bounded read whatever the table became."""
    limit_queues(settings, {"default": {"concurrency": 64}})
    tasks_engine.enqueue("flow-disk", {"disk": "a"})
    claim_mode.note_keyed()
    with connection.cursor() as cur:
        cur.execute(f"ANALYZE {RUN}")  # a small table, as a young worker's plans see it
    assert len(transitions.claim_runs("w", FLOW, None, 1, 600.0)) == 1  # plans made here
    hold_back(HELD, analyze=False)
    for disk in "cd":
        tasks_engine.enqueue("flow-disk", {"disk": disk})
    locking, claiming = explain_claim(None)
    assert locking < 100 and claiming < 100, (locking, claiming)


def test_the_locking_statement_hands_over_only_as_many_runs_of_a_key_as_it_has_room(
    settings: Any, postgres_only: None
) -> None:
    """Each run handed to the claim statement costs it a lookup and a row lock: of each key,
    only the best as many as have room (the claim statement's own count still decides)."""
    limit_queues(settings, {"default": {"concurrency": 64}})
    pair = [tasks_engine.enqueue("flow-pair", {}).run_id for _ in range(5)]  # limit 2
    disk = [tasks_engine.enqueue("flow-disk", {"disk": "a"}).run_id for _ in range(3)]  # limit 1
    claim_mode.note_keyed()
    [first] = transitions.claim_runs("w", [("flow-pair", 1)], None, 1, 600.0)
    assert first.run.pk == pair[0]
    req = transitions.ClaimRequest("w", FLOW, None, 10, 600.0)
    lock, p1, _claim, _p2 = flow_claims_pg.statements(
        req, claim_mode.limited_queues(None), clock.now()
    )
    with connection.cursor() as cur:  # in the test's transaction, as the claim's own
        cur.execute(flow_claims_pg.PLANNED)
        cur.execute(lock, p1)
        cur.execute("SELECT current_setting(%s)", [flow_claims_pg.RUNS_SETTING])
        [handed] = cur.fetchone()
    ids = set(handed.strip("{}").split(","))
    assert ids == {str(pair[1]), str(disk[0])}, ids
    claimed = transitions.claim_runs("w", FLOW, None, 10, 600.0)
    assert {c.run.pk for c in claimed} == {pair[1], disk[0]}


def heads_walked(limit: int) -> bool:
    """Whether the locking statement of a claim of `limit` places visits each key's head
    (EXPLAIN ANALYZE of it, in the test's transaction)."""
    req = transitions.ClaimRequest("w", FLOW, None, limit, 600.0)
    lock, p1, _claim, _p2 = flow_claims_pg.statements(
        req, claim_mode.limited_queues(None), clock.now()
    )
    with connection.cursor() as cur:
        cur.execute(*flow_claims_pg.planner_settings())  # and the claim floor, partitioned
        cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + lock, p1)
        [[doc]] = cur.fetchall()
    plan = (json.loads(doc) if isinstance(doc, str) else doc)[0]["Plan"]

    def loops(node: dict[str, Any]) -> int | None:
        if node.get("Subplan Name") == "CTE heads":
            return int(node.get("Actual Loops", 0))
        found = (loops(p) for p in node.get("Plans", []))
        return next((n for n in found if n is not None), None)

    n = loops(plan)
    assert n is not None, "no CTE heads in the locking statement's plan"
    return n > 0


def test_the_keys_heads_are_walked_only_when_the_scanned_runs_cannot_fill_the_claim(
    settings: Any, postgres_only: None
) -> None:
    """The scan reads walk_size(4) = 14 keyed runs in claim order; each key's head is visited
    only when the runs it found with room are fewer than the claim's places (a head past the
    scan comes after all of them)."""
    limit_queues(settings, {"default": {"concurrency": 64}})
    claim_mode.note_keyed()
    # Three keys of limit 2, six runs each, interleaved: 18 runs, the scan is full, and the
    # 14 it reads offer 6 places (two a key) for a claim of 4. Fewer keys than places:
    # the heads were walked before.
    for _ in range(6):
        for disk in "xyz":
            tasks_engine.enqueue("flow-disk", {"disk": disk}, concurrency_limit=2)
    assert flow_claims_pg.walk_size(4) == 14
    assert not heads_walked(4)
    claimed = transitions.claim_runs("w", FLOW, None, 4, 600.0)
    # Best first: x, y, z, then x again (a key of limit 2 takes its second place).
    assert sorted(str(c.run.concurrency_key) for c in claimed) == [
        "disk:x",
        "disk:x",
        "disk:y",
        "disk:z",
    ]


def test_a_claim_takes_keys_past_a_scan_that_one_key_fills(
    settings: Any, postgres_only: None
) -> None:
    limit_queues(settings, {"default": {"concurrency": 64}})
    claim_mode.note_keyed()
    first = [tasks_engine.enqueue("flow-disk", {"disk": "a"}).run_id for _ in range(20)]
    later = [tasks_engine.enqueue("flow-disk", {"disk": d}).run_id for d in "bcd"]
    assert heads_walked(4)
    claimed = transitions.claim_runs("w", FLOW, None, 4, 600.0)
    assert {c.run.pk for c in claimed} == {first[0], *later}
