"""Rows for the admin tests: runs in every status, with steps, progress, facts and ledger entries.

Built with the factories of tests/factories.py (the admin only reads them), which fill what
the table's constraints need (timestamps, a lease token for running runs).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from tasks_engine import clock
from tasks_engine.models import StepAttempt, WorkflowRun
from tests.factories import (
    FactFactory,
    OpLedgerFactory,
    StepAttemptFactory,
    WorkflowRunFactory,
)

TRACEBACK = """Traceback (most recent call last):
  File "umt/workflows/acquire.py", line 41, in copy_file
    shutil.copy2(src, dst)
  File "/usr/lib/python3.12/shutil.py", line 475, in copy2
    copyfile(src, dst, follow_symlinks=follow_symlinks)
OSError: [Errno 28] No space left on device: '/library/Movies/Heat (1995).mkv'
"""


def make_run(status: str = "pending", task: str = "noop", **fields: Any) -> WorkflowRun:
    run: WorkflowRun = WorkflowRunFactory.create(status=status, task_name=task, **fields)
    return run


def add_step(
    run: WorkflowRun,
    name: str,
    start: datetime,
    seconds: float | None,
    status: str = "completed",
    kind: str = "function",
    **fields: Any,
) -> StepAttempt:
    step: StepAttempt = StepAttemptFactory.create(
        run=run, name=name, kind=kind, status=status, started_at=start, seconds=seconds, **fields
    )
    return step


def make_many(count: int, steps_per_run: int = 0, now: datetime | None = None) -> None:
    """`count` runs spread over the statuses, each with `steps_per_run` attempts (bulk insert)."""
    now = now or clock.now()
    statuses = [
        "completed",
        "completed",
        "completed",
        "failed",
        "running",
        "waiting",
        "pending",
        "canceled",
    ]
    runs = []
    for i in range(count):
        status = statuses[i % len(statuses)]
        created = now - timedelta(seconds=30 * i + 10)
        runs.append(
            WorkflowRunFactory.build(
                now=now,
                task_name=("noop", "three_steps", "sleeper")[i % 3],
                status=status,
                input={"n": i},
                created_at=created,
                started_at=None if status == "pending" else created + timedelta(seconds=1),
                finished_at=created + timedelta(seconds=9)
                if status in ("completed", "failed", "canceled")
                else None,
                waiting_on="fact:download-done" if status == "waiting" else "",
                available_at=now + timedelta(hours=1) if status in ("waiting", "pending") else None,
                progress={"done": i % 10, "total": 10, "message": "copying"}
                if status == "running"
                else None,
                attempts=1,
            )
        )
    WorkflowRun.objects.bulk_create(runs)
    steps = [
        StepAttemptFactory.build(
            run=run, name=f"step-{j}", started_at=run.created_at + timedelta(seconds=j), seconds=1
        )
        for run in runs
        for j in range(steps_per_run)
    ]
    StepAttempt.objects.bulk_create(steps, batch_size=500)


def make_showcase(now: datetime | None = None) -> dict[str, WorkflowRun]:
    """A realistic set for the screenshots and browser test: an acquisition in flight with a
    progress bar, runs waiting on a fact and a sleep, a failure with a traceback, and more."""
    now = now or clock.now()
    t0 = now - timedelta(minutes=14)
    acquire = make_run(
        "running",
        "acquire",
        now=now,
        created_at=t0,
        started_at=t0 + timedelta(seconds=1),
        queue="io",
        priority=5,
        attempts=2,
        idempotency_key="plan:4711",
        input={"plan_id": 4711, "title": "Heat (1995)", "quality": "2160p"},
        progress={"done": 31.4, "total": 50.2, "message": "copying Heat (1995).mkv"},
    )
    add_step(
        acquire,
        "submit-download",
        t0 + timedelta(seconds=2),
        1.4,
        output={"hash": "a94f3c", "path": "/downloads/Heat.1995.2160p.mkv"},
    )
    add_step(
        acquire,
        "download-done",
        t0 + timedelta(seconds=4),
        400,
        kind="fact_wait",
        output={"bytes": 53_902_112_768},
    )
    add_step(
        acquire,
        "copy-file",
        t0 + timedelta(seconds=405),
        30,
        status="abandoned",
        worker_id="worker-9f1e@host",
    )
    add_step(
        acquire,
        "copy-file",
        t0 + timedelta(seconds=470),
        12,
        status="failed",
        attempt=2,
        error={
            "type": "OSError",
            "message": "[Errno 28] No space left on device",
            "traceback": TRACEBACK,
        },
    )
    add_step(acquire, "copy-file", t0 + timedelta(seconds=540), None, status="running", attempt=3)
    FactFactory(
        run=acquire,
        name="download-done",
        payload={"bytes": 53_902_112_768},
        consumed_by="download-done",
        created_at=t0 + timedelta(seconds=404),
    )
    OpLedgerFactory(
        op_key="qbt:add:plan-4711",
        run=acquire,
        step_name="submit-download",
        status="done",
        result={"hash": "a94f3c"},
        created_at=t0 + timedelta(seconds=2),
        updated_at=t0 + timedelta(seconds=3),
    )
    child = make_run(
        "completed",
        "probe_media",
        now=now,
        parent_run=acquire,
        parent_step="probe",
        created_at=t0 + timedelta(seconds=3),
        output={"codec": "hevc", "hdr": True},
    )
    waiting = make_run(
        "waiting",
        "acquire",
        now=now,
        created_at=now - timedelta(minutes=9),
        waiting_on="fact:download-done",
        available_at=now + timedelta(days=7),
        input={"plan_id": 4712},
        queue="io",
        idempotency_key="plan:4712",
        progress={"done": 1, "total": 5, "message": "waiting for qBittorrent"},
    )
    add_step(waiting, "submit-download", waiting.created_at + timedelta(seconds=1), 2)
    add_step(
        waiting,
        "download-done",
        waiting.created_at + timedelta(seconds=3),
        None,
        status="running",
        kind="fact_wait",
    )
    sleeping = make_run(
        "waiting",
        "acquire",
        now=now,
        created_at=now - timedelta(hours=2),
        waiting_on="sleep:retention",
        available_at=now + timedelta(days=6),
        input={"plan_id": 4690},
        queue="io",
    )
    failed = make_run(
        "failed",
        "acquire",
        now=now,
        created_at=now - timedelta(minutes=31),
        queue="io",
        error={
            "type": "OSError",
            "message": "[Errno 28] No space left on device",
            "traceback": TRACEBACK,
        },
        input={"plan_id": 4702},
    )
    add_step(failed, "submit-download", failed.created_at + timedelta(seconds=1), 2)
    add_step(
        failed,
        "copy-file",
        failed.created_at + timedelta(seconds=4),
        3,
        status="failed",
        error={
            "type": "OSError",
            "message": "[Errno 28] No space left on device",
            "traceback": TRACEBACK,
        },
    )
    done = make_run(
        "completed", "noop", now=now, created_at=now - timedelta(minutes=3), output={"n": 1}
    )
    add_step(done, "only", done.created_at + timedelta(seconds=2), 0.2)
    pending = make_run("pending", "noop", now=now, created_at=now - timedelta(seconds=20))
    canceled = make_run(
        "canceled",
        "sleeper",
        now=now,
        created_at=now - timedelta(minutes=50),
        cancel_requested_at=now - timedelta(minutes=49),
        cancel_reason="duplicate request",
    )
    # Recent finishes for the per-minute chart.
    for i in range(40):
        status = "failed" if i % 9 == 0 else "completed"
        finished = now - timedelta(minutes=1 + (i * 7) % 57, seconds=i)
        task = ("thumbnail", "probe_media", "sync_library", "noop")[i % 4]
        took = timedelta(seconds=3 + (i * 13) % 170)
        make_run(
            status,
            task,
            now=now,
            created_at=finished - took,
            finished_at=finished,
            started_at=finished - took + timedelta(milliseconds=300),
        )
    return {
        "acquire": acquire,
        "child": child,
        "waiting": waiting,
        "sleeping": sleeping,
        "failed": failed,
        "done": done,
        "pending": pending,
        "canceled": canceled,
    }
