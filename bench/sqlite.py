"""SQLite, the embedded default: what the claim costs without statistics, and what
synchronous=FULL costs against NORMAL.

    python bench/sqlite.py claim [--waiting 100000]
    python bench/sqlite.py sync [--runs 500] [--rounds 3]

`claim`: one SQLite file with --waiting far-future sleepers; the median time of a claim that
finds nothing (it still walks whatever index it picked) with no statistics (a database made
before post_migrate ran ANALYZE), with the seeds alone (a fresh database filled after its
migrate), and after `sqlite_bounds.optimize()`; and what that ANALYZE took.

`sync`: a fresh SQLite file per round in a child process (settings read SQLITE_SYNCHRONOUS
there), FULL and NORMAL alternated --rounds times: enqueue --runs one-step runs (a commit
each), then drain them in-process (claim, step, completion). Medians and the ratio.

Files go to a temporary directory on the disk that holds /tmp. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import ROOT, median

RUN = "tasks_engine_workflowrun"


def setup(path: Path) -> None:
    os.environ["DATABASE_URL"] = f"sqlite:///{path}"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def fill_waiting(n: int) -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < %s) "
            f"INSERT INTO {RUN} (id, task_name, version, queue, status, priority, input,"
            " idempotency_key, input_hash, trace_id, attempts, failures, worker_id,"
            " available_at, waiting_on, cancel_reason, parent_step, unreached_steps,"
            " created_at, updated_at)"
            " SELECT lower(hex(randomblob(16))), 'bench_noop', 1, 'default', 'waiting', 0, '{}',"
            " NULL, '', '', 1, 0, '', datetime('now', '+30 days'), 'sleep:far', '', '', '[]',"
            " datetime('now'), datetime('now') FROM g",
            [n],
        )


def claim_ms(n: int = 300) -> float:
    from tasks_engine import transitions

    times = []
    for _ in range(n):
        start = time.perf_counter()
        got = transitions.claim_runs("bench", [("bench_noop", 1)], None, 1, 30.0)
        times.append((time.perf_counter() - start) * 1000)
        assert not got
    return median(times)


def reconnect() -> None:
    """A new connection loads the statistics as they are now (a worker's start)."""
    from django.db import connection

    connection.close()
    connection.ensure_connection()


def plan_uses_partial_indexes() -> bool:
    from django.db import connection

    from tasks_engine import clock
    from tasks_engine.transitions.claims import ClaimRequest, claim_sql

    sql, params = claim_sql(ClaimRequest("bench", [("bench_noop", 1)], None, 1, 30.0), clock.now())
    with connection.cursor() as cur:
        cur.execute(f"EXPLAIN QUERY PLAN {sql}", params)
        plan = " ".join(str(row[-1]) for row in cur.fetchall())
    return "run_wake_due" in plan and "run_status_created" not in plan


def cmd_claim(a: argparse.Namespace) -> dict[str, Any]:
    from django.db import connection

    try:
        from tasks_engine.db import sqlite_bounds
    except ImportError:  # a BASELINE tree from before the engine's modules had rooms
        from tasks_engine import sqlite_bounds  # type: ignore[attr-defined,no-redef]

    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        setup(Path(tmp) / "claim.sqlite3")  # post_migrate: ANALYZE, and seeds (empty table)
        fill_waiting(a.waiting)
        reconnect()
        seeded = claim_ms()
        seeded_plan = plan_uses_partial_indexes()
        with connection.cursor() as cur:
            cur.execute(f"DELETE FROM sqlite_stat1 WHERE tbl = '{RUN}'")
        reconnect()
        none = claim_ms()
        none_plan = plan_uses_partial_indexes()
        start = time.perf_counter()
        sqlite_bounds.optimize(connection)
        analyze_ms = (time.perf_counter() - start) * 1000
        reconnect()
        after = claim_ms()
        return {
            "bench": "sqlite-claim",
            "waiting": a.waiting,
            "claim_ms_no_statistics": round(none, 3),
            "partial_indexes_no_statistics": none_plan,
            "claim_ms_seeded_at_migrate": round(seeded, 3),
            "partial_indexes_seeded": seeded_plan,
            "claim_ms_after_optimize": round(after, 3),
            "partial_indexes_after_optimize": plan_uses_partial_indexes(),
            "optimize_ms": round(analyze_ms, 1),
            "sqlite": __import__("sqlite3").sqlite_version,
        }


def cmd_round(a: argparse.Namespace) -> dict[str, Any]:
    """One round in this process: SQLITE_SYNCHRONOUS is already in the environment."""
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        setup(Path(tmp) / "sync.sqlite3")
        from django.db import connection

        from tasks_engine import enqueue
        from tests.helpers import drain

        with connection.cursor() as cur:
            cur.execute("PRAGMA synchronous")
            level = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[cur.fetchone()[0]]
        start = time.perf_counter()
        for _ in range(a.runs):
            enqueue("bench_noop")  # a commit each, as a web request would
        enqueued = time.perf_counter() - start
        start = time.perf_counter()
        outcomes = drain(pairs=[("bench_noop", 1)], limit=a.runs + 1)
        drained = time.perf_counter() - start
        assert outcomes.count("completed") == a.runs, outcomes[:5]
        return {"synchronous": level, "enqueue_s": enqueued, "drain_s": drained}


def cmd_sync(a: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, list[dict[str, Any]]] = {"full": [], "normal": []}
    for _ in range(a.rounds):
        for mode in ("full", "normal"):
            out = subprocess.run(
                [sys.executable, __file__, "round", "--runs", str(a.runs)],
                env={**os.environ, "SQLITE_SYNCHRONOUS": mode},
                cwd=ROOT / "bench",
                capture_output=True,
                text=True,
                check=True,
            )
            row = json.loads(out.stdout.strip().splitlines()[-1])
            assert row["synchronous"] == mode.upper(), row
            results[mode].append(row)

    def med(mode: str, key: str) -> float:
        return median([r[key] for r in results[mode]])

    summary: dict[str, Any] = {"bench": "sqlite-sync", "runs": a.runs, "rounds": a.rounds}
    for key in ("enqueue_s", "drain_s"):
        full, normal = med("full", key), med("normal", key)
        summary[f"{key}_full"] = round(full, 3)
        summary[f"{key}_normal"] = round(normal, 3)
        summary[f"{key}_full_over_normal"] = round(full / normal, 2)
    summary["runs_per_s_full"] = round(a.runs / med("full", "drain_s"), 1)
    summary["runs_per_s_normal"] = round(a.runs / med("normal", "drain_s"), 1)
    summary["each_round"] = {
        mode: [[round(r["enqueue_s"], 3), round(r["drain_s"], 3)] for r in rows]
        for mode, rows in results.items()
    }
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("claim")
    c.add_argument("--waiting", type=int, default=100_000)
    s = sub.add_parser("sync")
    s.add_argument("--runs", type=int, default=500)
    s.add_argument("--rounds", type=int, default=3)
    r = sub.add_parser("round")
    r.add_argument("--runs", type=int, default=500)
    a = p.parse_args()
    result = {"claim": cmd_claim, "sync": cmd_sync, "round": cmd_round}[a.cmd](a)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
