"""What TASKS_ENGINE["PARTITION"] costs the hot path: two databases on one server, the same
finished history in both (in several past months), one with plain tables and one partitioned
by month, measured alternately (medians of the rounds, so that the machine's noise falls on
both alike):

- enqueue: one `enqueue` per transaction;
- keyed enqueue: one `enqueue(..., idempotency_key=...)` per transaction (partitioned: the
  key's advisory lock and the look across partitions);
- claim + complete: claim one run, complete it, repeat (bench/engine.py's claim_rate).

    python bench/partition_cost.py [--periods 6] [--per-period 20000] [--runs 2000] [--rounds 3]

Uses a throwaway cluster (or $BENCH_SERVER_URL's server, as bench/engine.py). Prints one JSON
line: each rate on both databases, and partitioned / plain.
"""

from __future__ import annotations

import argparse
import json
import os
import uuid
from datetime import UTC, datetime
from typing import Any

os.environ["DJANGO_SETTINGS_MODULE"] = "bench_settings"

from common import Timer, database, median, setup_django
from engine import claim_rate, settle, use_database

PLAIN, PARTITIONED = "bench_plain", "bench_part"
# The partitioned database measured a second time with the engine's statements planned for
# their parameters (plan_cache_mode = force_custom_plan) instead of once (force_generic_plan,
# the engine's default): a generic plan cannot prune partitions when it is made, so on
# PostgreSQL 15 every execution locks every partition it might read.
CUSTOM_PLANS = "bench_part+custom"
_custom_plans = False


def _plan_per_execution(sender: Any, connection: Any, **kwargs: Any) -> None:
    if _custom_plans and connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SET plan_cache_mode = force_custom_plan")


def _months_back(n: int) -> list[datetime]:
    """The 10th of each of the `n` months before this one."""
    now = datetime.now(UTC)
    year, month, found = now.year, now.month, []
    for _ in range(n):
        year, month = (year - 1, 12) if month == 1 else (year, month - 1)
        found.append(datetime(year, month, 10, tzinfo=UTC))
    return found


def _history(moments: list[datetime], per_period: int) -> None:
    """Finished runs with version 7 ids of each moment's month (their id is their time)."""
    from django.db import connection

    with connection.cursor() as cur:
        for moment in moments:
            ms = int(moment.timestamp() * 1000)
            cur.execute(
                "INSERT INTO tasks_engine_workflowrun (id, task_name, version, queue, status,"
                " priority, input, idempotency_key, input_hash, trace_id, attempts, failures,"
                " worker_id, available_at, waiting_on, cancel_reason, parent_step,"
                " unreached_steps, created_at, updated_at, finished_at)"
                " SELECT (lpad(to_hex(%s::bigint + i), 12, '0') || '7' || substr(h, 1, 3) || '8'"
                " || substr(h, 4, 15))::uuid, 'bench_noop', 1, 'default', 'completed', 0, '{}',"
                " NULL, '', '', 1, 0, '', NULL, '', '', '', '[]', %s, %s, %s"
                " FROM generate_series(1, %s) AS i, LATERAL md5(random()::text || i) AS h",
                [ms, moment, moment, moment, per_period],
            )


def _enqueue_rate(n: int, keyed: bool) -> float:
    from tasks_engine import enqueue

    tag = uuid.uuid4().hex
    with Timer() as t:
        for i in range(n):
            if keyed:
                enqueue("bench_noop", idempotency_key=f"{tag}:{i}")
            else:
                enqueue("bench_noop")
    return n / t.seconds


def _switch(name: str) -> None:
    from django.conf import settings

    from tasks_engine.transitions import claim_floor

    global _custom_plans
    _custom_plans = name == CUSTOM_PLANS
    use_database(PARTITIONED if _custom_plans else name)
    partition = None if name == PLAIN else "month"
    settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "PARTITION": partition}
    claim_floor.forget()


def _drain() -> None:
    """Finish what a round left (claim_rate's runs are done; the enqueues' are pending)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "UPDATE tasks_engine_workflowrun SET status = 'completed', finished_at = now(),"
            " available_at = NULL WHERE status = 'pending'"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--periods", type=int, default=6, help="past months of history")
    parser.add_argument("--per-period", type=int, default=20000, help="finished runs a month")
    parser.add_argument("--runs", type=int, default=2000, help="operations a measurement")
    parser.add_argument("--rounds", type=int, default=3)
    a = parser.parse_args()
    with database(PLAIN) as url:
        import psycopg

        server = url.rsplit("/", 1)[0]
        with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{PARTITIONED}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{PARTITIONED}"')
        setup_django(url)
        from django.core.management import call_command
        from django.db.backends.signals import connection_created

        connection_created.connect(_plan_per_execution, weak=False)

        moments = _months_back(a.periods)
        _history(moments, a.per_period)
        settle()
        _switch(PARTITIONED)
        call_command("migrate", verbosity=0)  # converts the tables (post_migrate)
        from tasks_engine.db.partitions import RUNS, catalog, periods

        for moment in moments:
            for table in periods.TABLES:
                periods.create_period(table, moment.replace(day=1), "month")
        _history(moments, a.per_period)
        settle()
        parts = len(catalog.partitions(RUNS.table))
        rates: dict[str, dict[str, list[float]]] = {
            kind: {PLAIN: [], PARTITIONED: [], CUSTOM_PLANS: []}
            for kind in ("enqueue", "keyed", "claim")
        }
        for _ in range(a.rounds):
            for name in (PLAIN, PARTITIONED, CUSTOM_PLANS):
                _switch(name)
                rates["enqueue"][name].append(_enqueue_rate(a.runs, keyed=False))
                rates["keyed"][name].append(_enqueue_rate(a.runs, keyed=True))
                _drain()
                rates["claim"][name].append(claim_rate(a.runs))
        result: dict[str, Any] = {
            "bench": "partition_cost",
            "periods_of_history": a.periods,
            "finished_per_period": a.per_period,
            "run_partitions": parts,
            "runs": a.runs,
            "rounds": a.rounds,
        }
        for kind, by_db in rates.items():
            plain, part = median(by_db[PLAIN]), median(by_db[PARTITIONED])
            custom = median(by_db[CUSTOM_PLANS])
            result[f"{kind}_per_s_plain"] = round(plain, 1)
            result[f"{kind}_per_s_partitioned"] = round(part, 1)
            result[f"{kind}_per_s_partitioned_custom_plans"] = round(custom, 1)
            result[f"{kind}_ratio"] = round(part / plain, 3)
            result[f"{kind}_ratio_custom_plans"] = round(custom / plain, 3)
        print(json.dumps(result))


if __name__ == "__main__":
    main()
