"""Flow control's cost: the claim rate with a queue limit and concurrency keys on against off,
side by side in one run, and with 100,000 runs held back by one key; and the claim with
another queue paused (the claim then leaves the paused queues out) against none paused.

    python bench/flow.py [--runs 500] [--held 100000] [--rounds 6] [--drain-runs 5000]
    python bench/flow.py --pause-only [--runs 500] [--rounds 6]   # the paused-queue rows alone

In-process claims (bench/engine.py's loop: claim one run, complete it, repeat) on a fresh
database, `--rounds` pairs of rounds, off then on, then on then off (ABBA), so that the
machine's noise falls on both alike; then the same comparison as a user meets it: `runworker
--burst` on its defaults draining `--drain-runs` runs, keyed runs with the queue limit against
plain runs without (three pairs, ABBA; 0 leaves it out). Rates are medians; each ratio is the
median of its pairs' ratios (see `paired_ratio`). Prints one JSON line; `measure()` returns the
same row to bench/run_all.py.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from common import database, median, setup_django, worker
from engine import claim_rate, enqueue_many, span, wait_all_finished

# Limits that every claim checks but none binds: a worker keeps up to its concurrency plus its
# prefetch (16 + 128 on its defaults) in flight, below the queue's 256 and the keys' 50 x 4.
# The row measures what checking them costs, not how a binding limit slows a drain.
KEYS = 50
KEY_LIMIT = 4
KEY_NAMES = [f"k{i}" for i in range(KEYS)]
QUEUE_LIMITS = {"default": {"concurrency": 256, "rate_limit": "1000000/s"}}


def configure(limits: bool) -> None:
    from django.conf import settings

    try:
        from tasks_engine.transitions import claim_mode
    except ImportError:  # a BASELINE tree from before the engine's modules had rooms
        from tasks_engine import flow as claim_mode  # type: ignore[attr-defined,no-redef]

    settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "QUEUES": QUEUE_LIMITS if limits else {}}
    if not limits:
        claim_mode.forget_keyed()


def enqueue_keyed(n: int) -> None:
    from django.db import transaction

    from tasks_engine import enqueue
    from tasks_engine.models import WorkflowRun

    with transaction.atomic():
        for i in range(n):
            enqueue("bench_noop", concurrency_key=KEY_NAMES[i % KEYS])
        # bench_noop declares no key (its limit would be 1); set on the rows, not through
        # enqueue(concurrency_limit=), so that a baseline tree without it runs the same row.
        # Only these keys' runs: hold_back's key stays full at its limit of 1.
        WorkflowRun.objects.filter(concurrency_key__in=KEY_NAMES, status="pending").update(
            concurrency_limit=KEY_LIMIT
        )


def hold_back(held: int) -> None:
    """One run of key "hot" running, and `held` more pending behind it (ahead of every other
    key's runs in priority then FIFO order)."""
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


PAUSED_QUEUE = "bench-paused"  # no run is in it: what is measured is the check, not a pause


def pause_elsewhere(paused: bool) -> bool:
    """Pause (or resume) a queue other than the claimed runs' one; False on a tree without
    queue pause (a BASELINE from before it), which then has no such rows."""
    try:
        from tasks_engine.operations import queues
        from tasks_engine.transitions import queue_state
    except ImportError:
        return False
    if paused:
        queues.pause_queue(PAUSED_QUEUE, reason="bench/flow.py")
    else:
        queues.resume_queue(PAUSED_QUEUE)
    queue_state.forget()
    return True


def pause_row(runs: int, rounds: int) -> dict[str, Any]:
    """Claims/s with no queue paused and with one paused (ABBA, paired ratio); {} without
    queue pause."""
    configure(False)
    if not pause_elsewhere(False):
        return {}
    rates: dict[bool, list[float]] = {False: [], True: []}
    for paused in alternating(rounds):
        pause_elsewhere(paused)
        rates[paused].append(claim_rate(runs))
    pause_elsewhere(False)
    return {
        "claim_rate_no_queue_paused": round(median(rates[False]), 1),
        "claim_rate_a_queue_paused": round(median(rates[True]), 1),
        "paused_check_ratio": round(paired_ratio(rates[False], rates[True]), 3),
    }


def drain_rate(url: str, limits: bool, runs: int) -> float:
    """Runs/s of one `runworker --burst` (its defaults) draining `runs` fresh runs: keyed ones
    with the queue limit on, or plain ones with no limits."""
    from django.db import connection

    from tasks_engine.models import WorkflowRun

    WorkflowRun.objects.all().delete()
    with connection.cursor() as cur:
        cur.execute("VACUUM tasks_engine_workflowrun")
    if limits:
        enqueue_keyed(runs)
    else:
        enqueue_many("bench_noop", runs)
    proc = worker(
        url, "--burst", env={"TEST_TASKS_QUEUES": json.dumps(QUEUE_LIMITS if limits else {})}
    )
    proc.wait()
    wait_all_finished("bench_noop", runs, 5)
    return runs / span("bench_noop")


DRAIN_ROUNDS = 3


def alternating(rounds: int) -> list[bool]:
    """The settings in the order they are measured, `rounds` of each: off, on, then on, off,
    and so on (ABBA), so that a load that rises or falls through the run weighs on both."""
    pairs = [(False, True) if i % 2 == 0 else (True, False) for i in range(rounds)]
    return [limits for pair in pairs for limits in pair]


def paired_ratio(off: list[float], on: list[float]) -> float:
    """The median of each round's on ÷ off: each pair was measured back to back, so the
    machine's load, which drifts over a run on this shared machine, cancels within a pair
    (a ratio of medians mixes rounds taken minutes apart)."""
    return median([b / a for a, b in zip(off, on, strict=True)])


def measure(
    database_url: str | None = None,
    *,
    runs: int = 500,
    held: int = 100_000,
    rounds: int = 6,
    drain_runs: int = 5000,
    pause_only: bool = False,
) -> dict[str, Any]:
    """The flow row: plain and guarded claim rates side by side (`rounds` pairs of rounds of
    `runs` claims each, ABBA), then the guarded rate of other keys' runs without and
    with `held` runs held back by one full key, then worker drains with the limits on and off
    (`drain_runs` runs each, three pairs, ABBA). On `database_url` (a fresh PostgreSQL
    database; migrated here), else on a database of its own (bench/common.py)."""
    if database_url is None:
        with database("bench_flow") as url:
            return measure(
                url,
                runs=runs,
                held=held,
                rounds=rounds,
                drain_runs=drain_runs,
                pause_only=pause_only,
            )
    setup_django(database_url)
    if pause_only:
        return {"bench": "flow pause", "runs": runs, "rounds": rounds, **pause_row(runs, rounds)}
    drains: dict[bool, list[float]] = {False: [], True: []}
    for limits in alternating(DRAIN_ROUNDS if drain_runs else 0):
        drains[limits].append(drain_rate(database_url, limits, drain_runs))
    rates: dict[bool, list[float]] = {False: [], True: []}
    for limits in alternating(rounds):
        configure(limits)
        rates[limits].append(claim_rate(runs, enqueue_keyed if limits else None))
    plain, guarded = rates[False], rates[True]
    free = [claim_rate(runs, enqueue_keyed) for _ in range(2)]
    hold_back(held)
    loaded = [claim_rate(runs, enqueue_keyed) for _ in range(2)]
    row: dict[str, Any] = {
        "bench": "flow",
        "claim_rate_plain": round(median(plain), 1),
        "claim_rate_guarded": round(median(guarded), 1),
        "ratio": round(paired_ratio(plain, guarded), 3),
        "keys": KEYS,
        "key_limit": KEY_LIMIT,
        "queue_limits": "concurrency 256, rate 1000000/s",
        "runs": runs,
        "rounds": rounds,
        "held_back": held,
        "claim_rate_guarded_without_held_back": round(median(free), 1),
        "scale_held_back_100k": round(median(loaded), 1),
        "held_back_ratio": round(median(loaded) / median(free), 3),
        **pause_row(runs, rounds),
    }
    if drain_runs:
        on, off = median(drains[True]), median(drains[False])
        row |= {
            "drain_runs": drain_runs,
            "drain_rate_plain": round(off, 1),
            "drain_rate_guarded": round(on, 1),
            "drain_ratio": round(paired_ratio(drains[False], drains[True]), 3),
        }
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=500)
    p.add_argument("--held", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--drain-runs", type=int, default=5000, help="runs per worker drain (0: none)")
    p.add_argument("--database-url", help="a fresh PostgreSQL database (default: one of its own)")
    p.add_argument("--pause-only", action="store_true", help="only the paused-queue rows")
    a = p.parse_args()
    row = measure(
        a.database_url,
        runs=a.runs,
        held=a.held,
        rounds=a.rounds,
        drain_runs=a.drain_runs,
        pause_only=a.pause_only,
    )
    print(json.dumps(row))


if __name__ == "__main__":
    main()
