"""Enqueue rate, ours against PgQueuer, in back-to-back pairs on one throwaway cluster.

    python bench/enqueue_pairs.py [--rounds 8] [--jobs 2000]

`make bench`'s enqueue row takes three repetitions of 1,000 enqueues per engine, minutes apart
between the other engines' runs; on this shared machine its range spans 0.6 to 1.2 times its
median, more than the difference it reports. Here each round enqueues `--jobs` jobs one per
transaction with ours, then with PgQueuer (the order flipped every other round: ABBA), each
into a fresh database, and the ratio is the median of the rounds' ratios: the load drifting
through a run falls on both sides of a pair alike. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from common import ROOT, median
from run_all import PEERS_PY, last_json, run

BENCH = Path(__file__).resolve().parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--jobs", type=int, default=2000)
    a = p.parse_args()
    from tests.pgcluster import Cluster

    cluster = Cluster(fsync=True).init()
    cluster.start()
    try:
        server = cluster.url().rsplit("/", 1)[0]
        env = {**os.environ, "BENCH_SERVER_URL": server}
        commands = {
            "ours": [sys.executable, str(BENCH / "engine.py"), "enqueue", "--runs", str(a.jobs)],
            "pgqueuer": [
                *(str(PEERS_PY), str(BENCH / "peers" / "drive_pgqueuer.py")),
                *("--dsn", f"{server}/bench_pgqueuer", "--mode", "enqueue"),
                *("--jobs", str(a.jobs)),
            ],
        }
        rates: dict[str, list[float]] = {"ours": [], "pgqueuer": []}
        for i in range(a.rounds):
            for engine in ("ours", "pgqueuer") if i % 2 == 0 else ("pgqueuer", "ours"):
                done = run(commands[engine], 600, env)
                out = last_json(done.stdout) if done.returncode == 0 else None
                if out is None:
                    raise SystemExit(f"{engine} failed:\n{done.stderr[-2000:]}")
                rates[engine].append(float(out["per_s"]))
        ratios = [o / q for o, q in zip(rates["ours"], rates["pgqueuer"], strict=True)]
        print(
            json.dumps(
                {
                    "bench": "enqueue_pairs",
                    "jobs": a.jobs,
                    "rounds": a.rounds,
                    "ours_per_s": [round(x, 1) for x in rates["ours"]],
                    "pgqueuer_per_s": [round(x, 1) for x in rates["pgqueuer"]],
                    "ours_over_pgqueuer": round(median(ratios), 3),
                    "code": str(ROOT),
                }
            )
        )
    finally:
        cluster.destroy()


if __name__ == "__main__":
    main()
