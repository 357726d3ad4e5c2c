"""Operating queues at runtime: pause, resume, override limits, list (API, CLI and admin).

A pause is a `Queue` row, not process state: it holds across restarts and reaches every
worker within one poll interval (queues/queue_state.py); on PostgreSQL a NOTIFY tells idle workers
at once, so a resume starts the queue's runs without waiting for the next poll.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count

from .. import clock
from ..conf import engine_settings, parse_rate
from ..db import notify
from ..db.alias import atomic, on_commit
from ..definitions import QUEUE_MAX_LENGTH, registry
from ..models import Queue, WorkflowRun
from ..transitions import queue_state
from ..values.serialization import check_reason
from ..values.text import check_text

# Payload prefix of the NOTIFY a queue change sends: workers read the queue table again.
CHANGED = "queue:"


def check_queue_name(name: Any) -> None:
    """A name a run's queue can have: TypeError or ValueError otherwise (nothing written)."""
    check_text("queue name", name, QUEUE_MAX_LENGTH)


def pause_queue(name: str, *, reason: str | None = None) -> bool:
    """Claim none of the queue's pending runs (nor due timers) until it is resumed. Running
    runs go on; enqueues are accepted. False if it was already paused (the reason kept)."""
    check_queue_name(name)
    check_reason(reason)
    now = clock.now()
    with atomic():
        row = _locked_row(name, now)
        if row.paused:
            return False
        row.paused, row.paused_at, row.reason, row.updated_at = True, now, reason or "", now
        row.save(update_fields=["paused", "paused_at", "reason", "updated_at"])
        _announce(name)
    return True


def resume_queue(name: str) -> bool:
    """Let workers claim the queue's runs again (idle workers are woken at once on
    PostgreSQL). False if it was not paused."""
    check_queue_name(name)
    now = clock.now()
    with atomic():
        row = Queue.objects.select_for_update().filter(name=name).first()
        if row is None or not row.paused:
            return False
        row.paused, row.paused_at, row.reason, row.updated_at = False, None, "", now
        row.save(update_fields=["paused", "paused_at", "reason", "updated_at"])
        _announce(name)
    return True


UNSET: Any = object()


def set_queue_limits(
    name: str, *, concurrency: int | None = UNSET, rate_limit: str | None = UNSET
) -> tuple[int | None, str]:
    """Override the queue's `concurrency` and/or `rate_limit` from TASKS_ENGINE["QUEUES"]
    (None: back to the setting's). Returns the overrides now stored. A bad value raises
    ValueError (TypeError for a wrong type) and nothing is written."""
    check_queue_name(name)
    if concurrency is not UNSET and concurrency is not None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int):
            raise TypeError(f"concurrency must be an integer >= 1 or None, not {concurrency!r}")
        if not 1 <= concurrency <= 2**31 - 1:
            raise ValueError(f"concurrency must be an integer >= 1, not {concurrency!r}")
    if rate_limit is not UNSET and rate_limit is not None:
        parse_rate(rate_limit, "rate_limit")
    now = clock.now()
    with atomic():
        row = _locked_row(name, now)
        if concurrency is not UNSET:
            row.concurrency = concurrency
        if rate_limit is not UNSET:
            row.rate_limit = (rate_limit or "").strip()
        row.updated_at = now
        row.save(update_fields=["concurrency", "rate_limit", "updated_at"])
        _announce(name)
    return row.concurrency, row.rate_limit


@dataclass(frozen=True)
class QueueView:
    name: str
    paused: bool
    paused_at: datetime | None
    reason: str
    concurrency: int | None  # in effect: the override, else the setting's (None: no limit)
    rate_limit: str | None  # in effect, as "N/s|m|h"
    overridden: tuple[str, ...]  # which of the two come from the queue's row
    pending: int
    running: int
    waiting: int

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["paused_at"] = self.paused_at.isoformat() if self.paused_at else None
        d["overridden"] = list(self.overridden)
        return d


def known_queues(using: str | None = None) -> set[str]:
    """Queues worth listing: named in QUEUES or by a workflow, with a row, or with active
    runs (read on the status indexes: finished runs are never scanned). `using`: the alias to
    read (the admin's, a replica), else the engine's."""
    names = set(engine_settings().queues)
    names.update(registry.get(n, v).queue for n, v in registry.pairs())
    names.update(Queue.objects.using(using).values_list("name", flat=True))
    names.update(_counts(using))
    return names


def _counts(using: str | None = None) -> dict[str, dict[str, int]]:
    active = WorkflowRun.objects.using(using).filter(status__in=("pending", "running", "waiting"))
    counts: dict[str, dict[str, int]] = {}
    for r in active.values("queue", "status").annotate(n=Count("id")).order_by():
        counts.setdefault(r["queue"], {})[r["status"]] = r["n"]
    return counts


def list_queues(using: str | None = None) -> list[QueueView]:
    """Every known queue by name, with its state, the limits in effect and its run counts.
    `using`: the alias to read (the admin's, a replica), else the engine's."""
    settings = engine_settings().queues
    rows = {r.name: r for r in Queue.objects.using(using)}
    counts = _counts(using)
    names = known_queues(using) | set(counts)
    views = []
    for name in sorted(names):
        row = rows.get(name)
        base = settings.get(name)
        concurrency = base.concurrency if base else None
        rate = _rate_text(base.rate) if base and base.rate else None
        overridden: list[str] = []
        if row is not None and row.concurrency is not None:
            concurrency = row.concurrency
            overridden.append("concurrency")
        if row is not None and row.rate_limit:
            rate = row.rate_limit
            overridden.append("rate_limit")
        c = counts.get(name, {})
        views.append(
            QueueView(
                name=name,
                paused=bool(row and row.paused),
                paused_at=row.paused_at if row else None,
                reason=row.reason if row else "",
                concurrency=concurrency,
                rate_limit=rate,
                overridden=tuple(overridden),
                pending=c.get("pending", 0),
                running=c.get("running", 0),
                waiting=c.get("waiting", 0),
            )
        )
    return views


def _rate_text(rate: tuple[int, float]) -> str:
    n, window = rate
    unit = {1.0: "s", 60.0: "m", 3600.0: "h"}.get(window)
    return f"{n}/{unit}" if unit else f"{n}/{window:g}s"


def _locked_row(name: str, now: datetime) -> Queue:
    """The queue's row, locked (created first if it has none)."""
    Queue.objects.get_or_create(name=name, defaults={"updated_at": now})
    return Queue.objects.select_for_update().get(name=name)


def _announce(name: str) -> None:
    """This process reads the table again at its next claim; on PostgreSQL, every listening
    worker too (delivered at commit), and idle ones wake to claim (a resume's runs)."""
    on_commit(queue_state.forget)
    queue_state.forget()
    notify.wake_workers(CHANGED + name)
