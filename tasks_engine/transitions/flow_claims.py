"""The guarded claim: flow control enforced by the claim itself (docs/FLOW_CONTROL.md).

On PostgreSQL: two statements in one round trip (flow_claims_pg.py). On SQLite, here: the
same steps as separate statements in one BEGIN IMMEDIATE transaction; there is one writer,
so nothing changes under the counts. Nothing is counted in a counter of its own: running runs
and the claim log are the truth, so a crash leaves nothing to drift.

The only ways into `running` are claims (pending or a due timer), and a reclaim of an expired
lease keeps a run `running`: so counting `running` rows where no other claim can admit one
(under the write lock here, under the queue's and key's advisory locks on PostgreSQL) cannot
admit too many.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from .. import clock, flow
from ..conf import QueueLimits
from ..models import QueueClaim
from ..sql import (
    execute,
    fetchall,
    is_postgres,
    p_dt,
    p_uuid,
    placeholders,
    r_dt,
    r_uuid,
)
from ._common import RUN, Claimed
from .claims import (
    CLAIM_COLUMNS,
    ClaimRequest,
    _filters,
    _ids_json,
    claim_update,
    claim_update_params,
    returning_claimed,
)
from .flow_claims_pg import claim_guarded_pg

CLAIMS = QueueClaim._meta.db_table
COLUMNS = "id, {src}, priority, available_at, queue, concurrency_key, concurrency_limit"


@dataclass(frozen=True)
class Candidate:
    id: Any
    src: int  # 0 expired lease, 1 due timer, 2 pending: the plain claim's order
    priority: int
    available_at: datetime
    queue: str
    key: str | None
    limit: int | None

    @property
    def order(self) -> tuple[int, int, datetime]:
        return (self.src, -self.priority, self.available_at)


def any_keyed_run() -> bool:
    """Whether a keyed run is pending, or waiting with a due timer (both on partial indexes)."""
    now = p_dt(clock.now())
    sql = (
        f"SELECT 1 FROM {RUN} WHERE status = 'pending' AND concurrency_key IS NOT NULL"
        f" UNION ALL SELECT 1 FROM {RUN} WHERE status = 'waiting' AND available_at <= %s"
        " AND concurrency_key IS NOT NULL LIMIT 1"
    )
    return bool(fetchall(sql, [now]))


def claim_guarded(req: ClaimRequest) -> list[Claimed]:
    limited = flow.limited_queues(req.queues)
    if is_postgres():
        return claim_guarded_pg(req, limited, clock.now())
    with transaction.atomic():  # BEGIN IMMEDIATE: one writer, nothing changes under the count
        now = clock.now()  # the lease starts once the write lock is held
        keys = dict(_candidate_keys(req, now)[: req.limit])
        queue_room = {q: _queue_room(q, lim, now) for q, lim in limited.items()}
        key_room = _key_room(keys)
        candidates = _candidates(req, now, limited, queue_room, key_room)
        chosen = _admit(candidates, queue_room, key_room, req.limit)
        if not chosen:
            return []
        sql = (
            f"{claim_update()} WHERE id IN ({placeholders(len(chosen))})"
            f" RETURNING {', '.join(CLAIM_COLUMNS)}"
        )
        params = [*claim_update_params(req, now), *(p_uuid(c.id) for c in chosen)]
        claimed = returning_claimed(sql, params, req.worker_id)
        rated = {q for q, lim in limited.items() if lim.rate is not None}
        _log_claims([c for c in chosen if c.src and c.queue in rated], now)
    return claimed


# -- keys -------------------------------------------------------------------------------------


def _candidate_keys(req: ClaimRequest, now: datetime) -> list[tuple[str, int]]:
    """(key, limit) of every key with a claimable run and room, best head first. The pending
    keys come from a loose scan of the keyed index, one probe per key however many runs it
    holds back; the limit is the head run's. (The head's columns are read by primary key, one
    subquery each: a join could be planned as a scan of the table in the generic plan.)"""
    filt, fparams = _filters(req.pairs, req.queues)
    t = p_dt(now)
    sql = f"""
        WITH RECURSIVE keys(k) AS (
            SELECT MIN(concurrency_key) FROM {RUN}
            WHERE status = 'pending' AND concurrency_key IS NOT NULL
            UNION ALL
            SELECT (SELECT MIN(concurrency_key) FROM {RUN}
                    WHERE status = 'pending' AND concurrency_key IS NOT NULL
                    AND concurrency_key > keys.k)
            FROM keys WHERE keys.k IS NOT NULL
        ), heads AS (
            SELECT keys.k, (SELECT id FROM {RUN}
                            WHERE status = 'pending' AND concurrency_key = keys.k
                            AND available_at <= %s{filt}
                            ORDER BY priority DESC, available_at LIMIT 1) AS head
            FROM keys WHERE keys.k IS NOT NULL
        )
        SELECT k, lim, src, priority, available_at, (SELECT COUNT(*) FROM {RUN}
            WHERE status = 'running' AND concurrency_key = c.k) AS running
        FROM (
            SELECT k, (SELECT concurrency_limit FROM {RUN} WHERE id = head) AS lim, 2 AS src,
                (SELECT priority FROM {RUN} WHERE id = head) AS priority,
                (SELECT available_at FROM {RUN} WHERE id = head) AS available_at
            FROM heads WHERE head IS NOT NULL
            UNION ALL
            SELECT concurrency_key, concurrency_limit, 1, priority, available_at FROM {RUN}
            WHERE status = 'waiting' AND available_at <= %s AND concurrency_key IS NOT NULL{filt}
        ) AS c
    """
    rows = fetchall(sql, [t, *fparams, t, *fparams])
    rows.sort(key=lambda r: (r[2], -r[3], r_dt(r[4])))
    best: dict[str, int] = {}
    for key, limit, _src, _pri, _at, running in rows:
        # A key full when this statement began is left out (counted again under the lock).
        if key not in best and int(running) < int(limit or 1):
            best[key] = int(limit or 1)
    return list(best.items())


def _key_room(keys: dict[str, int]) -> dict[str, int]:
    """How many more runs of each key may start: its limit less its running runs."""
    if not keys:
        return {}
    rows = fetchall(
        f"SELECT concurrency_key, COUNT(*) FROM {RUN} WHERE status = 'running'"
        f" AND concurrency_key IN ({placeholders(len(keys))}) GROUP BY concurrency_key",
        list(keys),
    )
    running = {k: int(n) for k, n in rows}
    return {k: lim - running.get(k, 0) for k, lim in keys.items()}


# -- queues -----------------------------------------------------------------------------------


def _queue_room(queue: str, limits: QueueLimits, now: datetime) -> int:
    """How many more of the queue's runs may start now: its concurrency less its running
    runs, and its rate less the claims logged in the window ending now (a sliding window)."""
    room = 1 << 30
    if limits.concurrency is not None:
        (n,) = fetchall(
            f"SELECT COUNT(*) FROM {RUN} WHERE status = 'running' AND queue = %s", [queue]
        )[0]
        room = limits.concurrency - int(n)
    if limits.rate is not None:
        count, window = limits.rate
        since = p_dt(now - timedelta(seconds=window))
        execute(f"DELETE FROM {CLAIMS} WHERE queue = %s AND claimed_at <= %s", [queue, since])
        (used,) = fetchall(f"SELECT COUNT(*) FROM {CLAIMS} WHERE queue = %s", [queue])[0]
        room = min(room, count - int(used))
    return room


def _log_claims(chosen: list[Candidate], now: datetime) -> None:
    if chosen:
        values = ", ".join(["(%s, %s)"] * len(chosen))
        params = [x for c in chosen for x in (c.queue, p_dt(now))]
        execute(f"INSERT INTO {CLAIMS} (queue, claimed_at) VALUES {values}", params)


# -- candidates -------------------------------------------------------------------------------


def _candidates(
    req: ClaimRequest,
    now: datetime,
    limited: dict[str, QueueLimits],
    queue_room: dict[str, int],
    key_room: dict[str, int],
) -> list[Candidate]:
    """In one statement: expired leases, and due timers and pending runs of three kinds: no
    key in an unlimited queue; no key in each limited queue with room; each key with room.
    Each part reads its own partial index, at most as many rows as could be admitted."""
    filt, fparams = _filters(req.pairs, req.queues)
    parts: list[str] = []
    params: list[Any] = []

    def pick(status: str, src: int, extra: str, extra_params: list[Any], n: int) -> None:
        order = "available_at" if src < 2 else "priority DESC, available_at"
        parts.append(
            f"SELECT * FROM (SELECT {COLUMNS.format(src=f'{src} AS src')} FROM {RUN}"
            f" WHERE status = '{status}' AND available_at <= %s{extra}{filt}"
            f" ORDER BY {order} LIMIT %s) AS p{len(parts)}"
        )
        params.extend([p_dt(now), *extra_params, *fparams, n])

    not_ours = " AND id NOT IN (SELECT value FROM json_each(%s))"
    pick("running", 0, not_ours, [_ids_json(list(req.held))], req.limit)
    free = " AND concurrency_key IS NULL"
    if limited:
        free += f" AND queue NOT IN ({placeholders(len(limited))})"
    for status, src in (("waiting", 1), ("pending", 2)):
        pick(status, src, free, list(limited), req.limit)
        for q, room in queue_room.items():
            if room > 0:
                pick(status, src, " AND concurrency_key IS NULL AND queue = %s", [q], room)
        for k, room in key_room.items():
            if room > 0:
                pick(status, src, " AND concurrency_key = %s", [k], min(room, req.limit))
    rows = fetchall(" UNION ALL ".join(parts), params)
    return [
        Candidate(r_uuid(i), int(src), int(pri), r_dt(at), q, key, lim)
        for i, src, pri, at, q, key, lim in rows
    ]


def _admit(
    candidates: list[Candidate],
    queue_room: dict[str, int],
    key_room: dict[str, int],
    limit: int,
) -> list[Candidate]:
    """Best first, as the plain claim orders them, taking each run while its key and its
    queue have room; a reclaim of an expired lease is already counted as running."""
    queue_room, key_room = dict(queue_room), dict(key_room)
    chosen: list[Candidate] = []
    for c in sorted(candidates, key=lambda c: c.order):
        if len(chosen) == limit:
            break
        if c.src:
            if c.key is not None and key_room.get(c.key, 0) <= 0:
                continue
            if c.queue in queue_room and queue_room[c.queue] <= 0:
                continue
            if c.key is not None:
                key_room[c.key] -= 1
            if c.queue in queue_room:
                queue_room[c.queue] -= 1
        chosen.append(c)
    return chosen
