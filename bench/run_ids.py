"""What time-ordered run ids (tasks_engine/run_ids.py, UUID version 7) save against random ones
(uuid4, the engine's ids before): WAL and full-page images per run, with a table of
`--finished` old runs, side by side in one run.

    python bench/run_ids.py [--finished 300000] [--runs 2000] [--rounds 2]

Each round and kind of id (ABBA): the table filled with `--finished` finished runs whose ids
are of that kind (version 7 ids in creation order), VACUUM, CHECKPOINT; `--runs` enqueues, one
per transaction; CHECKPOINT again (runs that waited through one, as most do); then the runs
claimed and completed one at a time in-process. pg_stat_wal's counters before and after each
phase give WAL bytes and full-page images per run; the rates are printed too, but on a shared
machine only the WAL counts are steady. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import uuid
from typing import Any

from common import Timer, database, median, setup_django
from engine import claim_rate, enqueue_many

FILL = """
    INSERT INTO tasks_engine_workflowrun (id, task_name, version, queue, status, priority,
        input, idempotency_key, input_hash, trace_id, attempts, failures, worker_id,
        available_at, waiting_on, cancel_reason, parent_step, unreached_steps, created_at,
        updated_at, finished_at)
    SELECT {id}, 'bench_noop', 1, 'default', 'completed', 0, '{{}}', NULL, '', '', 1, 0, '',
        NULL, '', '', '', '[]', now(), now(), now()
    FROM generate_series(1, %s) AS g
"""
# Version 7 ids of runs created one a millisecond, oldest first, ending a day ago.
V7 = (
    "(lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint - 86400000 - %s + g), 12, '0')"
    " || '7' || substr(md5(random()::text), 1, 3) || '8' || substr(md5(random()::text), 1, 15)"
    ")::uuid"
)
KINDS = ("uuid4", "uuid7")


def wal() -> tuple[float, float]:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT wal_bytes, wal_fpi FROM pg_stat_wal")
        row = cur.fetchone()
    return float(row[0]), float(row[1])


def checkpoint() -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("CHECKPOINT")


def fill(kind: str, finished: int) -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("TRUNCATE tasks_engine_workflowrun CASCADE")
        if kind == "uuid4":
            cur.execute(FILL.format(id="gen_random_uuid()"), [finished])
        else:
            cur.execute(FILL.format(id=V7), [finished, finished])
        cur.execute("VACUUM ANALYZE tasks_engine_workflowrun")
    checkpoint()


def one_round(kind: str, finished: int, runs: int) -> dict[str, float]:
    import tasks_engine.transitions.claims as claims
    from tasks_engine.run_ids import new_run_id

    claims.new_run_id = uuid.uuid4 if kind == "uuid4" else new_run_id  # type: ignore[assignment]
    try:
        fill(kind, finished)
        w0 = wal()
        with Timer() as t:
            enqueue_many("bench_noop", runs, one_transaction=False)
        w1 = wal()
        checkpoint()
        w2 = wal()
        rate = claim_rate(runs, enqueue=lambda n: None)
        w3 = wal()
    finally:
        claims.new_run_id = new_run_id
    return {
        "enqueue_per_s": runs / t.seconds,
        "enqueue_wal_bytes": (w1[0] - w0[0]) / runs,
        "enqueue_fpi": (w1[1] - w0[1]) / runs,
        "claim_complete_per_s": rate,
        "claim_complete_wal_bytes": (w3[0] - w2[0]) / runs,
        "claim_complete_fpi": (w3[1] - w2[1]) / runs,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--finished", type=int, default=300_000)
    p.add_argument("--runs", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    with database("bench_run_ids") as url:
        setup_django(url)
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        rows: dict[str, list[dict[str, float]]] = {k: [] for k in KINDS}
        for i in range(a.rounds):
            for kind in KINDS if i % 2 == 0 else KINDS[::-1]:
                rows[kind].append(one_round(kind, a.finished, a.runs))
        out: dict[str, Any] = {"bench": "run_ids", "finished": a.finished, "runs": a.runs}
        for kind in KINDS:
            for key in rows[kind][0]:
                out[f"{kind}_{key}"] = round(median([r[key] for r in rows[kind]]), 2)
        print(json.dumps(out))


if __name__ == "__main__":
    main()
