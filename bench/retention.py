"""Retention with and without TASKS_ENGINE["PARTITION"] (issue 47), on a throwaway cluster of its
own (fsync on, autovacuum off so that every WAL byte and vacuum is the bench's own):

    python bench/retention.py [--runs 1000000] [--days 35] [--per-day 30000] [--quick]

1. One period of `--runs` finished runs (version 7 ids in a month three months back; 90 %
   completed, 7 % failed, 3 % canceled; 1-2 step attempts each, a fact for one in ten, an op
   ledger row for one in ten, one in twenty the child of the run before it), the same rows in
   two databases: `part` (PARTITION="month") and `plain`; beside them the current month's
   unfinished runs (pending, running, waiting) and recently finished ones, which must survive.
   VACUUM ANALYZE, CHECKPOINT, then the engine's prune_expired with RETENTION_DAYS 30 for every
   finished status: its wall time and WAL bytes (insert position before and after), then the
   VACUUM that the batched DELETE leaves to autovacuum, measured apart.
2. A simulated month (`--days` days of `--per-day` finished runs each, the rows as above, ids
   and timestamps of that day, filled by SQL) on `part` (PARTITION="week") and `plain`: after
   each day's fill, the partitions the leader would have made by then, a CHECKPOINT, the
   engine's prune_expired at the end of that day (the engine's clock faked) with RETENTION_DAYS
   7, then a plain VACUUM (what autovacuum would do). Then sizes and rows alive. A third
   database, `part_drop_only`, shows what dropping whole periods alone would cost (the engine's
   _drop_periods without the batched DELETE that follows it; runs then live up to a period
   longer): not the engine's behaviour, a what-if.

Each database is worked by a child process of this script (its own Django set-up). Prints one
JSON line and a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from common import ROOT, Timer

RUN, STEP, FACT, LEDGER = (
    f"tasks_engine_{t}" for t in ("workflowrun", "stepattempt", "fact", "opledger")
)
TABLES = (RUN, STEP, FACT, LEDGER)

# A version 7 id of millisecond `ms`, its other bits from md5(salt): the same rows in every
# database of a run of this bench.
V7_FUNCTION = """
CREATE OR REPLACE FUNCTION bench_v7(ms bigint, salt text) RETURNS uuid
LANGUAGE sql IMMUTABLE AS $$
    SELECT (lpad(to_hex(ms), 12, '0') || '7' || substr(md5(salt), 1, 3) || '8'
        || substr(md5(salt), 4, 15))::uuid
$$
"""

# The runs of one fill: `n` runs whose creation times spread evenly from `start_ms` over
# `span_ms`, finished 1-10 s after; `g` numbers them, `salt` tells fills apart.
SOURCE = """
CREATE TEMP TABLE bench_src ON COMMIT DROP AS
SELECT g, id, ms, status, parent,
    to_timestamp(ms / 1000.0) AS created,
    to_timestamp(ms / 1000.0) + (1 + mod(g, 10)) * interval '1 second' AS finished
FROM (
    SELECT g,
        bench_v7(%(start)s + g * %(span)s::bigint / %(n)s, %(salt)s || g) AS id,
        %(start)s + g * %(span)s::bigint / %(n)s AS ms,
        CASE WHEN mod(g, 100) < 90 THEN 'completed' WHEN mod(g, 100) < 97 THEN 'failed'
            ELSE 'canceled' END AS status,
        CASE WHEN mod(g, 20) = 1 THEN bench_v7(
            %(start)s + (g - 1) * %(span)s::bigint / %(n)s, %(salt)s || (g - 1)) END AS parent
    FROM generate_series(0, %(n)s - 1) AS g
) s
"""

FILL_RUNS = f"""
INSERT INTO {RUN} (id, task_name, version, queue, status, priority, input, output, error,
    idempotency_key, input_hash, trace_id, attempts, failures, worker_id, waiting_on,
    cancel_reason, parent_step, unreached_steps, created_at, started_at, finished_at,
    updated_at, parent_run_id)
SELECT id, 'bench_order', 1, 'default', status, 0,
    jsonb_build_object('order', g, 'customer', 'c-' || (mod(g, 5000)), 'items', mod(g, 7) + 1),
    CASE WHEN status = 'completed' THEN jsonb_build_object('ok', true, 'total', mod(g, 1000)) END,
    CASE WHEN status = 'failed' THEN jsonb_build_object('type', 'CardDeclined',
        'message', 'card declined by the issuer', 'traceback', repeat('  File "x.py" ', 12)) END,
    CASE WHEN mod(g, 5) = 0 THEN 'order-' || id END,
    CASE WHEN mod(g, 5) = 0 THEN md5(id::text) ELSE '' END,
    md5('trace' || id), CASE WHEN status = 'failed' THEN 3 ELSE 1 END,
    CASE WHEN status = 'failed' THEN 3 ELSE 0 END, '', '',
    CASE WHEN status = 'canceled' THEN 'canceled by an operator' ELSE '' END,
    CASE WHEN parent IS NULL THEN '' ELSE 'ship' END, '[]',
    created, created + interval '50 ms', finished, finished, parent
FROM bench_src
"""

STEP_COLUMNS = (
    "run_id, name, kind, status, attempt, run_pass, counted, superseded, output, error,"
    " worker_id, started_at, finished_at"
)
FILL_STEPS = f"""
INSERT INTO {STEP} ({STEP_COLUMNS})
SELECT id, 'charge', 'function',
    CASE status WHEN 'completed' THEN 'completed' WHEN 'failed' THEN 'failed'
        ELSE 'abandoned' END, 1, 1, true, false,
    CASE WHEN status = 'completed' THEN jsonb_build_object('charge_id', 'ch_' || g) END,
    CASE WHEN status = 'failed' THEN jsonb_build_object('type', 'CardDeclined') END,
    'worker-' || (mod(g, 8)), created + interval '60 ms', finished - interval '500 ms'
FROM bench_src
UNION ALL
SELECT id, CASE WHEN status = 'failed' THEN 'charge' ELSE 'ship' END, 'function',
    status, CASE WHEN status = 'failed' THEN 2 ELSE 1 END, 1, true, false,
    CASE WHEN status = 'completed' THEN jsonb_build_object('tracking', md5(id::text)) END,
    CASE WHEN status = 'failed' THEN jsonb_build_object('type', 'CardDeclined') END,
    'worker-' || (mod(g, 8)), finished - interval '400 ms', finished
FROM bench_src WHERE mod(g, 2) = 0 AND status <> 'canceled'
"""

FILL_FACTS = f"""
INSERT INTO {FACT} (run_id, name, payload, consumed_by, answered_status, created_at)
SELECT id, 'approval', jsonb_build_object('by', 'user-' || (mod(g, 300)), 'approved', true),
    'wait_approval', '', created + interval '200 ms'
FROM bench_src WHERE mod(g, 10) = 3
"""

FILL_LEDGER = f"""
INSERT INTO {LEDGER} (op_key, step_name, attempt_token, status, result, created_at,
    updated_at, run_id)
SELECT 'charge:' || id, 'charge', md5('token' || id)::uuid, 'done',
    jsonb_build_object('charge_id', 'ch_' || g), created + interval '70 ms',
    created + interval '300 ms', id
FROM bench_src WHERE mod(g, 10) = 7
"""

# Runs of the last hour that retention must leave: unfinished (pending, running with a running
# step, waiting on a sleep) and finished just now.
CURRENT = f"""
WITH src AS (
    SELECT g, bench_v7(%(start)s + g * 1000, 'current' || g) AS id,
        to_timestamp((%(start)s + g * 1000) / 1000.0) AS created,
        (ARRAY['pending', 'running', 'waiting', 'completed'])[mod(g, 4) + 1] AS status
    FROM generate_series(0, %(n)s - 1) AS g
), runs AS (
    INSERT INTO {RUN} (id, task_name, version, queue, status, priority, input, output,
        input_hash, trace_id, attempts, failures, worker_id, lease_token, available_at,
        waiting_on, cancel_reason, parent_step, unreached_steps, created_at, started_at,
        finished_at, updated_at)
    SELECT id, 'bench_order', 1, 'default', status, 0, jsonb_build_object('order', g),
        CASE WHEN status = 'completed' THEN '{{"ok": true}}'::jsonb END, '', md5(id::text),
        CASE WHEN status = 'pending' THEN 0 ELSE 1 END, 0,
        CASE WHEN status = 'running' THEN 'worker-1' ELSE '' END,
        CASE WHEN status = 'running' THEN md5('lease' || id)::uuid END,
        CASE status WHEN 'pending' THEN created WHEN 'running' THEN now() + interval '30 s'
            WHEN 'waiting' THEN now() + interval '3 days' END,
        CASE WHEN status = 'waiting' THEN 'sleep:cool_off' ELSE '' END, '', '', '[]', created,
        CASE WHEN status <> 'pending' THEN created END,
        CASE WHEN status = 'completed' THEN now() END, created
    FROM src RETURNING id, status, created_at
)
INSERT INTO {STEP} (run_id, name, kind, status, attempt, run_pass, counted, superseded,
    worker_id, lease_token, wake_at, started_at)
SELECT id, CASE WHEN status = 'waiting' THEN 'cool_off' ELSE 'charge' END,
    CASE WHEN status = 'waiting' THEN 'sleep' ELSE 'function' END,
    CASE WHEN status = 'completed' THEN 'completed' ELSE 'running' END, 1, 1, true, false,
    CASE WHEN status = 'running' THEN 'worker-1' ELSE '' END,
    CASE WHEN status = 'running' THEN md5('lease' || id)::uuid END,
    CASE WHEN status = 'waiting' THEN now() + interval '3 days' END, created_at
FROM runs WHERE status <> 'pending'
"""


def epoch_ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


# -- in a child process: one database ----------------------------------------------------------


def cursor() -> Any:
    from django.db import connection

    return connection.cursor()


def wal_lsn() -> int:
    with cursor() as cur:
        cur.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
        return int(cur.fetchone()[0])


def checkpoint() -> None:
    with cursor() as cur:
        cur.execute("CHECKPOINT")


def measured(work: Callable[[], Any]) -> tuple[Any, float, int]:
    """What `work` returned, its wall seconds and WAL bytes."""
    before = wal_lsn()
    with Timer() as t:
        result = work()
    return result, t.seconds, wal_lsn() - before


def vacuum(analyze: bool = False) -> None:
    with cursor() as cur:
        for table in TABLES:
            cur.execute(f"VACUUM {'ANALYZE ' if analyze else ''}{table}")


def fill(start: datetime, span: timedelta, n: int, salt: str) -> None:
    from django.db import transaction

    params = {"start": epoch_ms(start), "span": epoch_ms(start + span) - epoch_ms(start)}
    with transaction.atomic(), cursor() as cur:
        cur.execute(SOURCE, {**params, "n": n, "salt": salt})
        for sql in (FILL_RUNS, FILL_STEPS, FILL_FACTS, FILL_LEDGER):
            cur.execute(sql)


def make_periods(unit: str | None, moments: list[datetime]) -> None:
    from tasks_engine.db.partitions import TABLES as PARTITIONED
    from tasks_engine.db.partitions import bounds, periods

    if unit is None:
        return
    for moment in moments:
        for table in PARTITIONED:
            periods.create_period(table, bounds.period_start(moment, unit), unit)


def leaves(table: str) -> str:
    """The relations holding `table`'s rows: its partitions, or itself."""
    return (
        f"SELECT relid FROM pg_partition_tree('{table}') WHERE isleaf UNION ALL"
        f" SELECT '{table}'::regclass WHERE (SELECT relkind FROM pg_class"
        f" WHERE oid = '{table}'::regclass) <> 'p'"
    )


def sizes() -> dict[str, dict[str, int]]:
    out = {}
    with cursor() as cur:
        for table in TABLES:
            cur.execute(
                "SELECT coalesce(sum(pg_total_relation_size(relid)), 0),"
                f" coalesce(sum(pg_indexes_size(relid)), 0), count(*) FROM ({leaves(table)}) l"
            )
            total, indexes, parts = cur.fetchone()
            cur.execute(f"SELECT count(*) FROM {table}")
            out[table] = {
                "total_bytes": int(total),
                "index_bytes": int(indexes),
                "rows": int(cur.fetchone()[0]),
                "relations": int(parts),
            }
    return out


def counts_by_status() -> dict[str, int]:
    with cursor() as cur:
        cur.execute(f"SELECT status, count(*) FROM {RUN} GROUP BY status ORDER BY status")
        return {status: int(n) for status, n in cur.fetchall()}


def set_retention(days: float) -> None:
    from django.conf import settings

    statuses = ("completed", "failed", "canceled")
    settings.TASKS_ENGINE = {
        **settings.TASKS_ENGINE,
        "RETENTION_DAYS": dict.fromkeys(statuses, days),
    }


@contextmanager
def engine_clock(moment: datetime) -> Iterator[None]:
    from tasks_engine import clock

    real = clock.now
    clock.now = lambda: moment  # type: ignore[assignment]
    try:
        yield
    finally:
        clock.now = real  # type: ignore[assignment]


def child_one_period(a: argparse.Namespace) -> dict[str, Any]:
    from tasks_engine.db.partitions import bounds
    from tasks_engine.services.retention import prune_expired

    unit = a.partition
    now = datetime.now(UTC)
    # Three months back: past a 30-day cutoff for every status, whole.
    old = bounds.period_start(bounds.period_start(now, "month") - timedelta(days=62), "month")
    old_end = bounds.next_start(old, "month")
    make_periods(unit, [old])
    with Timer() as t_fill:
        fill(old, old_end - old, a.runs, "old")
        with cursor() as cur:
            cur.execute(CURRENT, {"start": epoch_ms(now) - a.current * 1000, "n": a.current})
    vacuum(analyze=True)
    checkpoint()
    before = sizes()
    current_ids = current_rows()
    set_retention(30)
    checkpoint()
    counts, seconds, wal = measured(prune_expired)
    left_after = sizes()
    checkpoint()
    _, vac_seconds, vac_wal = measured(vacuum)
    survivors = current_rows()
    return {
        "partition": unit,
        "period": old.date().isoformat(),
        "fill_seconds": round(t_fill.seconds, 1),
        "before": before,
        "prune": counts,
        "prune_seconds": round(seconds, 2),
        "prune_wal_bytes": wal,
        "vacuum_seconds": round(vac_seconds, 2),
        "vacuum_wal_bytes": vac_wal,
        "after": left_after,
        "after_vacuum": sizes(),
        "left_by_status": counts_by_status(),
        "current_runs_kept": survivors == current_ids,
        "current_runs": current_ids[0],
        "current_steps": current_ids[1],
    }


def current_rows() -> tuple[int, int, str]:
    """How many runs of the current period and steps of theirs there are, and a digest of them."""
    with cursor() as cur:
        cur.execute(
            f"SELECT count(DISTINCT r.id), count(s.id), md5(string_agg(r.id || r.status"
            f" || coalesce(s.name, ''), ',' ORDER BY r.id, s.name)) FROM {RUN} r"
            f" LEFT JOIN {STEP} s ON s.run_id = r.id WHERE r.created_at > now() - interval '1 day'"
        )
        runs, steps, digest = cur.fetchone()
    return int(runs), int(steps), str(digest)


def child_month(a: argparse.Namespace) -> dict[str, Any]:
    from tasks_engine.db.partitions import periods
    from tasks_engine.services import retention

    unit = a.partition
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    first = today - timedelta(days=a.days)
    set_retention(7)
    totals = {k: 0.0 for k in ("fill_s", "fill_wal", "prune_s", "prune_wal", "vac_s", "vac_wal")}
    pruned: dict[str, int] = {}
    for day in range(a.days):
        start = first + timedelta(days=day)
        end = start + timedelta(days=1)
        if unit is not None:  # what the leader's upkeep would have made by then
            make_periods(unit, periods.ahead_starts(unit, periods.AHEAD, start))
        _, s, w = measured(partial(fill, start, timedelta(days=1), a.per_day, f"d{start:%Y%j}"))
        totals["fill_s"] += s
        totals["fill_wal"] += w
        checkpoint()
        with engine_clock(end):
            counts, s, w = measured(drop_only if a.drop_only else retention.prune_expired)
        totals["prune_s"] += s
        totals["prune_wal"] += w
        for key, n in counts.items():
            pruned[key] = pruned.get(key, 0) + n
        _, s, w = measured(vacuum)
        totals["vac_s"] += s
        totals["vac_wal"] += w
        print(f"  {a.database} day {day + 1}/{a.days}: {counts}", file=sys.stderr, flush=True)
    vacuum(analyze=True)
    return {
        "partition": unit,
        "drop_only": a.drop_only,
        **{k: round(v, 2) if k.endswith("_s") else int(v) for k, v in totals.items()},
        "pruned": pruned,
        "sizes": sizes(),
    }


def drop_only() -> dict[str, int]:
    """The what-if: prune_expired's whole periods without the batched DELETE after them."""
    from tasks_engine import clock
    from tasks_engine.services import retention

    cutoff = clock.now() - timedelta(days=7)
    return retention._drop_periods([([s], cutoff) for s in ("completed", "failed", "canceled")])


def child(a: argparse.Namespace) -> None:
    if a.partition:
        os.environ["TASKS_PARTITION"] = a.partition  # tests.settings turns PARTITION on
    from common import setup_django

    setup_django(a.url)
    with cursor() as cur:
        cur.execute(V7_FUNCTION)
    result = child_one_period(a) if a.child == "period" else child_month(a)
    print("RESULT " + json.dumps(result), flush=True)


# -- the parent: a cluster, a child per database ----------------------------------------------


def run_child(
    cluster: Any, name: str, kind: str, unit: str | None, a: argparse.Namespace, *more: str
) -> dict[str, Any]:
    url = cluster.createdb(name)
    args = [
        *("--child", kind, "--current", str(a.current)),
        *("--days", str(a.days), "--per-day", str(a.per_day)),
        *(["--partition", unit] if unit else []),
        *(["--drop-only"] if name.endswith("drop_only") else []),
        *more,
    ]
    print(f"bench/retention.py: {name} ...", file=sys.stderr, flush=True)
    out = subprocess.run(
        [sys.executable, __file__, "--url", url, "--database", name, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    sys.stderr.write(out.stderr)
    if out.returncode:
        raise SystemExit(f"bench/retention.py: the child for {name} failed")
    result = next(
        json.loads(line[7:]) for line in out.stdout.splitlines() if line.startswith("RESULT ")
    )
    with cluster.connect() as conn:  # room for the next one
        conn.execute(f'DROP DATABASE "{name}"')
    return result


def mb(n: float) -> str:
    return f"{n / 1e6:,.1f}"


def ratio(a: float, b: float) -> str:
    return f"{a / b:,.2f}" if b else "-"


def table_one_period(part: dict[str, Any], plain: dict[str, Any]) -> list[str]:
    rows = [
        "| one period of runs | part (month) | plain | plain / part |",
        "|---|---:|---:|---:|",
    ]
    for label, key, fmt in (
        ("prune_expired, s", "prune_seconds", lambda v: f"{v:,.2f}"),
        ("prune_expired, WAL MB", "prune_wal_bytes", mb),
        ("then VACUUM, s", "vacuum_seconds", lambda v: f"{v:,.2f}"),
        ("then VACUUM, WAL MB", "vacuum_wal_bytes", mb),
    ):
        rows.append(
            f"| {label} | {fmt(part[key])} | {fmt(plain[key])} | {ratio(plain[key], part[key])} |"
        )
    for side in ("before", "after", "after_vacuum"):
        p = sum(t["total_bytes"] for t in part[side].values())
        q = sum(t["total_bytes"] for t in plain[side].values())
        label = f"4 tables {side.replace('_', ' ')}, MB"
        rows.append(f"| {label} | {mb(p)} | {mb(q)} | {ratio(q, p)} |")
    rows.append(
        f"| runs left (current kept) | {part['after'][RUN]['rows']:,}"
        f" ({part['current_runs_kept']}) | {plain['after'][RUN]['rows']:,}"
        f" ({plain['current_runs_kept']}) | |"
    )
    return rows


def table_month(sides: dict[str, dict[str, Any]]) -> list[str]:
    names = list(sides)
    rows = [
        "| after the month | " + " | ".join(names) + " | plain / part |",
        "|---|" + "---:|" * (len(names) + 1),
    ]

    def line(label: str, values: list[float], fmt: Callable[[float], str]) -> None:
        cells = " | ".join(fmt(v) for v in values)
        rows.append(f"| {label} | {cells} | {ratio(values[1], values[0])} |")

    for table in TABLES:
        short = table.removeprefix("tasks_engine_")
        line(
            f"{short} total MB",
            [s["sizes"][table]["total_bytes"] for s in sides.values()],
            mb,
        )
        line(
            f"{short} indexes MB",
            [s["sizes"][table]["index_bytes"] for s in sides.values()],
            mb,
        )
        line(f"{short} rows", [s["sizes"][table]["rows"] for s in sides.values()], "{:,}".format)
    line(
        "4 tables total MB",
        [sum(t["total_bytes"] for t in s["sizes"].values()) for s in sides.values()],
        mb,
    )
    line("retention, s (month)", [s["prune_s"] for s in sides.values()], "{:,.1f}".format)
    line("retention, WAL MB", [s["prune_wal"] for s in sides.values()], mb)
    line("VACUUM, s (month)", [s["vac_s"] for s in sides.values()], "{:,.1f}".format)
    line("VACUUM, WAL MB", [s["vac_wal"] for s in sides.values()], mb)
    line("fill, WAL MB", [s["fill_wal"] for s in sides.values()], mb)
    return rows


def parent(a: argparse.Namespace) -> None:
    from tests.pgcluster import Cluster

    cluster = Cluster(fsync=True, settings={"autovacuum": "off"}).init()
    cluster.start()
    started = time.time()
    try:
        period = {
            name: run_child(cluster, name, "period", unit, a, "--runs", str(a.runs))
            for name, unit in (("part", "month"), ("plain", None))
        }
        month = {
            name: run_child(cluster, name, "month", unit, a)
            for name, unit in (("part", "week"), ("plain", None), ("part_drop_only", "week"))
        }
    finally:
        cluster.destroy()
    out = {
        "bench": "retention",
        "runs": a.runs,
        "days": a.days,
        "per_day": a.per_day,
        "period": period,
        "month": month,
        "seconds": round(time.time() - started),
    }
    print(json.dumps(out))
    print("\n".join(table_one_period(period["part"], period["plain"])))
    print()
    print("\n".join(table_month(month)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=1_000_000, help="runs in the old period")
    p.add_argument("--current", type=int, default=4000, help="runs of the last hour")
    p.add_argument("--days", type=int, default=35)
    p.add_argument("--per-day", type=int, default=30_000)
    p.add_argument("--quick", action="store_true", help="small: a check of the harness")
    p.add_argument("--child", choices=("period", "month"), help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--database", help=argparse.SUPPRESS)
    p.add_argument("--partition", help=argparse.SUPPRESS)
    p.add_argument("--drop-only", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.quick:
        a.runs, a.current, a.days, a.per_day = 20_000, 400, 17, 2000
    if a.child:
        child(a)
    else:
        parent(a)


if __name__ == "__main__":
    main()
