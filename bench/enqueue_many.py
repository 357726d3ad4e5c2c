"""enqueue_many of 1,000 runs per call against enqueue per run (each its own transaction), in
one process on one database, alternating rounds.

    DATABASE_URL=postgres://... python bench/enqueue_many.py [--rounds 5] [--runs 1000]

Prints one JSON line: runs per second of each, and the median ratio of the rounds. (PgQueuer's
batch enqueue, bench/peers/drive_pgqueuer.py --mode enqueue_bulk, needs bench/.venv-peers.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--runs", type=int, default=1000)
    a = p.parse_args()
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from tasks_engine import enqueue, enqueue_many
    from tasks_engine.models import WorkflowRun

    def each() -> float:
        start = time.perf_counter()
        for _ in range(a.runs):
            enqueue("bench_noop")
        return a.runs / (time.perf_counter() - start)

    def many() -> float:
        start = time.perf_counter()
        enqueue_many("bench_noop", [{}] * a.runs)
        return a.runs / (time.perf_counter() - start)

    rates: dict[str, list[float]] = {"each": [], "many": []}
    for i in range(a.rounds):
        for name, fn in (
            (("each", each), ("many", many))
            if i % 2 == 0
            else (
                ("many", many),
                ("each", each),
            )
        ):
            rates[name].append(fn())
            WorkflowRun.objects.filter(task_name="bench_noop").delete()
    ratios = [m / e for m, e in zip(rates["many"], rates["each"], strict=True)]
    print(
        json.dumps(
            {
                "bench": "enqueue_many",
                "runs_per_call": a.runs,
                "rounds": a.rounds,
                "enqueue_per_run_per_s": round(statistics.median(rates["each"]), 1),
                "enqueue_many_per_s": round(statistics.median(rates["many"]), 1),
                "many_over_each": round(statistics.median(ratios), 2),
            }
        )
    )


if __name__ == "__main__":
    main()
