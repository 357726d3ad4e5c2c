"""One event loop per worker: N async runs each awaiting S seconds of I/O, one worker at
`--concurrency N`. Reports the wall time from the first run's start to the last run's end and
the most threads the worker process had (/proc/PID/task), sampled every 20 ms.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/umt_bench \\
        python bench/async_io.py [--runs 1000] [--seconds 1.0]

The database is migrated first and its runs of `async_io` deleted. The goal (issue 44): 1,000
runs awaiting 1 s done within 3 s of the first start, at most 50 threads."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()

    import django

    django.setup()
    from django.core.management import call_command

    import tasks_engine
    from tasks_engine.models import WorkflowRun

    call_command("migrate", verbosity=0)
    WorkflowRun.objects.filter(task_name="async_io").delete()
    tasks_engine.enqueue_many("async_io", [{"seconds": args.seconds}] * args.runs)
    worker = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "manage.py"),
            "runworker",
            *("--concurrency", str(args.runs), "--task", "async_io@1"),
            *("--queue", "async-io", "--poll-interval", "0.2", "--burst"),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    most = 0
    while worker.poll() is None:
        try:
            most = max(most, len(os.listdir(f"/proc/{worker.pid}/task")))
        except FileNotFoundError:
            break
        time.sleep(0.02)
    runs = WorkflowRun.objects.filter(task_name="async_io")
    done = runs.filter(status="completed").count()
    first = min(r.started_at for r in runs if r.started_at is not None)
    last = max(r.finished_at for r in runs if r.finished_at is not None)
    print(
        f"{done}/{args.runs} async runs awaiting {args.seconds:g} s: "
        f"{(last - first).total_seconds():.2f} s wall after the first start, "
        f"at most {most} threads in the worker"
    )


if __name__ == "__main__":
    main()
