"""Drain through PgBouncer in transaction mode against direct, side by side in one run.

    python bench/pooler.py [--runs 2000] [--concurrency 8] [--rounds 3]

One throwaway cluster (fsync on) and a pgbouncer of its own in front of it (tests/pgbouncer.py).
Each round drains `--runs` no-op runs with one `runworker --burst` connected directly (the
defaults: prepared statements on), then the same through the pooler (Django's
DISABLE_SERVER_SIDE_CURSORS, PREPARED_STATEMENTS off, LISTEN on the direct LISTEN_URL).
Prints one JSON line: runs/s of each (median of the rounds) and pooled / direct.
"""

from __future__ import annotations

import argparse
import json
import sys

from common import median, setup_django, worker
from engine import enqueue_many, span, wait_all_finished


def drain(url: str, runs: int, concurrency: int, env: dict[str, str]) -> float:
    from tasks_engine.models import WorkflowRun

    WorkflowRun.objects.all().delete()
    enqueue_many("bench_noop", runs)
    proc = worker(url, "--concurrency", str(concurrency), "--burst", env=env)
    if proc.wait(600) != 0:
        sys.exit(f"worker failed: see {proc.log_path}")  # type: ignore[attr-defined]
    wait_all_finished("bench_noop", runs, 5)
    return runs / span("bench_noop")


def main() -> None:
    from tests.pgbouncer import Bouncer, version
    from tests.pgcluster import Cluster

    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    cluster = Cluster(fsync=True, settings={"timezone": "'UTC'"}).init()
    cluster.start()
    bouncer = None
    try:
        cluster.wait_ready()
        direct = cluster.createdb("bench")
        bouncer = Bouncer(cluster, "bench").start()
        setup_django(direct)
        pooled_env = {
            "DATABASE_URL": bouncer.url(),
            "DATABASE_TRANSACTION_POOLER": "1",
            "TASKS_LISTEN_URL": direct,
        }
        direct_rates, pooled_rates = [], []
        for _ in range(a.rounds):
            direct_rates.append(drain(direct, a.runs, a.concurrency, {}))
            pooled_rates.append(drain(bouncer.url(), a.runs, a.concurrency, pooled_env))
        d, q = median(direct_rates), median(pooled_rates)
        print(
            json.dumps(
                {
                    "bench": "pooler-drain",
                    "pgbouncer": ".".join(map(str, version())),
                    "runs": a.runs,
                    "concurrency": a.concurrency,
                    "direct_runs_per_s": round(d, 1),
                    "pgbouncer_runs_per_s": round(q, 1),
                    "ratio_pooled_over_direct": round(q / d, 2),
                    "rounds": {
                        "direct": [round(x) for x in direct_rates],
                        "pgbouncer": [round(x) for x in pooled_rates],
                    },
                }
            )
        )
    finally:
        if bouncer is not None:
            bouncer.stop()
        cluster.destroy()


if __name__ == "__main__":
    main()
