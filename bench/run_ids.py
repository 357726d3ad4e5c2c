"""WAL per run of the engine's run ids: version 7 (time-ordered, clock.new_run_id) or random
(uuid4, the engine's ids before 0019), whichever the tree at $BENCH_CODE_ROOT makes, with a
table of `--finished` old runs of the same kind. Compare two trees by running this against
each, alternating (bench/common.py: BENCH_CODE_ROOT):

    python bench/run_ids.py [--finished 300000] [--runs 2000] [--rounds 2]
    BENCH_CODE_ROOT=/tmp/base python bench/run_ids.py ...

Each round: the table filled with `--finished` finished runs whose ids are of the engine's kind
(version 7 ids in creation order, ending a day ago), VACUUM, CHECKPOINT; `--runs` enqueues, one
per transaction; CHECKPOINT again (runs that waited through one, as most do); then the runs
claimed and completed one at a time in-process. The WAL insert position and pg_stat_wal's
full-page images before and after each phase give WAL bytes and full-page images per run: run
it on a cluster of its own (no $BENCH_SERVER_URL: a throwaway one). The rates are printed too,
but on a shared machine only the WAL counts are steady. Prints one JSON line (medians of the
rounds).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from common import Timer, database, engine_code, median, setup_django
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


def wal() -> tuple[float, float]:
    from django.db import connection

    with connection.cursor() as cur:  # this backend's own counts are flushed at its next commit
        cur.execute("SELECT pg_stat_force_next_flush()")
        cur.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn, wal_fpi FROM pg_stat_wal")
        row = cur.fetchone()
    return float(row[0]), float(row[1])


def checkpoint() -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("CHECKPOINT")


def id_version() -> int:
    """The version of the ids this engine gives its runs (4 or 7)."""
    from tasks_engine.models import WorkflowRun

    return int(WorkflowRun._meta.pk.get_default().version)  # type: ignore[union-attr]


def fill(version: int, finished: int) -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("TRUNCATE tasks_engine_workflowrun CASCADE")
        if version == 7:
            cur.execute(FILL.format(id=V7), [finished, finished])
        else:
            cur.execute(FILL.format(id="gen_random_uuid()"), [finished])
        cur.execute("VACUUM ANALYZE tasks_engine_workflowrun")
    checkpoint()


def one_round(version: int, finished: int, runs: int) -> dict[str, float]:
    fill(version, finished)
    w0 = wal()
    with Timer() as t:
        enqueue_many("bench_noop", runs, one_transaction=False)
    w1 = wal()
    checkpoint()
    w2 = wal()
    rate = claim_rate(runs, enqueue=lambda n: None)
    w3 = wal()
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
    p.add_argument("--database", default="bench_run_ids", help="its name on $BENCH_SERVER_URL")
    a = p.parse_args()
    with database(a.database) as url:
        setup_django(url)
        version = id_version()
        rows = [one_round(version, a.finished, a.runs) for _ in range(a.rounds)]
        out: dict[str, Any] = {
            "bench": "run_ids",
            "id_version": version,
            "finished": a.finished,
            "runs": a.runs,
        }
        for key in rows[0]:
            out[key] = round(median([r[key] for r in rows]), 2)
        print(json.dumps({**out, "code": engine_code()}))


if __name__ == "__main__":
    main()
