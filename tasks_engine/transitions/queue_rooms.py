"""A limited queue's room in a claim that counts in Python (SQLite's guarded claim, and the
rate claim on both databases): its concurrency less its running runs, and its rate less the
claims its log holds in the window ending now; and the log rows a claim adds. The caller
holds what keeps the count true until it commits: SQLite's write lock, or the queue's
advisory lock on PostgreSQL (flow_claims_pg.QUEUE_LOCK)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..conf import QueueLimits, engine_settings
from ..db.sql import execute, fetchall, p_dt, query, r_dt
from ..models import Queue, QueueClaim

BIG = 1 << 30


# -- queues -----------------------------------------------------------------------------------


def queue_room(
    queue: str, limits: QueueLimits, now: datetime, floor: Any = None
) -> tuple[int, _Log | None]:
    """How many more of the queue's runs may start now: its concurrency less its running
    runs, and its rate less the claims logged in the window ending now (a sliding window);
    and, for a rate-limited queue, where its log stands. `floor`: the claim floor on
    partitioned tables (running runs are above it)."""
    room = BIG
    # The override as it is now, under the write lock: a lowered limit admits no run the
    # snapshot's older value would (queue_state.py).
    concurrency = Queue.objects.filter(name=queue).values_list("concurrency", flat=True).first()
    if concurrency is None:
        concurrency = engine_settings().queues.get(queue, QueueLimits()).concurrency
    if concurrency is not None:
        running = query("flow_queue_running")
        if floor is not None:
            running += " " + query("claim_filter_floor")
        (n,) = fetchall(running, {"queue": queue, "floor": floor})[0]
        room = concurrency - int(n)
    if limits.rate is None:
        return room, None
    count, window = limits.rate
    since = p_dt(now - timedelta(seconds=window))
    last = fetchall(query("flow_log_last"), {"queue": queue})
    oldest = fetchall(query("flow_log_oldest"), {"queue": queue, "since": since})
    used = int(last[0][0]) - int(oldest[0][0]) + int(oldest[0][1]) if last and oldest else 0
    execute(query("flow_log_prune"), {"queue": queue, "since": since})
    # Times never go back along a queue's log (a worker whose clock is behind records the
    # latest), so the rows in a window are always the last ones.
    at = max(now, r_dt(last[0][1])) if last else now
    return min(room, count - used), _Log(int(last[0][0]) if last else 0, at)


def rate_frees_at(queue: str, limits: QueueLimits, now: datetime) -> datetime | None:
    """When the queue's rate limit next admits a run: None when it has room now (or has no
    rate limit); else the time the log row whose leaving brings the runs counted in the
    window below the limit leaves it. A row counts while `claimed_at > now - window` (as
    `queue_room` counts: the runs from the oldest in-window row's first to the newest's
    `seq`), so it leaves at `claimed_at + window`. For the tester's clock (testing.drain)."""
    if limits.rate is None:
        return None
    count, window = limits.rate
    rows = list(
        QueueClaim.objects.filter(queue=queue, claimed_at__gt=now - timedelta(seconds=window))
        .order_by("seq")
        .values_list("seq", "claims", "claimed_at")
    )
    if not rows:
        return None
    newest = rows[-1][0]
    leaving: datetime | None = None
    for seq, claims, at in rows:  # each row in turn the window's oldest
        if newest - seq + claims < count:
            break
        leaving = at
    return None if leaving is None else leaving + timedelta(seconds=window)


@dataclass(frozen=True)
class _Log:
    seq: int  # the queue's newest log row's sequence number (0: none)
    at: datetime  # the time its next rows record


def log_claims(chosen: list[tuple[str, int]], logs: dict[str, _Log]) -> None:
    """A log row per rate-limited queue for the runs `chosen` ((queue, src)) started: from
    pending or a due timer (src > 0), not a reclaim of an expired lease."""
    for q, log in logs.items():
        n = sum(1 for queue, src in chosen if queue == q and src)
        if n:
            execute(
                query("flow_log_add"),
                {"queue": q, "seq": log.seq + n, "claims": n, "at": p_dt(log.at)},
            )
