"""Soak: N runs, W workers, a random worker SIGKILLed (and restarted) every K seconds.

    DATABASE_URL=postgres://... python bench/soak.py --runs 5000 --workers 2 --kill-every 2 \
        --duration 60

Uses the `soak` workflow of the test app (a plain step, a fenced external effect committed
through ctx.with_attempt_token, an atomic database step). Prints the counts as JSON and exits 1
if any invariant fails: every run completed, every business effect committed exactly once, no
attempt left running. Give it a fresh database (it migrates it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=500)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--kill-every", type=float, default=2.0)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of killing")
    p.add_argument("--lease-seconds", type=float, default=2.0)
    p.add_argument("--step-ms", type=int, default=50)
    p.add_argument("--timeout", type=float, default=600.0, help="give up draining after this")
    p.add_argument("--log-dir", default=None)
    args = p.parse_args()

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction

    from tasks_engine import enqueue
    from tasks_engine.models import OpLedger, StepAttempt, WorkflowRun
    from tests.testapp.models import Marker, SideEffect

    call_command("migrate", verbosity=0)
    with transaction.atomic():
        for _ in range(args.runs):
            enqueue("soak", {"step_ms": args.step_ms})
    connection.close()

    log_dir = Path(args.log_dir or ROOT / "bench" / "out")
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable,
        str(ROOT / "manage.py"),
        "runworker",
        "--concurrency",
        str(args.concurrency),
        "--lease-seconds",
        str(args.lease_seconds),
        "--poll-interval",
        "0.2",
    ]
    spawned = 0

    def spawn() -> subprocess.Popen[bytes]:
        nonlocal spawned
        spawned += 1
        log = open(log_dir / f"soak-worker-{spawned}.log", "wb")  # noqa: SIM115
        return subprocess.Popen(
            cmd,
            env={**env, "WORKER_TAG": f"w{spawned}"},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def remaining() -> int:
        n = (
            WorkflowRun.objects.filter(task_name="soak")
            .exclude(status__in=["completed", "failed", "canceled"])
            .count()
        )
        connection.close()
        return n

    started = time.monotonic()
    procs = [spawn() for _ in range(args.workers)]
    kills = 0
    while time.monotonic() - started < args.duration and remaining() > 0:
        time.sleep(args.kill_every)
        victim = random.randrange(len(procs))
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait()
        kills += 1
        procs[victim] = spawn()
    while remaining() > 0 and time.monotonic() - started < args.timeout:
        time.sleep(0.2)
    elapsed = time.monotonic() - started
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()

    runs = WorkflowRun.objects.filter(task_name="soak")
    ids = set(runs.values_list("pk", flat=True))
    fenced = Marker.objects.filter(key__startswith="soak:").count()
    atomic = Marker.objects.filter(key__startswith="soak-atomic:").count()
    counts = {
        "runs": len(ids),
        "completed": runs.filter(status="completed").count(),
        "not_completed": runs.exclude(status="completed").count(),
        "kills": kills,
        "workers_started": spawned,
        "seconds": round(elapsed, 1),
        "fenced_commits": fenced,
        "atomic_commits": atomic,
        "ops_done": OpLedger.objects.filter(status="done", op_key__startswith="soak:").count(),
        "fenced_resumed": Marker.objects.filter(key__startswith="soak:", value="True").count(),
        "prepare_executions": SideEffect.objects.filter(key="soak-prepare").count(),
        "attempts_running": StepAttempt.objects.filter(run_id__in=ids, status="running").count(),
        "attempts_abandoned": StepAttempt.objects.filter(
            run_id__in=ids, status="abandoned"
        ).count(),
        "claims": sum(runs.values_list("attempts", flat=True)),
    }
    ok = (
        counts["completed"] == args.runs
        and fenced == args.runs
        and atomic == args.runs
        and counts["attempts_running"] == 0
    )
    counts["ok"] = ok
    print(json.dumps(counts))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
