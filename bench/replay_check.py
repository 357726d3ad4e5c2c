"""How long `manage.py tasks replay-check` takes over N waiting runs (default 10,000).

    DATABASE_URL=postgres://.../some_empty_db .venv/bin/python bench/replay_check.py [N]

Migrates the database, writes N `patched_flow` runs parked on their fact wait (each with two
completed steps and an armed wait, as a worker leaves them), then times the command as a
deploy pipeline runs it: a fresh process, Django start-up included.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")


def main(n: int) -> None:
    import django

    django.setup()
    from django.core.management import call_command

    from tasks_engine import clock
    from tasks_engine.models import StepAttempt, WorkflowRun

    call_command("migrate", verbosity=0)
    WorkflowRun.objects.filter(task_name="patched_flow").delete()
    now = clock.now()
    runs, steps = [], []
    for _ in range(n):
        rid = uuid.uuid4()
        runs.append(
            WorkflowRun(
                id=rid,
                task_name="patched_flow",
                version=1,
                queue="default",
                status="waiting",
                input={},
                input_hash="",
                trace_id=rid.hex,
                attempts=1,
                waiting_on="fact:go",
                created_at=now,
                updated_at=now,
                started_at=now,
            )
        )
        for name, kind, status, output in (
            ("a", "function", "completed", {"key": "a"}),
            ("b", "function", "completed", "old"),
            ("go", "fact_wait", "running", {"fact": "go"}),
        ):
            steps.append(
                StepAttempt(
                    run_id=rid,
                    name=name,
                    kind=kind,
                    status=status,
                    attempt=1,
                    run_pass=1,
                    output=output,
                    started_at=now,
                )
            )
    WorkflowRun.objects.bulk_create(runs, batch_size=2000)
    StepAttempt.objects.bulk_create(steps, batch_size=2000)
    # "new" code takes the patched path only in runs that had not passed it: all still match.
    # Then one run in ten has its step "b" recorded as a sleep: those are reported.
    for code in ("old", "new", "changed"):
        if code == "changed":
            ids = [r.id for r in runs[::10]]
            StepAttempt.objects.filter(run_id__in=ids, name="b").update(kind="sleep")
        env = {**os.environ, "TASKS_TEST_PATCH_CODE": "old" if code == "changed" else code}
        t0 = time.perf_counter()
        done = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "tasks", "replay-check"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        elapsed = time.perf_counter() - t0
        summary = done.stdout.strip().splitlines()[-1]
        print(
            f"code {code}: exit {done.returncode}, {elapsed:.2f} s (start-up included): {summary}"
        )
    WorkflowRun.objects.filter(task_name="patched_flow").delete()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000)
