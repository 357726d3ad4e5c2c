"""Enqueue rate, ours against PgQueuer, in back-to-back pairs on one throwaway cluster.

    python bench/enqueue_pairs.py [--rounds 8] [--jobs 2000]

`make bench`'s enqueue row takes three repetitions of 1,000 enqueues per engine, minutes apart
between the other engines' runs; on this shared machine its range spans 0.6 to 1.2 times its
median, more than the difference it reports. Here each round enqueues `--jobs` jobs one per
transaction with ours, then with PgQueuer (the order flipped every other round: ABBA), each
into a fresh database, and the ratio is the median of the rounds' ratios: the load drifting
through a run falls on both sides of a pair alike. Prints one JSON line.

    python bench/enqueue_pairs.py --baseline-root /tmp/base [--rounds 8] [--jobs 2000]

compares ours with ours at another tree instead (a `git worktree add` of another commit,
measured with BENCH_CODE_ROOT pointing at it: see bench/common.py): "ours_over_baseline".
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
    p.add_argument("--baseline-root", help="ours at this tree instead of PgQueuer")
    a = p.parse_args()
    other = "baseline" if a.baseline_root else "pgqueuer"
    from tests.pgcluster import Cluster

    cluster = Cluster(fsync=True).init()
    cluster.start()
    try:
        server = cluster.url().rsplit("/", 1)[0]
        env = {**os.environ, "BENCH_SERVER_URL": server, "BENCH_CODE_ROOT": str(ROOT)}
        ours = [sys.executable, str(BENCH / "engine.py"), "enqueue", "--runs", str(a.jobs)]
        envs = {"ours": env, "pgqueuer": env}
        if a.baseline_root:
            envs["baseline"] = {**env, "BENCH_CODE_ROOT": str(Path(a.baseline_root).resolve())}
        commands = {
            "ours": ours,
            "baseline": ours,
            "pgqueuer": [
                *(str(PEERS_PY), str(BENCH / "peers" / "drive_pgqueuer.py")),
                *("--dsn", f"{server}/bench_pgqueuer", "--mode", "enqueue"),
                *("--jobs", str(a.jobs)),
            ],
        }
        rates: dict[str, list[float]] = {"ours": [], other: []}
        codes: dict[str, str] = {}
        for i in range(a.rounds):
            for engine in ("ours", other) if i % 2 == 0 else (other, "ours"):
                done = run(commands[engine], 600, envs[engine])
                out = last_json(done.stdout) if done.returncode == 0 else None
                if out is None:
                    raise SystemExit(f"{engine} failed:\n{done.stderr[-2000:]}")
                rates[engine].append(float(out["per_s"]))
                codes[engine] = out.get("code", "")
        ratios = [o / q for o, q in zip(rates["ours"], rates[other], strict=True)]
        print(
            json.dumps(
                {
                    "bench": "enqueue_pairs",
                    "jobs": a.jobs,
                    "rounds": a.rounds,
                    "ours_per_s": [round(x, 1) for x in rates["ours"]],
                    f"{other}_per_s": [round(x, 1) for x in rates[other]],
                    f"ours_over_{other}": round(median(ratios), 3),
                    "ours_median_per_s": round(median(rates["ours"]), 1),
                    f"{other}_median_per_s": round(median(rates[other]), 1),
                    "code": codes.get("ours", str(ROOT)),
                    **({"baseline_code": codes["baseline"]} if a.baseline_root else {}),
                }
            )
        )
    finally:
        cluster.destroy()


if __name__ == "__main__":
    main()
