"""What workers know of queues at runtime: which are paused, and each queue's limits
(`TASKS_ENGINE["QUEUES"]` with the operator's overrides on top).

A process keeps one snapshot of the `Queue` table (a few rows) and reads it again once it is
half a poll interval old, or at once after this process changed a queue or a NOTIFY said
another did (the worker's listener calls `forget`). So a pause reaches every worker within
one poll interval, and the claim leaves the paused queues out as a filter on the columns it
already reads: the claim's statement, and its partial indexes, stay what they were while no
queue is paused (measured in bench/flow.py, "claim with a paused queue").

Concurrency overrides are also read by the guarded claim itself, under its queue lock, from
the same table: a limit lowered while runs are running never admits one too many, even for
the half poll interval this snapshot may lag (transitions/flow_claims*.py).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ..conf import EngineSettings, QueueLimits, engine_settings, parse_rate
from ..db.outages import DB_ERRORS


@dataclass(frozen=True)
class Snapshot:
    paused: frozenset[str] = frozenset()
    # name -> (concurrency, rate): the overrides a row sets (None: the setting's).
    overrides: dict[str, tuple[int | None, tuple[int, float] | None]] = field(default_factory=dict)
    settings: EngineSettings | None = None
    read_at: float = float("-inf")  # time.monotonic()

    def limits(self) -> dict[str, QueueLimits]:
        """Every limited queue's limits: the setting's, each overridden where a row says."""
        base = dict(self.settings.queues if self.settings else {})
        for name, (concurrency, rate) in self.overrides.items():
            lim = base.get(name, QueueLimits())
            if concurrency is not None:
                lim = replace(lim, concurrency=concurrency)
            if rate is not None:
                lim = replace(lim, rate=rate)
            base[name] = lim
        return {q: lim for q, lim in base.items() if lim != QueueLimits()}


_current = Snapshot()
_lock = threading.Lock()
# A worker's own poll interval (`runworker --poll-interval`), when it runs in this process;
# else POLL_INTERVAL.
_poll_interval: list[float | None] = [None]


def use_poll_interval(seconds: float) -> None:
    """The worker in this process polls every `seconds`: the snapshot is read again once half
    of that old, so a pause reaches it within one of its poll intervals."""
    _poll_interval[0] = seconds


def current() -> Snapshot:
    """The snapshot, read again when half a poll interval old (or forgotten)."""
    settings = engine_settings()
    snap = _current
    age = time.monotonic() - snap.read_at
    poll = _poll_interval[0] if _poll_interval[0] is not None else settings.poll_interval
    if snap.settings is settings and age < poll / 2:
        return snap
    try:
        return _read(settings)
    except DB_ERRORS:
        # An outage: what was known stands (read again on the next look). The caller's own
        # statement meets the outage where its loop handles it; this read is no place to end
        # a worker (CI saw a claim loop exit while PostgreSQL restarted).
        return snap


def paused() -> frozenset[str]:
    return current().paused


def limits() -> dict[str, QueueLimits]:
    return current().limits()


def forget() -> None:
    """The next look reads the table again: this process changed a queue, or a NOTIFY said
    another process did. (What it knew stays until then: a claim on another thread meanwhile
    still leaves the paused queues out.)"""
    global _current
    _current = replace(_current, read_at=float("-inf"))


def reset() -> None:
    """Tests: forget everything (the test's rows are gone)."""
    global _current
    _current = Snapshot()


def _read(settings: EngineSettings) -> Snapshot:
    global _current
    from ..models import Queue

    with _lock:
        started = time.monotonic()
        rows = list(
            Queue.objects.filter(_interesting())
            .order_by()
            .values_list("name", "paused", "concurrency", "rate_limit")
        )
        _current = Snapshot(
            paused=frozenset(name for name, is_paused, _c, _r in rows if is_paused),
            overrides={
                name: (concurrency, _rate(rate))
                for name, _p, concurrency, rate in rows
                if concurrency is not None or rate
            },
            settings=settings,
            read_at=started,
        )
        return _current


def _interesting() -> Any:
    from django.db.models import Q

    return Q(paused=True) | Q(concurrency__isnull=False) | ~Q(rate_limit="")


def _rate(text: str) -> tuple[int, float] | None:
    """A stored rate (written through queues.control, which validated it); a row that no
    longer parses (edited by hand) is ignored rather than stopping every claim."""
    if not text:
        return None
    try:
        return parse_rate(text, "rate_limit")
    except ValueError:
        return None
