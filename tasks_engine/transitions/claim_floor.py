"""The claim's floor on partitioned tables (TASKS_ENGINE["PARTITION"]): the smallest run id a
claim may take, so that PostgreSQL leaves out, unread, every period older than the oldest one
holding an unfinished run (claims never scan old partitions).

A run that may be claimed is unfinished (pending, running or waiting), so it lies at or above
the floor when the floor is computed. The one way an older run becomes claimable again is an
operator's retry of a finished run (retry.py): the process that retries lowers its own floor
at once; every other process sees it at its next computation, at most REFRESH_SECONDS later
(the run is claimed late by that much, never lost). A timer or a delivered fact wakes a
waiting run, which was unfinished all along.

One cheap statement computes it: an index probe per period partition (run_status_created)
and the DEFAULT partition's unfinished ids (legacy version 4 ids sort anywhere, and rows of a
period not made yet are the newest). With no unfinished run the floor is the previous
period's start, which leaves room for a clock a little behind this host's."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

from ..db import partitions
from ..db.alias import connection
from ..db.partitions import bounds, catalog
from ..db.partitions.periods import wall_now
from ..states import ACTIVE

REFRESH_SECONDS = 5.0
DAY = timedelta(days=1)
_monotonic = time.monotonic  # a test may move it
_lock = threading.Lock()
_cached: tuple[float, uuid.UUID] | None = None  # (computed at, floor)


def floor() -> uuid.UUID | None:
    """The floor now (computed at most every REFRESH_SECONDS); None when not partitioned."""
    global _cached
    period = partitions.unit()
    if period is None:
        return None
    now = _monotonic()
    with _lock:
        if _cached is not None and now - _cached[0] < REFRESH_SECONDS:
            return _cached[1]
    found = compute(period)
    with _lock:
        _cached = (now, found)
    return found


def lower(run_ids: list[uuid.UUID]) -> None:
    """Runs made claimable again in this process: its floor goes below them at once."""
    global _cached
    with _lock:
        if _cached is not None and run_ids:
            _cached = (_cached[0], min(_cached[1], *run_ids, key=lambda u: u.bytes))


def forget() -> None:
    """Compute again at the next claim (tests; a period dropped)."""
    global _cached
    with _lock:
        _cached = None


def compute(period: str) -> uuid.UUID:
    runs = partitions.RUNS.table
    active = ", ".join(f"'{s}'" for s in sorted(ACTIVE))
    probes = []
    for part in catalog.partitions(runs):
        if part.is_default:
            probes.append(
                f"(SELECT id FROM {part.name} WHERE status IN ({active}) ORDER BY id LIMIT 1)"
            )
        else:
            probes.append(
                f"(SELECT '{part.lo}'::uuid WHERE EXISTS (SELECT 1 FROM {part.name}"
                f" WHERE status IN ({active})))"
            )
    previous = bounds.period_start(bounds.period_start(wall_now(), period) - DAY, period)
    probes.append(f"'{bounds.id_bound(previous)}'::uuid")
    with connection.cursor() as cur:
        cur.execute(f"SELECT LEAST({', '.join(probes)})")
        return uuid.UUID(str(cur.fetchone()[0]))
