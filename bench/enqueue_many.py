"""enqueue_many of 1,000 runs per call against enqueue per run (each its own transaction) and
against PgQueuer's batch enqueue of the same size, on one PostgreSQL server, alternating rounds.

    DATABASE_URL=postgres://... python bench/enqueue_many.py [--rounds 5] [--runs 1000]

Prints one JSON line: runs per second of each, and the medians of the rounds' ratios. PgQueuer
(bench/peers/drive_pgqueuer.py --mode enqueue_bulk: `Queries.enqueue` of 1,000 jobs per call on
an asyncpg connection, timed inside its process) runs with bench/.venv-peers/bin/python (made by
`make bench`) on a database of its own next to ours, `<ours>_pgqueuer`, recreated each round;
without that venv, or on SQLite, its column is left out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEERS_PY = ROOT / "bench" / ".venv-peers" / "bin" / "python"
DRIVE_PGQUEUER = ROOT / "bench" / "peers" / "drive_pgqueuer.py"
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

    pgqueuer_dsn = pgqueuer_database()

    def pgqueuer() -> float:
        assert pgqueuer_dsn is not None
        cmd = [str(PEERS_PY), str(DRIVE_PGQUEUER), "--mode", "enqueue_bulk"]
        cmd += ["--jobs", str(a.runs), "--dsn", pgqueuer_dsn]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
        return float(json.loads(out.stdout.strip().splitlines()[-1])["per_s"])

    engines = [("each", each), ("many", many)]
    if pgqueuer_dsn is not None:
        engines.append(("pgqueuer", pgqueuer))
    rates: dict[str, list[float]] = {name: [] for name, _ in engines}
    for i in range(a.rounds):
        for name, fn in engines if i % 2 == 0 else engines[::-1]:
            rates[name].append(fn())
            WorkflowRun.objects.filter(task_name="bench_noop").delete()

    def ratio(top: str, bottom: str) -> float:
        pairs = zip(rates[top], rates[bottom], strict=True)
        return round(statistics.median(t / b for t, b in pairs), 2)

    result: dict[str, object] = {
        "bench": "enqueue_many",
        "runs_per_call": a.runs,
        "rounds": a.rounds,
        "enqueue_per_run_per_s": round(statistics.median(rates["each"]), 1),
        "enqueue_many_per_s": round(statistics.median(rates["many"]), 1),
        "many_over_each": ratio("many", "each"),
    }
    if pgqueuer_dsn is not None:
        result["pgqueuer_batch_per_s"] = round(statistics.median(rates["pgqueuer"]), 1)
        result["many_over_pgqueuer"] = ratio("many", "pgqueuer")
    else:
        result["pgqueuer"] = f"left out: needs PostgreSQL and {PEERS_PY.relative_to(ROOT)}"
    print(json.dumps(result))


def pgqueuer_database() -> str | None:
    """PgQueuer's database URL, next to ours on the same server; None when it cannot run."""
    from django.db import connection

    if connection.vendor != "postgresql" or not PEERS_PY.exists():
        return None
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgresql://{auth}@{s['HOST']}:{s['PORT'] or 5432}/{s['NAME']}_pgqueuer"


if __name__ == "__main__":
    main()
