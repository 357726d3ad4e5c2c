"""Flow control's cost: the claim rate with a queue limit and concurrency keys on against off,
side by side in one run, and with 100,000 runs held back by one key.

    python bench/flow.py [--runs 1000] [--held 100000]

In-process claims (claim one run, complete it, repeat) on a fresh database, rounds alternating
between the settings so that the machine's noise falls on both alike (medians of 3). Prints
one JSON line per row.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from common import Timer, database, median, setup_django

KEYS = 50


def configure(limits: bool) -> None:
    from django.conf import settings

    from tasks_engine import flow

    queues = {"default": {"concurrency": 64, "rate_limit": "1000000/s"}} if limits else {}
    settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "QUEUES": queues}
    if not limits:
        flow.forget_keyed()


def enqueue_runs(n: int, keyed: bool) -> None:
    from django.db import transaction

    from tasks_engine import enqueue

    with transaction.atomic():
        for i in range(n):
            enqueue("bench_noop", concurrency_key=f"k{i % KEYS}" if keyed else None)


def claim_rate(n: int, keyed: bool) -> float:
    from tasks_engine import transitions

    enqueue_runs(n, keyed)
    with Timer() as t:
        done = 0
        while done < n:
            got = transitions.claim_runs("bench", [("bench_noop", 1)], None, 1, 30)
            if not got:
                break
            transitions.complete_run(got[0].lease, None, [])
            done += 1
    assert done == n, f"claimed {done} of {n}"
    return done / t.seconds


def hold_back(held: int) -> None:
    """One run of key "hot" running, and `held` more pending behind it."""
    from django.db import connection

    from tasks_engine import enqueue, transitions

    enqueue("bench_noop", concurrency_key="hot")
    assert transitions.claim_runs("holder", [("bench_noop", 1)], None, 1, 3600)
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO tasks_engine_workflowrun (id, task_name, version, queue, status,"
            " priority, input, idempotency_key, input_hash, trace_id, attempts, failures,"
            " worker_id, available_at, waiting_on, cancel_reason, parent_step,"
            " unreached_steps, concurrency_key, concurrency_limit, created_at, updated_at)"
            " SELECT gen_random_uuid(), 'bench_noop', 1, 'default', 'pending', 0, '{}',"
            " NULL, '', '', 0, 0, '', now(), '', '', '', '[]', 'hot', 1, now(), now()"
            " FROM generate_series(1, %s)",
            [held],
        )
        cur.execute("VACUUM ANALYZE tasks_engine_workflowrun")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--held", type=int, default=100_000)
    a = p.parse_args()
    with database("bench_flow") as url:
        setup_django(url)
        off: list[float] = []
        on: list[float] = []
        for _ in range(3):
            configure(False)
            off.append(claim_rate(a.runs, keyed=False))
            configure(True)
            on.append(claim_rate(a.runs, keyed=True))
        row: dict[str, Any] = {
            "bench": "flow_claims",
            "claims_per_s_off": round(median(off), 1),
            "claims_per_s_on": round(median(on), 1),
            "ratio": round(median(on) / median(off), 3),
            "keys": KEYS,
            "queue_limits": "concurrency 64, rate 1000000/s",
        }
        print(json.dumps(row), flush=True)
        # Other keys' runs, with and without `held` runs of a full key in the same queue.
        free = [claim_rate(a.runs, keyed=True) for _ in range(2)]
        hold_back(a.held)
        loaded = [claim_rate(a.runs, keyed=True) for _ in range(2)]
        row = {
            "bench": "flow_held_back",
            "held_back_by_one_key": a.held,
            "claims_per_s_without": round(median(free), 1),
            "claims_per_s_with": round(median(loaded), 1),
            "ratio": round(median(loaded) / median(free), 3),
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
