"""What the admin's run page shows: header, progress, timeline, facts, ledger, family.

Pure presentation: reads rows (a fixed number of queries, whatever the run's size) and turns
them into plain values for `tasks_engine/templates/admin/tasks_engine/workflowrun/change_form.html`.
Data a workflow stored (input, output, progress, errors, fact payloads, op results) is shown
with its secrets masked (`shown_json`, `values/secrets.py`): view-only staff see these pages.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .. import clock
from ..db.alias import admin_read_alias
from ..models import Fact, OpLedger, StepAttempt, WorkflowRun
from ..observe import tracing
from ..states import ACTIVE
from ..values.secrets import mask_secrets

# Rows shown per section; the engine caps step attempts per run at MAX_STEP_ATTEMPTS_PER_RUN.
MAX_STEPS = 1000
MAX_FACTS = 200
MAX_OPS = 200
MAX_CHILDREN = 100
REFRESH_SECONDS = 5


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def shown_json(value: Any) -> str:
    """Stored data as the admin shows it: secrets masked, pretty-printed."""
    return pretty_json(mask_secrets(value))


def humanize_seconds(seconds: float | None) -> str:
    """0.042 -> 42 ms, 75 -> 1 m 15 s, 90000 -> 1 d 1 h."""
    if seconds is None:
        return ""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    units = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
    parts = []
    rest = int(seconds)
    for name, size in units:
        if rest >= size:
            parts.append(f"{rest // size} {name}")
            rest %= size
        if len(parts) == 2:
            break
    return " ".join(parts)


def elapsed(start: datetime | None, end: datetime | None, now: datetime) -> float | None:
    if start is None:
        return None
    return max(((end or now) - start).total_seconds(), 0.0)


def progress_view(progress: Any) -> dict[str, Any] | None:
    """{"done", "total", "message"} -> percent (None when the total is unknown) and labels."""
    if not isinstance(progress, dict):
        return None
    done, total = progress.get("done"), progress.get("total")
    percent = None
    if isinstance(done, int | float) and isinstance(total, int | float) and total > 0:
        percent = max(0.0, min(100.0, done / total * 100))
    return {
        "done": done,
        "total": total,
        "message": mask_secrets(progress.get("message")) or "",  # rows stored before redaction
        "percent": None if percent is None else round(percent, 1),
    }


def retries_view(retries: Any) -> list[dict[str, Any]]:
    """The run's operator retries, oldest first, each with `at` as a datetime (stored as an ISO
    8601 string), so that the page formats it as it formats its other times; `at_iso` keeps
    the stored string (shown as is should it not parse)."""
    rows = []
    for entry in retries or []:
        if not isinstance(entry, dict):
            continue
        stored = entry.get("at")
        try:
            at: Any = datetime.fromisoformat(stored) if isinstance(stored, str) else None
        except ValueError:
            at = None
        rows.append({**entry, "at": at, "at_iso": stored or ""})
    return rows


@dataclass(frozen=True)
class PassTiming:
    """How long the run has taken, counted plainly.

    A run that an operator retried is counted from its latest retry (`retried_at`), not from
    its first start: the time it sat failed or canceled before the retry is not its duration.
    Until a worker claims the retried run (`retry_run` clears its worker) it has no duration.
    """

    duration: str  # humanized, "" when there is none
    retried_at: datetime | None = None
    unclaimed: bool = False  # retried, and no worker has claimed it since


def pass_timing(run: WorkflowRun, now: datetime) -> PassTiming:
    retries = retries_view(run.retries)
    retried_at = retries[-1]["at"] if retries else None
    if retried_at is None:
        return PassTiming(humanize_seconds(elapsed(run.started_at, run.finished_at, now)))
    if not run.worker_id:
        return PassTiming("", retried_at, unclaimed=True)
    return PassTiming(humanize_seconds(elapsed(retried_at, run.finished_at, now)), retried_at)


@dataclass(frozen=True)
class TimelineRow:
    step: StepAttempt
    duration: str
    offset: float  # percent of the run's span before the attempt started
    width: float  # percent of the span the attempt took
    open: bool  # still running


def timeline(run: WorkflowRun, steps: list[StepAttempt], now: datetime) -> list[TimelineRow]:
    """Each attempt as a bar on the run's time axis (first start to last end, or now)."""
    if not steps:
        return []
    starts = [s.started_at for s in steps] + ([run.started_at] if run.started_at else [])
    origin = min(starts)
    ends = [s.finished_at or now for s in steps]
    end = max([*ends, run.finished_at or (now if run.status in ACTIVE else origin)])
    span = max((end - origin).total_seconds(), 0.001)
    rows = []
    for s in steps:
        finish = s.finished_at or (now if run.status in ACTIVE else s.started_at)
        offset = (s.started_at - origin).total_seconds() / span * 100
        width = max((finish - s.started_at).total_seconds() / span * 100, 0.4)
        rows.append(
            TimelineRow(
                step=s,
                duration=humanize_seconds(elapsed(s.started_at, finish, now)),
                offset=round(min(offset, 99.6), 2),
                width=round(min(width, 100 - min(offset, 99.6)), 2),
                open=s.finished_at is None,
            )
        )
    return rows


def run_page(run: WorkflowRun) -> dict[str, Any]:
    """Context for the run page. Five queries: steps, facts, ops, children (+ the run itself)."""
    now = clock.now()
    db = admin_read_alias()
    steps = list(StepAttempt.objects.using(db).filter(run_id=run.pk).order_by("id")[:MAX_STEPS])
    facts = list(Fact.objects.using(db).filter(run_id=run.pk).order_by("id")[: MAX_FACTS + 1])
    ops = list(
        OpLedger.objects.using(db).filter(run_id=run.pk).order_by("created_at", "id")[: MAX_OPS + 1]
    )
    children = list(
        WorkflowRun.objects.using(db)
        .filter(parent_run_id=run.pk)
        .only("id", "task_name", "version", "status", "parent_step", "created_at", "finished_at")
        .order_by("created_at")[: MAX_CHILDREN + 1]
    )
    error = run.error if isinstance(run.error, dict) or not run.error else {"message": run.error}
    error = mask_secrets(error)  # stored redacted; rows written before that may not be
    active = run.status in ACTIVE
    timing = pass_timing(run, now)
    return {
        "run": run,
        "trace_id": tracing.run_trace_id(run.trace_id, run.pk),
        "active": active,
        "refresh_seconds": REFRESH_SECONDS if active else None,
        "duration": timing.duration,
        "timing": timing,
        "queued_for": humanize_seconds(elapsed(run.created_at, run.started_at, now)),
        "progress": progress_view(run.progress),
        "input_json": shown_json(run.input),
        "output_json": None if run.output is None else shown_json(run.output),
        "error": error,
        "timeline": timeline(run, steps, now),
        "steps_truncated": len(steps) >= MAX_STEPS,
        "facts": [(f, shown_json(f.payload)) for f in facts[:MAX_FACTS]],
        "facts_truncated": len(facts) > MAX_FACTS,
        "ops": [(o, shown_json(o.result)) for o in ops[:MAX_OPS]],
        "ops_truncated": len(ops) > MAX_OPS,
        "children": children[:MAX_CHILDREN],
        "children_truncated": len(children) > MAX_CHILDREN,
        "retries": retries_view(run.retries),
        "wait": wait_description(run),
        "now": now,
    }


def wait_description(run: WorkflowRun) -> dict[str, Any] | None:
    """What a waiting run waits on ("fact", "download-done"), and until when; or a pending
    run's future due time (retry backoff, deferred start)."""
    if run.status == "waiting":
        kind, _, name = run.waiting_on.partition(":")
        return {"kind": kind or "wait", "name": name or run.waiting_on, "until": run.available_at}
    if run.status == "pending" and run.available_at and run.available_at > clock.now():
        return {"kind": "due", "name": "", "until": run.available_at}
    return None
