"""The rate claim: runs with a rate limit key (`@workflow(rate_limit="10/m",
rate_limit_key=...)`), at most N claims per key in any window of the limit's length,
fleet-wide (docs/FLOW_CONTROL.md, "Rate limits per key").

Runs with a rate key are in none of the other claims' sources (the plain claim's index leaves
them out, and they never have a concurrency key); a guarded worker claims them here first, in
one short transaction, then fills its other places with the guarded claim:

1. The limited queues' advisory locks, waited for in name order (the guarded claim's own, so
   the two never count a queue at once); on SQLite, BEGIN IMMEDIATE.
2. The due rate-keyed runs (pending, and waiting with a due timer), best first, row-locked
   `SKIP LOCKED`.
3. Each of their keys' `RateKeyLog` row, created if missing and locked `FOR UPDATE SKIP
   LOCKED`: a key another claim holds is left to it. The row holds the times of the key's
   last N claims; locked, it is the latest committed version (PostgreSQL rechecks a row
   updated after the statement's snapshot), and no other claim of the key can change it until
   this transaction ends. So counting its times inside the window ending now, and writing the
   new ones back in the same transaction, can never admit more than N per window.
4. The limited queues' room (queue_rooms.py: concurrency and the queue's rate log),
   counted after their locks, and this worker's `worker_concurrency` room.
5. The admitted runs become running (the claims' update); the key rows and the queues' logs
   are written; one commit.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from .. import clock
from ..conf import parse_rate
from ..db.alias import atomic
from ..db.sql import (
    execute,
    fetchall,
    is_postgres,
    p_dt,
    p_uuid,
    query,
    r_dt,
    r_uuid,
    skip_locked,
)
from ..models import RateKeyLog
from . import claim_mode
from ._common import RUN, Claimed
from .claims import (
    _COLUMNS,
    ClaimRequest,
    _claim_filters,
    _claim_params,
    _pg_array,
    claim_update,
    claim_update_params,
    paused_filter,
    returning_claimed,
)
from .flow_claims_pg import QUEUE_LOCK
from .queue_rooms import log_claims, queue_room

LOG = RateKeyLog._meta.db_table
BIG = 1 << 30
LONGEST_WINDOW = 3600.0  # seconds: "N/h"


@dataclass(frozen=True)
class RatedRun:
    id: Any
    src: int  # 1 a due timer, 2 pending (the other claims' order)
    priority: int
    available_at: datetime
    queue: str
    key: str
    rate: tuple[int, float]  # (N, window seconds): the run's own limit

    @property
    def order(self) -> tuple[int, int, datetime]:
        return (self.src, -self.priority, self.available_at)


def claim_rate_keyed(req: ClaimRequest) -> list[Claimed]:
    """Up to `req.limit` due rate-keyed runs, within their keys' and queues' limits."""
    if req.limit <= 0:
        return []
    limited = claim_mode.limited_queues(req.queues)
    with atomic():
        if limited and is_postgres():
            execute(
                "SELECT count(pg_advisory_xact_lock(%s, hashtext(q))) FROM unnest(%s::text[]) q",
                [QUEUE_LOCK, _pg_array(sorted(limited))],
            )
        now = clock.now()  # after the locks: the lease and the window start now
        params = _claim_params(req, now)
        runs = _candidates(req, params)
        if not runs:
            return []
        times = _lock_keys(sorted({r.key for r in runs}))
        floor = params.get("floor")
        rooms = {q: queue_room(q, lim, now, floor) for q, lim in limited.items()}
        queues = {q: room for q, (room, _log) in rooms.items()}
        logs = {q: log for q, (_room, log) in rooms.items() if log is not None}
        workers = claim_mode.worker_room(req.worker_room, limited)
        chosen, used = _admit(runs, times, queues, workers, now, req.limit)
        if not chosen:
            return []
        claimed = _update(req, params, now, [r.id for r in chosen])
        _write_keys(times, used, now)
        log_claims([(r.queue, r.src) for r in chosen], logs)
    return claimed


def _candidates(req: ClaimRequest, params: dict[str, Any]) -> list[RatedRun]:
    """The due rate-keyed runs this worker may claim, best first, each source read on its own
    index and row-locked SKIP LOCKED; a few more than the claim's size (runs of full keys)."""
    filters = _claim_filters(req) + paused_filter()
    if "floor" in params:  # partitioned tables: the claim floor (claim_floor.py)
        filters += " " + query("claim_filter_floor")
    n = {**params, "limit": 4 * req.limit + 8}
    cols = f"id, %(src)s, priority, available_at, queue, rate_key, rate_limit FROM {RUN}"
    pending = (
        f"SELECT {cols} WHERE status = 'pending' AND rate_key IS NOT NULL"
        f" AND available_at <= %(now)s{filters} ORDER BY priority DESC, available_at"
        f" LIMIT %(limit)s{skip_locked()}"
    )
    woken = (
        f"SELECT {cols} WHERE status = 'waiting' AND available_at <= %(now)s"
        f" AND rate_key IS NOT NULL{filters} ORDER BY available_at LIMIT %(limit)s{skip_locked()}"
    )
    rows = fetchall(woken, {**n, "src": 1}) + fetchall(pending, {**n, "src": 2})
    runs = [
        RatedRun(r_uuid(i), int(src), int(pri), r_dt(at), q, key, parse_rate(rate, "rate_limit"))
        for i, src, pri, at, q, key, rate in rows
    ]
    return sorted(runs, key=lambda r: r.order)


def _lock_keys(keys: list[str]) -> dict[str, list[float]]:
    """Each key's log row, created if missing, locked: the keys it got -> their claim times
    (seconds since the epoch, oldest first). A key another claim holds is left out. The rows
    are locked first; only when some did not come back (missing, or held by another claim) is
    the insert of the missing ones sent, and those looked up again: a key's later claims cost
    one statement here, not two."""
    found = _locked_rows(keys)
    if len(found) < len(keys):
        missing = [k for k in keys if k not in found]
        if is_postgres():
            insert = (
                f"INSERT INTO {LOG} (key, times) SELECT k, '[]'::jsonb"
                " FROM unnest(%s::text[]) AS k ON CONFLICT DO NOTHING"
            )
            execute(insert, [_pg_array(missing)])
        else:
            insert = (
                f"INSERT INTO {LOG} (key, times) SELECT value, '[]' FROM json_each(%s)"
                " WHERE true ON CONFLICT DO NOTHING"
            )
            execute(insert, [json.dumps(missing)])
        found |= _locked_rows(missing)
    return found


def _locked_rows(keys: list[str]) -> dict[str, list[float]]:
    if is_postgres():
        rows = fetchall(
            f"SELECT key, times FROM {LOG} WHERE key = ANY(%s::text[])"
            " ORDER BY key FOR UPDATE SKIP LOCKED",
            [_pg_array(keys)],
        )
    else:  # one writer: nothing to lock
        rows = fetchall(
            f"SELECT key, times FROM {LOG} WHERE key IN (SELECT value FROM json_each(%s))",
            [json.dumps(keys)],
        )
    return {k: [float(t) for t in (json.loads(v) if isinstance(v, str) else v)] for k, v in rows}


def _admit(
    runs: list[RatedRun],
    times: dict[str, list[float]],
    queue_room: dict[str, int],
    worker_room: dict[str, int],
    now: datetime,
    limit: int,
) -> tuple[list[RatedRun], dict[str, tuple[int, int]]]:
    """Best first, each run while its key has had fewer than N claims in the window ending
    now (its times after now - window, and the runs admitted here) and its queue room; the
    admitted runs, and per key (runs admitted, the largest N among them)."""
    queue_room, worker_room = dict(queue_room), dict(worker_room)
    at = now.timestamp()
    used: dict[str, tuple[int, int]] = {}
    chosen: list[RatedRun] = []
    for run in runs:
        if len(chosen) == limit:
            break
        if run.key not in times:
            continue
        count, window = run.rate
        recent = sum(1 for t in times[run.key] if t > at - window)
        admitted, largest = used.get(run.key, (0, 0))
        if recent + admitted >= count:
            continue
        if queue_room.get(run.queue, BIG) <= 0 or worker_room.get(run.queue, BIG) <= 0:
            continue
        for room in (queue_room, worker_room):
            if run.queue in room:
                room[run.queue] -= 1
        used[run.key] = (admitted + 1, max(largest, count))
        chosen.append(run)
    return chosen, used


def _update(
    req: ClaimRequest, params: dict[str, Any], now: datetime, ids: list[Any]
) -> list[Claimed]:
    if is_postgres():
        args = [*claim_update_params(req, now), [str(i) for i in ids]]
        floor = ""
        if "floor" in params:  # the update's scan pruned too
            floor, args = " AND id >= %s", [*args, params["floor"]]
        sql = f"{claim_update()} WHERE id = ANY(%s::uuid[]){floor} RETURNING {_COLUMNS}"
        return returning_claimed(sql, args, req.worker_id)
    sql = query("flow_claim_update").format(columns=_COLUMNS)
    ids_json = json.dumps([p_uuid(i) for i in ids])
    return returning_claimed(sql, {**params, "ids": ids_json}, req.worker_id)


def _write_keys(
    times: dict[str, list[float]], used: dict[str, tuple[int, int]], now: datetime
) -> None:
    """Each key's row: its times with this claim's appended, the last N kept (N the largest
    limit among the runs of the key it started; all a window can need). A time never goes back
    along a key's row (a worker whose clock is behind records the latest), so the last N are
    the newest."""
    for key, (admitted, count) in used.items():
        before = times[key]
        at = max([now.timestamp(), *before[-1:]])
        kept = [*before, *[at] * admitted][-count:]
        cast = "::jsonb" if is_postgres() else ""
        execute(
            f"UPDATE {LOG} SET times = %s{cast}, last_at = %s WHERE key = %s",
            [json.dumps(kept), p_dt(datetime.fromtimestamp(at, UTC)), key],
        )


def rate_key_frees_at(key: str, rate: tuple[int, float], now: datetime) -> datetime | None:
    """When the key's rate limit next admits a run: None when it has room now; else the time
    the claim whose leaving brings its claims in the window below N leaves it (a claim counts
    while its time > now - window, as `_admit` counts). For the tester's clock."""
    count, window = rate
    found = RateKeyLog.objects.filter(key=key).values_list("times", flat=True).first()
    inside = sorted(t for t in (found or []) if t > now.timestamp() - window)
    if len(inside) < count:
        return None
    return datetime.fromtimestamp(inside[len(inside) - count] + window, UTC)


def prune_idle_keys(cutoff: datetime, batch: int, max_batches: int | None) -> int:
    """Retention (services/retention.py): delete the rows of keys whose newest claim is older
    than `cutoff` and than the longest window (an hour: "N/h"), which count nothing. A claim
    that holds a row locked has just claimed: the delete waits for it, rechecks, and leaves
    the row."""
    cutoff = min(cutoff, clock.now() - timedelta(seconds=LONGEST_WINDOW))
    gone = 0
    for _ in itertools.count() if max_batches is None else range(max_batches):
        with atomic():
            keys = list(
                RateKeyLog.objects.filter(last_at__lt=cutoff).values_list("key", flat=True)[:batch]
            )
            if keys:
                RateKeyLog.objects.filter(key__in=keys, last_at__lt=cutoff).delete()
        gone += len(keys)
        if len(keys) < batch:
            break
    return gone
