"""Issue 46's costs: the claim with per-key rate limits against per-queue rate limits, and
enqueue with a debounce key against without, side by side in one run.

    python bench/key_flow.py [--runs 500] [--rounds 6] [--database-url URL]

In-process on a fresh PostgreSQL database (bench/common.py), rounds in ABBA order so that the
machine's noise falls on both alike; rates are medians and each ratio the median of its pairs'
ratios (bench/flow.py's `paired_ratio`).

- Claims (bench/engine.py's loop: claim one run, complete it, repeat): `runs` runs spread over
  50 rate keys of `1000000/s` each (a limit every claim checks and none binds), against
  plain runs in the queue `default` with the rate limit `1000000/s` (the guarded claim).
  Goal: at least 0.8x.
- Enqueues, one statement each in autocommit: `bench_debounced` with a key per run (each
  enqueue opens a window: the insert), against `bench_noop`; and the same key every time (each
  enqueue after the first extends the window's run: the insert that finds the key taken, then
  the update). Goal: at least 0.8x.
Prints one JSON line; `measure()` returns the same row to bench/run_all.py.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from common import Timer, database, median, setup_django
from engine import claim_rate, enqueue_many
from flow import alternating, paired_ratio

KEYS = [f"r{i}" for i in range(50)]
RATE = "1000000/s"


def configure(per_key: bool) -> None:
    """Per key: no queue limit (the runs carry their keys); per queue: `default` rate-limited."""
    from django.conf import settings

    from tasks_engine.transitions import claim_mode

    queues = {} if per_key else {"default": {"rate_limit": RATE}}
    settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "QUEUES": queues}
    claim_mode.forget_keyed()


def enqueue_rated(n: int) -> None:
    """n runs of bench_noop with a rate key each (set on the rows: bench_noop declares none)."""
    from django.db import transaction

    from tasks_engine.models import WorkflowRun
    from tasks_engine.transitions import claim_mode

    enqueue_many("bench_noop", n)
    with transaction.atomic():
        pending = list(WorkflowRun.objects.filter(status="pending").values_list("pk", flat=True))
        for i, key in enumerate(KEYS):
            WorkflowRun.objects.filter(pk__in=pending[i :: len(KEYS)]).update(
                rate_key=key, rate_limit=RATE
            )
    claim_mode.note_rate_keyed()


def claim_rates(runs: int, rounds: int) -> tuple[list[float], list[float]]:
    rates: dict[bool, list[float]] = {False: [], True: []}
    for per_key in alternating(rounds):
        configure(per_key)
        rates[per_key].append(claim_rate(runs, enqueue_rated if per_key else None))
    return rates[False], rates[True]


def enqueue_rate(runs: int, task: str, same_key: bool) -> float:
    from tasks_engine import enqueue
    from tasks_engine.models import WorkflowRun

    WorkflowRun.objects.all().delete()
    with Timer() as t:
        for i in range(runs):
            enqueue(task, {"k": "one" if same_key else f"k{i}"})
    return runs / t.seconds


def measure(database_url: str | None = None, *, runs: int = 500, rounds: int = 6) -> dict[str, Any]:
    if database_url is None:
        with database("bench_key_flow") as url:
            return measure(url, runs=runs, rounds=rounds)
    setup_django(database_url)
    per_queue, per_key = claim_rates(runs, rounds)
    plain: list[float] = []
    debounced: list[float] = []
    collapsed: list[float] = []
    for with_key in alternating(rounds):
        if with_key:
            debounced.append(enqueue_rate(runs, "bench_debounced", same_key=False))
            collapsed.append(enqueue_rate(runs, "bench_debounced", same_key=True))
        else:
            plain.append(enqueue_rate(runs, "bench_noop", same_key=False))
    return {
        "bench": "key_flow",
        "runs": runs,
        "rounds": rounds,
        "claim_rate_queue_rate_limit": round(median(per_queue), 1),
        "claim_rate_key_rate_limit": round(median(per_key), 1),
        "claim_ratio": round(paired_ratio(per_queue, per_key), 3),
        "enqueue_rate_plain": round(median(plain), 1),
        "enqueue_rate_debounced": round(median(debounced), 1),
        "enqueue_ratio": round(paired_ratio(plain, debounced), 3),
        "enqueue_rate_debounced_same_key": round(median(collapsed), 1),
        "enqueue_same_key_ratio": round(paired_ratio(plain, collapsed), 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=500)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--database-url", help="a fresh PostgreSQL database (default: one of its own)")
    a = p.parse_args()
    print(json.dumps(measure(a.database_url, runs=a.runs, rounds=a.rounds)))


if __name__ == "__main__":
    main()
