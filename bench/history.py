"""Issue 47's history row: the enqueue rate and the claim + complete rate with `--history`
finished runs in the table against an empty one, in one run.

    python bench/history.py [--history 10000000] [--runs 2000] [--rounds 3] [--partition]
    python bench/history.py --history 1000000 --organic   # history made by the engine
    python bench/history.py --quick          # 20,000 runs of history: checks the harness

Two databases on one throwaway cluster (or on $BENCH_SERVER_URL), fsync on: `empty` and
`loaded`. The loaded one is filled in chunks by SQL (generate_series, no Python per row) with
runs that look like a month of real history: version 7 ids in creation order, one every
30 days / N, ending a minute ago; 95 % completed, 3 % failed (two failed attempts), 2 %
canceled; four workflows on three queues; a fifth of them with an idempotency key, a tenth
with tags; one step attempt each, two for a third of the completed runs and for the failed
ones. Then VACUUM ANALYZE, CHECKPOINT and a sync, on both databases. Each round measures both
databases, in alternating order (empty first, then loaded first): `--runs` enqueues of
bench_noop, one per transaction, then as many claims + completions in-process, one at a time
(engine.claim_rate). Prints the load time, the tables' sizes and one JSON line: medians of
the rounds, loaded ÷ empty, and WAL bytes per run of each phase.

`--partition` migrates and fills the loaded database with TASKS_ENGINE["PARTITION"] = "month"
(an engine that does not know that setting is refused before anything is built), its history
in the 30 days before this month began, in the partitions of their months (history_end); the
empty one is partitioned too, so the ratio is what the history costs, not what partitioning
does (bench/partition_cost.py measures that). `--organic` makes the history with the engine itself
instead (enqueue_many, then a burst worker drains each chunk; about 1,750 runs/s here): slower,
but its pages are laid out by the engine's own claims, completions and autovacuum.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from common import Timer, database, engine_code, median, setup_django, worker
from engine import claim_rate, enqueue_many, use_database, wait_all_finished

# The loaded database's history: one run every `span / total` of the 30 days up to a minute
# ago, in chunks of `chunk` runs (the g of generate_series numbers them across chunks).
DAYS = 30
RUNS = """
    INSERT INTO tasks_engine_workflowrun (id, task_name, version, queue, status, priority,
        input, output, error, idempotency_key, input_hash, trace_id, attempts, failures,
        worker_id, available_at, waiting_on, cancel_reason, parent_step, unreached_steps,
        tags, created_at, started_at, finished_at, updated_at)
    SELECT
        (lpad(to_hex((extract(epoch FROM h.created_at) * 1000)::bigint), 12, '0') || '7'
         || substr(md5(random()::text), 1, 3) || '8' || substr(md5(random()::text), 1, 15)
        )::uuid,
        h.task, 1, h.queue, h.status, 0,
        jsonb_build_object('item', h.g),
        CASE WHEN h.status = 'completed' THEN '{"ok": true}'::jsonb END,
        CASE WHEN h.status = 'failed'
            THEN '{"type": "TimeoutError", "message": "upstream timed out"}'::jsonb END,
        CASE WHEN h.g %% 5 = 0 THEN 'order-' || h.g END,
        encode(sha256(convert_to('{"item":' || h.g || '}', 'UTF8')), 'hex'),
        '',
        CASE WHEN h.status = 'failed' THEN 2 ELSE 1 END,
        CASE WHEN h.status = 'failed' THEN 2 ELSE 0 END,
        'worker-' || (h.g %% 8), NULL, '',
        CASE WHEN h.status = 'canceled' THEN 'canceled by an operator' ELSE '' END,
        '', '[]',
        CASE WHEN h.g %% 10 = 0 THEN jsonb_build_object('customer', (h.g %% 500)::text) END,
        h.created_at, h.created_at + interval '3 ms', h.created_at + interval '80 ms',
        h.created_at + interval '80 ms'
    FROM (
        SELECT g,
            %(end)s::timestamptz - (%(total)s - g) * %(gap_ms)s * interval '1 ms'
                AS created_at,
            (ARRAY['bench_noop', 'sync_account', 'send_mail', 'resize_image'])[1 + g %% 4]
                AS task,
            (ARRAY['default', 'default', 'mail', 'io'])[1 + g %% 4] AS queue,
            CASE WHEN g %% 100 < 3 THEN 'failed' WHEN g %% 100 < 5 THEN 'canceled'
                ELSE 'completed' END AS status
        FROM generate_series(%(first)s, %(last)s) AS g
    ) AS h
    RETURNING id, status, created_at, (input ->> 'item')::bigint AS g
"""
# The steps of the runs RUNS just wrote (a CTE around it): `work` once (completed, or
# abandoned by the cancel), twice for a failed run (both failed), and a completed `notify`
# after `work` for every third completed run.
STEPS = """
    WITH r AS ({runs})
    INSERT INTO tasks_engine_stepattempt (run_id, name, kind, status, attempt, run_pass,
        counted, superseded, output, error, worker_id, started_at, finished_at)
    SELECT r.id, s.name, 'function', s.status, s.attempt, 1, true, false,
        CASE WHEN s.status = 'completed' THEN '{{"ok": true}}'::jsonb END,
        CASE WHEN s.status = 'failed'
            THEN '{{"type": "TimeoutError", "message": "upstream timed out"}}'::jsonb END,
        'worker-' || (r.g %% 8),
        r.created_at + s.at * interval '1 ms', r.created_at + (s.at + 30) * interval '1 ms'
    FROM r CROSS JOIN LATERAL (
        SELECT 'work' AS name, CASE r.status WHEN 'completed' THEN 'completed'
            WHEN 'failed' THEN 'failed' ELSE 'abandoned' END AS status, 1 AS attempt, 5 AS at
        UNION ALL SELECT 'work', 'failed', 2, 40 WHERE r.status = 'failed'
        UNION ALL SELECT 'notify', 'completed', 1, 40 WHERE r.status = 'completed' AND r.g %% 3 = 0
    ) AS s
"""
# A bulk load of gigabytes would checkpoint every 1 GB of WAL (the default max_wal_size);
# what a server that holds such a table is given. The measurement starts after a CHECKPOINT.
LOAD_SETTINGS = {"max_wal_size": "'8GB'", "checkpoint_timeout": "'30min'"}
TABLES = ("tasks_engine_workflowrun", "tasks_engine_stepattempt")


def log(msg: str) -> None:
    print(f"[history {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def partition_known() -> bool:
    from tasks_engine import conf

    return "PARTITION" in conf.KNOWN_KEYS


def engine_settings(partition: bool) -> None:
    """TASKS_ENGINE as the database about to be measured has it (a new dict: conf re-reads)."""
    from django.conf import settings

    engine = {k: v for k, v in settings.TASKS_ENGINE.items() if k != "PARTITION"}
    settings.TASKS_ENGINE = {**engine, "PARTITION": "month"} if partition else engine


def history_end(partition: bool) -> datetime:
    """Where the history ends: a minute ago; partitioned, a minute before this period began,
    with the partitions of its periods made first, so it lies in past periods, as a
    partitioned install's history does (the current period holds only what the engine wrote
    since it began; the issue's question is what history costs the hot path)."""
    end = datetime.now(UTC) - timedelta(minutes=1)
    if not partition:
        return end
    from tasks_engine.db.partitions import TABLES, bounds, periods

    unit = "month"
    end = bounds.period_start(end, unit) - timedelta(minutes=1)
    start = bounds.period_start(end - timedelta(days=DAYS), unit)
    while start <= end:
        for table in TABLES:
            periods.create_period(table, start, unit)
        start = bounds.next_start(start, unit)
    return end


def fill(total: int, chunk: int, end: datetime) -> float:
    """`total` finished runs and their steps, the last at `end`; the seconds it took."""
    import psycopg
    from django.db import connection, transaction

    gap_ms = DAYS * 86_400_000 / total
    with Timer() as t:
        for first in range(1, total + 1, chunk):
            last = min(total, first + chunk - 1)
            params: dict[str, Any] = {
                "total": total,
                "gap_ms": gap_ms,
                "first": first,
                "last": last,
                "end": end,
            }
            try:
                with transaction.atomic(), connection.cursor() as cur:
                    # The rows are consistent by construction: no per-row foreign key checks.
                    cur.execute("SET LOCAL session_replication_role = replica")
                    cur.execute(STEPS.format(runs=RUNS), params)
            except Exception as exc:
                cause = exc.__cause__ or exc
                if isinstance(cause, psycopg.errors.CheckViolation) and "partition" in str(cause):
                    msg = f"history: no partition for a run of the fill: {cause}"
                    raise SystemExit(msg) from exc
                raise
            done = last
            rate = done / (time.perf_counter() - t.start)
            log(f"{done:,}/{total:,} runs ({rate:,.0f} runs/s)")
    return t.seconds


def fill_organic(total: int, chunk: int, url: str) -> float:
    """`total` runs of bench_noop made by the engine itself: enqueue_many in chunks, each chunk
    drained by a burst worker (its claims, steps and completions, and autovacuum behind
    them, lay the pages out as production does; all created now, one step each)."""
    from tasks_engine import enqueue_many as engine_enqueue_many

    with Timer() as t:
        for first in range(0, total, chunk):
            n = min(chunk, total - first)
            for at in range(0, n, 10_000):
                engine_enqueue_many("bench_noop", [{}] * min(10_000, n - at))
            proc = worker(url, "--burst")
            if proc.wait() != 0:
                raise SystemExit(f"history: the filling worker failed: see {proc.log_path}")  # type: ignore[attr-defined]
            wait_all_finished("bench_noop", first + n, 60)
            rate = (first + n) / (time.perf_counter() - t.start)
            log(f"{first + n:,}/{total:,} runs ({rate:,.0f} runs/s)")
    return t.seconds


def settle() -> float:
    """VACUUM ANALYZE every engine table, CHECKPOINT, sync; the seconds it took."""
    import os

    from django.db import connection

    with Timer() as t, connection.cursor() as cur:
        for table in TABLES:
            cur.execute(f"VACUUM ANALYZE {table}")
        cur.execute("CHECKPOINT")
        os.sync()
    return t.seconds


def sizes() -> dict[str, dict[str, int]]:
    """Heap (with TOAST) and index bytes of the run and step tables (their partitions too)."""
    from django.db import connection

    out = {}
    with connection.cursor() as cur:
        for table in TABLES:
            cur.execute(
                "SELECT coalesce(sum(pg_table_size(r)), 0), coalesce(sum(pg_indexes_size(r)), 0)"
                " FROM (SELECT relid AS r FROM pg_partition_tree(%s::regclass)"
                " UNION SELECT %s::regclass) AS p",
                [table, table],
            )
            heap, index = cur.fetchone()
            cur.execute(f"SELECT count(*) FROM {table}")
            (rows,) = cur.fetchone()
            out[table] = {"rows": int(rows), "table_bytes": int(heap), "index_bytes": int(index)}
    return out


def wal() -> float:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
        return float(cur.fetchone()[0])


def one_round(runs: int) -> dict[str, float]:
    w0 = wal()
    with Timer() as t:
        enqueue_many("bench_noop", runs, one_transaction=False)
    w1 = wal()
    claims = claim_rate(runs, enqueue=lambda n: None)
    w2 = wal()
    return {
        "enqueue_per_s": runs / t.seconds,
        "claim_complete_per_s": claims,
        "enqueue_wal_bytes": (w1 - w0) / runs,
        "claim_complete_wal_bytes": (w2 - w1) / runs,
    }


def measure(
    history: int,
    runs: int,
    rounds: int,
    partition: bool,
    chunk: int,
    organic: bool = False,
) -> dict[str, Any]:
    import psycopg
    from django.core.management import call_command

    if partition and not partition_known():
        raise SystemExit(
            "history: --partition needs TASKS_ENGINE['PARTITION'], which this engine does not"
            " know (tasks_engine.conf.KNOWN_KEYS): run it on a tree that has partitioned history"
        )
    with database("bench_history_empty", LOAD_SETTINGS) as url:
        server, empty_db = url.rsplit("/", 1)
        loaded_db = "bench_history_loaded"
        with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{loaded_db}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{loaded_db}"')
        try:
            setup_django(url)
            if partition:  # the baseline partitioned too: the ratio is the history's cost alone
                engine_settings(True)
                call_command("migrate", verbosity=0)  # post_migrate converts the tables
            settle()
            use_database(loaded_db)
            engine_settings(partition)
            call_command("migrate", verbosity=0)
            log(f"filling {loaded_db} with {history:,} finished runs")
            if organic:
                load_s = fill_organic(history, chunk, f"{server}/{loaded_db}")
            else:
                load_s = fill(history, chunk, history_end(partition))
            settle_s = settle()
            log(f"filled in {load_s:.0f} s, vacuum + analyze + checkpoint {settle_s:.0f} s")
            table_sizes = sizes()
            log(json.dumps(table_sizes))
            got: dict[str, list[dict[str, float]]] = {"empty": [], "loaded": []}
            for k in range(rounds):
                order = [("empty", empty_db), ("loaded", loaded_db)]
                for which, name in order if k % 2 == 0 else order[::-1]:
                    use_database(name)
                    engine_settings(partition)
                    got[which].append(one_round(runs))
                    log(f"round {k + 1} {which}: {got[which][-1]}")
        finally:
            use_database(empty_db)
            with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{loaded_db}" WITH (FORCE)')
    out: dict[str, Any] = {
        "bench": "history",
        "history": history,
        "partition": "month" if partition else None,
        "fill": "engine" if organic else "sql",
        "runs": runs,
        "rounds": rounds,
        "load_s": round(load_s, 1),
        "settle_s": round(settle_s, 1),
        "sizes": table_sizes,
    }
    for key in got["empty"][0]:
        e = median([r[key] for r in got["empty"]])
        lo = median([r[key] for r in got["loaded"]])
        out[f"{key}_empty"] = round(e, 1)
        out[f"{key}_loaded"] = round(lo, 1)
        if key.endswith("_per_s"):
            out[f"{key.removesuffix('_per_s')}_ratio"] = round(lo / e, 3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--history", type=int, default=10_000_000, help="finished runs in the table")
    p.add_argument("--runs", type=int, default=2000, help="enqueues and claims a round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--chunk", type=int, default=250_000, help="runs a fill statement")
    p.add_argument("--partition", action="store_true", help='PARTITION = "month" (loaded db)')
    p.add_argument(
        "--organic",
        action="store_true",
        help="history made by the engine (enqueue_many + a burst worker; slow), not SQL",
    )
    p.add_argument("--quick", action="store_true", help="20,000 runs of history, 500 a round")
    a = p.parse_args()
    if a.quick:
        a.history, a.runs, a.rounds = 20_000, 500, 2
    if a.history < 1 or a.runs < 1 or a.rounds < 1 or a.chunk < 1:
        p.error("--history, --runs, --rounds and --chunk must be at least 1")
    row = measure(a.history, a.runs, a.rounds, a.partition, a.chunk, a.organic)
    print(json.dumps({**row, "code": engine_code()}), flush=True)


if __name__ == "__main__":
    main()
