"""An experiment, not the engine: how fast could a one-place guarded claim be at best?

    python bench/flow_imperative.py [--runs 400] [--rounds 6] [--database-url URL]

bench/flow.py's in-process row (claim one run, complete it, repeat; limits on ÷ off) stays
near 0.55 where issue 15 set 0.8 as its goal. docs/FLOW_CONTROL.md explains why: the guarded
claim's two set-based statements set up about 140 plan nodes at every execution, however few
of them run. This script measures a claim with the fewest nodes an exact design needs, to
know how far any redesign could go: a PL/pgSQL function that takes bench/flow.py's queue
lock, counts the queue's running runs and its rate log, probes the other four sources' partial
indexes (expired leases, due timers, free queues' and the limited queue's unkeyed runs: empty
in this bench), then walks the keyed runs in claim order, taking each key's lock and counting
its running runs until one has room, and claims that run and logs it. Each query in a VOLATILE
function takes its own snapshot under READ COMMITTED, so every count follows the lock it
needs: the guarantee the engine's two statements give.

It leaves out what the engine's claim also does (the worker's filters on workflow versions and
held runs, `worker_concurrency`, starting first steps, several limited queues, claims of more
than one place): a floor, not a candidate. Three claims alternate round by round on one
database (plain, engine guarded, this one; the order reversed every other round); every
claimed run is completed with the engine's `complete_run`. Prints one JSON line: medians per
claim and per cycle, and each guarded claim's cycle rate ÷ the plain one's, per round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import timedelta
from typing import Any

from common import database, setup_django
from engine import enqueue_many
from flow import KEY_LIMIT, QUEUE_LIMITS, configure, enqueue_keyed

# bench/flow.py's configuration: queue "default" with concurrency 256 and 1000000/s.
CONCURRENCY = QUEUE_LIMITS["default"]["concurrency"]
RATE, WINDOW = 1_000_000, 1.0

FUNCTION = """
CREATE OR REPLACE FUNCTION bench_claim_one(p_worker text, p_now timestamptz,
    p_expiry timestamptz, p_since timestamptz, p_concurrency int, p_rate int)
RETURNS SETOF tasks_engine_workflowrun LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off AS $$
DECLARE
    running int; last_seq bigint; last_at timestamptz; old_seq bigint; old_claims int;
    c record; claimed uuid;
BEGIN
    PERFORM pg_advisory_xact_lock({queue_lock}, hashtext('default'));
    SELECT count(*) INTO running FROM tasks_engine_workflowrun
        WHERE status = 'running' AND queue = 'default';
    IF running >= p_concurrency THEN RETURN; END IF;
    SELECT seq, claimed_at INTO last_seq, last_at FROM tasks_engine_queueclaim
        WHERE queue = 'default' ORDER BY queue, seq DESC LIMIT 1;
    SELECT seq, claims INTO old_seq, old_claims FROM tasks_engine_queueclaim
        WHERE queue = 'default' AND claimed_at > p_since ORDER BY queue, claimed_at, seq LIMIT 1;
    IF p_rate - coalesce(last_seq - old_seq + old_claims, 0) <= 0 THEN RETURN; END IF;
    PERFORM id FROM tasks_engine_workflowrun WHERE status = 'running'
        AND available_at <= p_now AND task_name = 'bench_noop' ORDER BY available_at LIMIT 1;
    PERFORM id FROM tasks_engine_workflowrun WHERE status = 'waiting' AND available_at <= p_now
        AND concurrency_key IS NULL AND task_name = 'bench_noop' ORDER BY available_at LIMIT 1;
    PERFORM id FROM tasks_engine_workflowrun WHERE status = 'pending' AND available_at <= p_now
        AND concurrency_key IS NULL AND queue <> 'default' AND task_name = 'bench_noop'
        ORDER BY priority DESC, available_at LIMIT 1;
    PERFORM id FROM tasks_engine_workflowrun WHERE status = 'pending' AND available_at <= p_now
        AND concurrency_key IS NULL AND queue = 'default' AND task_name = 'bench_noop'
        ORDER BY priority DESC, available_at LIMIT 1;
    FOR c IN SELECT id, concurrency_key AS k, coalesce(concurrency_limit, 1) AS lim
        FROM tasks_engine_workflowrun WHERE status = 'pending' AND concurrency_key IS NOT NULL
        AND available_at <= p_now ORDER BY priority DESC, available_at LIMIT 20
    LOOP
        CONTINUE WHEN NOT pg_try_advisory_xact_lock({key_lock}, hashtext(c.k));
        SELECT count(*) INTO running FROM tasks_engine_workflowrun
            WHERE status = 'running' AND concurrency_key = c.k;
        CONTINUE WHEN running >= c.lim;
        UPDATE tasks_engine_workflowrun SET status = 'running',
            lease_token = gen_random_uuid(), worker_id = p_worker, attempts = attempts + 1,
            due_at = available_at, available_at = p_expiry, waiting_on = '',
            started_at = coalesce(started_at, p_now), updated_at = p_now
        WHERE id = (SELECT id FROM tasks_engine_workflowrun WHERE id = c.id
                    AND status = 'pending' FOR UPDATE SKIP LOCKED)
        RETURNING id INTO claimed;
        CONTINUE WHEN claimed IS NULL;
        INSERT INTO tasks_engine_queueclaim (queue, claimed_at, seq, claims)
            VALUES ('default', greatest(p_now, last_at), coalesce(last_seq, 0) + 1, 1);
        DELETE FROM tasks_engine_queueclaim WHERE id IN (SELECT id FROM tasks_engine_queueclaim
            WHERE queue = 'default' AND claimed_at <= p_since ORDER BY queue, claimed_at
            LIMIT 1000);
        RETURN QUERY SELECT * FROM tasks_engine_workflowrun WHERE id = claimed;
        RETURN;
    END LOOP;
END $$
"""


def install() -> None:
    from django.db import connection

    from tasks_engine.transitions.flow_claims_pg import KEY_LOCK, QUEUE_LOCK

    with connection.cursor() as cur:
        cur.execute(FUNCTION.format(queue_lock=QUEUE_LOCK, key_lock=KEY_LOCK))


def claim_imperative() -> list[Any]:
    from django.db import connection

    from tasks_engine import clock
    from tasks_engine.transitions.claims import CLAIM_COLUMNS, claimed_from_rows

    now = clock.now()
    connection.ensure_connection()
    rows = connection.connection.execute(
        f"SELECT {', '.join(CLAIM_COLUMNS)} FROM bench_claim_one(%s, %s, %s, %s, %s, %s)",
        [
            "bench",
            now,
            now + timedelta(seconds=30),
            now - timedelta(seconds=WINDOW),
            CONCURRENCY,
            RATE,
        ],
        prepare=True,
    ).fetchall()
    return claimed_from_rows(rows, "bench")


def claim_engine() -> list[Any]:
    from tasks_engine import transitions

    return transitions.claim_runs("bench", [("bench_noop", 1)], None, 1, 30)


def one_round(mode: str, runs: int) -> tuple[float, float]:
    """Median claim and median cycle (claim + complete) in ms over `runs` claims."""
    from tasks_engine import transitions

    configure(mode != "plain")
    if mode == "plain":
        enqueue_many("bench_noop", runs)
    else:
        enqueue_keyed(runs)
    claim = claim_imperative if mode == "imperative" else claim_engine
    claims, cycles = [], []
    for _ in range(runs):
        start = time.perf_counter()
        got = claim()
        claimed = time.perf_counter()
        assert len(got) == 1, f"{mode}: claimed {len(got)} runs"
        transitions.complete_run(got[0].lease, None, [])
        claims.append(claimed - start)
        cycles.append(time.perf_counter() - start)
    return statistics.median(claims) * 1e3, statistics.median(cycles) * 1e3


def measure(database_url: str | None, runs: int, rounds: int) -> dict[str, Any]:
    if database_url is None:
        with database("bench_flow_imperative") as url:
            return measure(url, runs, rounds)
    setup_django(database_url)
    install()
    modes = ["plain", "guarded", "imperative"]
    took: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    for i in range(rounds):
        for mode in modes if i % 2 == 0 else modes[::-1]:
            took[mode].append(one_round(mode, runs))
    plain_cycles = [cycle for _, cycle in took["plain"]]
    row: dict[str, Any] = {"bench": "flow_imperative", "runs": runs, "rounds": rounds}
    row["key_limit"] = KEY_LIMIT
    for mode in modes:
        row[f"{mode}_claim_ms"] = round(statistics.median(c for c, _ in took[mode]), 3)
        row[f"{mode}_cycle_ms"] = round(statistics.median(c for _, c in took[mode]), 3)
    for mode in ("guarded", "imperative"):
        ratios = [p / c for p, (_, c) in zip(plain_cycles, took[mode], strict=True)]
        row[f"{mode}_ratio_per_round"] = [round(r, 3) for r in ratios]
        row[f"{mode}_ratio"] = round(statistics.median(ratios), 3)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=400)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--database-url", help="a fresh PostgreSQL database (default: one of its own)")
    a = p.parse_args()
    print(json.dumps(measure(a.database_url, a.runs, a.rounds)))


if __name__ == "__main__":
    main()
