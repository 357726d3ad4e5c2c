"""The guarded claim: flow control enforced by the claim itself (docs/FLOW_CONTROL.md).

On PostgreSQL: two statements in one round trip (flow_claims_pg.py). On SQLite, here: the
same steps as separate statements (the named `flow_*` queries of queries/sqlite.sql, with the
plain claim's filters) in one BEGIN IMMEDIATE transaction; there is one writer, so nothing
changes under the counts. Nothing is counted in a counter of its own: running runs and the
claim log are the truth, so a crash leaves nothing to drift.

The only ways into `running` are claims (pending or a due timer), and a reclaim of an expired
lease keeps a run `running`: so counting `running` rows where no other claim can admit one
(under the write lock here, under the queue's and key's advisory locks on PostgreSQL)
cannot admit too many.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from .. import clock
from ..conf import QueueLimits
from ..db.alias import atomic
from ..db.sql import fetchall, is_postgres, p_dt, p_uuid, query, r_dt, r_uuid
from . import claim_mode, queue_rooms
from ._common import Claimed
from .claims import (
    _COLUMNS,
    ClaimRequest,
    _claim_filters,
    _claim_params,
    paused_filter,
    returning_claimed,
)
from .flow_claims_pg import claim_guarded_pg
from .flow_rate_claims import claim_rate_keyed
from .queue_rooms import rate_frees_at

__all__ = ["claim_guarded", "rate_frees_at"]

BIG = 1 << 30


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
    return bool(fetchall(query("flow_any_keyed"), {"now": p_dt(clock.now())}))


def any_rate_keyed_run() -> bool:
    """Whether a run with a rate limit key is pending, or waiting with a due timer."""
    return bool(fetchall(query("flow_any_rated"), {"now": p_dt(clock.now())}))


def claim_guarded(req: ClaimRequest) -> list[Claimed]:
    """Rate-keyed runs first (flow_rate_claims.py: self-limiting, they cannot crowd the rest
    out for longer than their limits allow; after the others, a backlog would starve them),
    then the guarded claim for the places left."""
    if not claim_mode.rate_keyed_seen():
        return _claim_guarded(req)
    rated = claim_rate_keyed(req)
    if len(rated) >= req.limit:
        return rated
    taken = Counter(c.run.queue for c in rated)
    room = tuple((q, n - taken[q]) for q, n in req.worker_room)
    return rated + _claim_guarded(replace(req, limit=req.limit - len(rated), worker_room=room))


def _claim_guarded(req: ClaimRequest) -> list[Claimed]:
    limited = claim_mode.limited_queues(req.queues)
    if is_postgres():
        return claim_guarded_pg(req, limited, clock.now())
    with atomic():  # BEGIN IMMEDIATE: one writer, nothing changes under the count
        now = clock.now()  # the lease starts once the write lock is held
        params = _claim_params(req, now)
        keys = dict(_candidate_keys(req, params)[: req.limit])
        rooms = {q: queue_rooms.queue_room(q, lim, now) for q, lim in limited.items()}
        queue_room = {q: room for q, (room, _log) in rooms.items()}
        logs = {q: log for q, (_room, log) in rooms.items() if log is not None}
        key_room = _key_room(keys)
        worker_room = claim_mode.worker_room(req.worker_room, limited)
        # No more of a capped queue's runs read than this worker may take.
        reads = {q: min(room, worker_room.get(q, BIG)) for q, room in queue_room.items()}
        candidates = _candidates(req, params, limited, reads, key_room)
        chosen = _admit(candidates, queue_room, key_room, worker_room, req.limit)
        if not chosen:
            return []
        sql = query("flow_claim_update").format(columns=_COLUMNS)
        ids = json.dumps([p_uuid(c.id) for c in chosen])
        claimed = returning_claimed(sql, {**params, "ids": ids}, req.worker_id)
        queue_rooms.log_claims([(c.queue, c.src) for c in chosen], logs)
    return claimed


# -- keys -------------------------------------------------------------------------------------


def _candidate_keys(req: ClaimRequest, params: dict[str, Any]) -> list[tuple[str, int]]:
    """(key, limit) of every key with a claimable run and room, best head first."""
    filters = _claim_filters(req) + paused_filter()
    rows = fetchall(query("flow_keys").format(filters=filters), params)
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
    rows = fetchall(query("flow_key_running"), {"keys": json.dumps(list(keys))})
    running = {k: int(n) for k, n in rows}
    return {k: lim - running.get(k, 0) for k, lim in keys.items()}


# -- candidates -------------------------------------------------------------------------------


def _candidates(
    req: ClaimRequest,
    base: dict[str, Any],
    limited: dict[str, QueueLimits],
    queue_room: dict[str, int],
    key_room: dict[str, int],
) -> list[Candidate]:
    """In one statement: expired leases, and due timers and pending runs of three kinds: no
    key in an unlimited queue; no key in each limited queue with room; each key with room.
    Each part reads its own partial index, at most as many rows as could be admitted."""
    filters = _claim_filters(req)
    unpaused = filters + paused_filter()  # an expired lease of a paused queue goes on
    template = query("flow_candidates_part")
    parts: list[str] = []
    params: dict[str, Any] = dict(base)
    params["limited"] = json.dumps(list(limited))

    def pick(status: str, src: int, extra: str, n: int, **named: Any) -> None:
        i = len(parts)
        order = "available_at" if src < 2 else "priority DESC, available_at"
        for name, value in named.items():
            extra = extra.replace(f"%({name})s", f"%({name}{i})s")
            params[f"{name}{i}"] = value
        where = filters if src == 0 else unpaused
        parts.append(template.format(i=i, extra=extra, filters=where, order=order))
        params.update({f"status{i}": status, f"src{i}": src, f"n{i}": n})

    not_ours = " AND id NOT IN (SELECT value FROM json_each(%(not_these)s))"
    pick("running", 0, not_ours, req.limit)
    free = (
        " AND concurrency_key IS NULL AND rate_key IS NULL"
        " AND queue NOT IN (SELECT value FROM json_each(%(limited)s))"
    )
    for status, src in (("waiting", 1), ("pending", 2)):
        pick(status, src, free, req.limit)
        for q, room in queue_room.items():
            if room > 0:
                pick(
                    status,
                    src,
                    " AND concurrency_key IS NULL AND rate_key IS NULL AND queue = %(q)s",
                    room,
                    q=q,
                )
        for k, room in key_room.items():
            if room > 0:
                pick(status, src, " AND concurrency_key = %(k)s", min(room, req.limit), k=k)
    rows = fetchall(" UNION ALL ".join(parts), params)
    return [
        Candidate(r_uuid(i), int(src), int(pri), r_dt(at), q, key, lim)
        for i, src, pri, at, q, key, lim in rows
    ]


def _admit(
    candidates: list[Candidate],
    queue_room: dict[str, int],
    key_room: dict[str, int],
    worker_room: dict[str, int],
    limit: int,
) -> list[Candidate]:
    """Best first, as the plain claim orders them, taking each run while its key and its
    queue have room; a reclaim of an expired lease is already counted as running, but not
    by this worker: its queue's worker_concurrency caps it too."""
    queue_room, key_room, worker_room = dict(queue_room), dict(key_room), dict(worker_room)
    chosen: list[Candidate] = []
    for c in sorted(candidates, key=lambda c: c.order):
        if len(chosen) == limit:
            break
        if worker_room.get(c.queue, BIG) <= 0:
            continue
        if c.src:
            if c.key is not None and key_room.get(c.key, 0) <= 0:
                continue
            if queue_room.get(c.queue, BIG) <= 0:
                continue
            if c.key is not None:
                key_room[c.key] -= 1
            if c.queue in queue_room:
                queue_room[c.queue] -= 1
        if c.queue in worker_room:
            worker_room[c.queue] -= 1
        chosen.append(c)
    return chosen
