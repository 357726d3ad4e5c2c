"""The guarded claim on PostgreSQL: two statements sent together, after one that sets the
planner's settings for the transaction (PLANNED), one round trip, one implicit transaction
(docs/FLOW_CONTROL.md, "How the claim enforces it").

1. The locks: a transaction-level advisory lock per limited queue the worker serves (waited
   for, in name order), then the keys with a claimable run and room, best first, each tried
   with `pg_try_advisory_xact_lock` until the claim's size is reached; the keys it got go to
   the second statement in a transaction-local setting (`tasks_engine.flow_keys`).
2. The claim: running runs per locked key and per limited queue, and the rate log (by its
   sequence numbers), counted;
   candidates from each source's partial index, at most as many per key or queue as have
   room (the found runs of the locked keys looked up one by one on the primary key: as
   `id = ANY(...)` the generic plan could walk the status index over every pending run);
   admitted best first while the key and the queue have room; the update, the rate
   log's new rows and the pruning of its old ones, all in this one statement.

Under READ COMMITTED each statement takes its own snapshot when it starts: the second starts
after the first has every lock it took, so its counts include every claim that an earlier
holder of the same lock committed, and no other claim of those keys or queues can commit
before this transaction does. (A count in the statement that takes the lock would read a
snapshot older than the lock, and could miss the last holder's claims.)
"""

from __future__ import annotations

import functools
import json
import re
import time
from datetime import datetime, timedelta
from typing import Any

from django.db import ProgrammingError

from ..conf import QueueLimits, engine_settings
from ..db import partitions, pooler
from ..db.alias import connection
from ..db.sql import p_dt, query, statement_cursor
from ..models import Queue, QueueClaim
from . import claim_floor, claim_mode, first_steps, queue_state
from ._common import RUN, Claimed
from .claims import (
    CLAIM_COLUMNS,
    ClaimRequest,
    Prestart,
    _filters,
    _ids_json,
    claim_update,
    claim_update_params,
    claimed_from_rows,
    claimed_prestarted,
    prestarted_select,
)

CLAIMS = QueueClaim._meta.db_table
# A queue's concurrency override (its row, if any) is read by the claim statement itself: a
# limit an operator lowers is seen by the first claim that starts after it commits.
QUEUES = Queue._meta.db_table
# pg_advisory_xact_lock(class, hashtext(name)): one class for queues, one for keys. A hash
# collision only makes two keys share a lock (claims of them are serialised), never admits more.
QUEUE_LOCK = 0x7E51
KEY_LOCK = 0x7E52
BIG = 1 << 30
# Both statements are planned (once per connection: prepared generic plans) in the
# transaction this statement, sent before them, opened with these off: each of their parts
# has an index that serves it in order, but the estimates for the small partial indexes
# (rows=1) choose bitmap or sequential scans, which visit every dead entry the claims leave
# between vacuums (measured: 0.36 ms against 0.63 to 0.84 ms a claim).
# (And JIT off: a disabled scan's cost would pass jit_above_cost, and JIT compiles at every
# execution, a generic plan's too: seconds a claim.)
# (A statement of its own: the locking statement planned with the defaults, its generic plan
# made while the runs table was small or its statistics behind a backlog, scanned the whole
# table for its keyed runs: 18,024 rows read with 3,000 runs of one full key pending;
# test_flow_plans.py.)
PLANNED = (
    "SELECT set_config('enable_bitmapscan', 'off', true),"
    " set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)"
)
# On partitioned tables, the claim floor (claim_floor.py) of every read of the runs, as the
# plain claim's: set by the statement before both, so neither one's parameters move; a stable
# expression, so PostgreSQL leaves the older partitions out when each statement starts.
FLOOR_SETTING = "tasks_engine.claim_floor"
PLANNED_FLOOR = PLANNED + f", set_config('{FLOOR_SETTING}', %s, true)"


def planner_settings() -> tuple[str, list[str] | None]:
    """The statement sent before both, and its parameters: PLANNED, with the claim floor on
    partitioned tables."""
    lowest = claim_floor.floor()
    return (PLANNED, None) if lowest is None else (PLANNED_FLOOR, [str(lowest)])


def _floor(partitioned: bool, table: str = "") -> str:
    if not partitioned:
        return ""  # an unpartitioned claim keeps its statements
    return f" AND {table}id >= current_setting('{FLOOR_SETTING}')::uuid"


# What the locking statement hands to the claim statement: the keys it locked, with their
# limits, and the runs of those keys it found (their candidates): of each key, the best as many
# as it had room in the locking statement's snapshot. The claim statement's own count decides:
# less room there (a claim of the key committed just before the lock was taken) admits fewer;
# more (a run of the key ended in between) leaves a place to the next claim. Each candidate
# costs a lookup and a row lock: 52 for 32 places without this cap, in a worker's claim of 50
# keys of limit 1; and 98 for 48 places (keys of limit 4) before the candidates were also cut
# to the claim's size, best first.
# Both statements look keys up in a jsonb object built once (running runs per key, the keys
# got, their room), not by a join: the estimates for these small sets (one row) plan nested
# loops, whose comparisons grew with the square of the claim's size or of the number of keys
# (1.2 ms of a 3 ms locking statement at 48 places).
KEYS_SETTING = "tasks_engine.flow_keys"
RUNS_SETTING = "tasks_engine.flow_runs"


def walk_size(limit: int) -> int:
    """How many keyed runs the first look reads, in claim order, before visiting each key."""
    return 2 * limit + 6


def claim_guarded_pg(
    req: ClaimRequest, limited: dict[str, QueueLimits], now: datetime
) -> list[Claimed]:
    guesses_json, guesses = first_steps.published()
    rows = _pipelined(*statements(req, limited, now, guesses_json if guesses else None))
    if not guesses:
        return claimed_from_rows(rows, req.worker_id)
    return claimed_prestarted(rows, req.worker_id, Prestart(guesses))


def statements(
    req: ClaimRequest,
    limited: dict[str, QueueLimits],
    now: datetime,
    first_steps_json: str | None = None,
) -> tuple[str, list[Any], str, list[Any]]:
    """The locking statement and the claim statement, with their parameters. With
    `first_steps_json` (first_steps.published()), the claim also starts the first step of each
    fresh run it takes, as the plain claim does (`claim_prestart`)."""
    filt, fparams = _filters(req.pairs, req.queues)
    # Due timers and pending runs of paused queues are left out; expired leases go on.
    pfilt, pparams = _paused_filter()
    base = engine_settings().queues
    t = p_dt(now)
    walk = walk_size(req.limit)
    names = _text_array(tuple(limited))
    lock_params: list[Any] = [_text_array(tuple(sorted(limited)))]
    lock_params += [t, walk]  # scan
    lock_params += [t, walk, *fparams, *pparams]  # woken
    lock_params += [*fparams, *pparams]  # roomy
    lock_params += [t, t, *fparams, *pparams, walk, req.limit]  # heads, loose
    lock_params += [2 * req.limit, req.limit, req.limit]
    capped = claim_mode.worker_room(req.worker_room, limited)
    queues = [
        {
            "q": q,
            # The setting's: the claim statement reads the override itself, under the lock.
            "conc": base.get(q, QueueLimits()).concurrency,
            "rate": lim.rate[0] if lim.rate else None,
            "since": (now - timedelta(seconds=lim.rate[1])).isoformat() if lim.rate else None,
            "wroom": capped.get(q),
        }
        for q, lim in limited.items()
    ]
    n = req.limit
    rated = [q for q in queues if q["rate"] is not None]
    claim_params: list[Any] = [json.dumps(queues)]
    claim_params += [x for q in rated for x in (q["q"], q["since"])]  # pruned
    claim_params += [t, _ids_json(list(req.held)), *fparams, n]  # expired
    claim_params += [t, names, *fparams, *pparams, n, t, names, *fparams, *pparams, n]  # free
    claim_params += [t, *fparams, *pparams, n]  # per queue
    claim_params += [t]  # keyed
    claim_params += [n, *claim_update_params(req, now)]
    if rated:
        claim_params.append(t)  # logged
    if first_steps_json is not None:
        claim_params += [t, first_steps_json, t]  # ks
    first, second = _statements(
        filt,
        len(rated),
        first_steps_json is not None,
        bool(capped),
        pfilt,
        partitions.unit() is not None,
    )
    return first, lock_params, second, claim_params


def _paused_filter() -> tuple[str, list[Any]]:
    paused = queue_state.paused()
    if not paused:
        return "", []
    return " AND queue <> ALL(%s::text[])", [_text_array(tuple(sorted(paused)))]


@functools.lru_cache(maxsize=64)
def _text_array(values: tuple[str, ...]) -> str:
    """A text[] literal (cheaper to send than a list adapted element by element)."""
    return (
        "{"
        + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values)
        + "}"
    )


def _pipelined(first: str, p1: list[Any], second: str, p2: list[Any]) -> list[tuple[Any, ...]]:
    """Both statements (after PLANNED) in one round trip; outside a transaction they form one
    implicit transaction, committed after the second (the advisory locks are held until
    then)."""
    settings, floor = planner_settings()
    connection.ensure_connection()
    raw = connection.connection
    prepare = engine_settings().prepared_statements
    start = time.monotonic()
    try:
        with connection.wrap_database_errors:
            (planned, c0), (first, c1), (second, c2) = (
                statement_cursor(raw, sql) for sql in (settings, first, second)
            )
            with raw.pipeline():  # its end sends the one Sync and reads both results
                c0.execute(planned, floor, prepare=prepare)
                c1.execute(first, p1, prepare=prepare)
                c2.execute(second, p2, prepare=prepare)
            rows = c2.fetchall()
    except ProgrammingError as exc:
        raise pooler.explained(exc) from exc
    if connection.queries_logged:
        took = f"{time.monotonic() - start:.3f}"
        connection.queries_log.extend(
            [{"sql": sql, "time": took} for sql in (settings, first, second)]
        )
    return rows


@functools.lru_cache(maxsize=16)
def _statements(
    filt: str, rated: int, prestart: bool, capped: bool, pfilt: str = "", partitioned: bool = False
) -> tuple[str, str]:
    # Compact: fewer bytes to send (and to convert once: sql.LONGEST_STATEMENT).
    claim = _claim_statement(filt, rated, prestart, capped, pfilt, partitioned)
    return _compact(_lock_statement(filt + pfilt, partitioned)), _compact(claim)


def _compact(sql: str) -> str:
    """One line, no spaces around parentheses, commas and operators (its literals have none)."""
    return re.sub(r" ?([(),]|<=|>=|<>|=|<|>|\|\|) ?", r"\1", " ".join(sql.split()))


def _lock_statement(filt: str, partitioned: bool = False) -> str:
    # Each look reads a bounded number of rows first and applies the worker's filters (its
    # workflows, its queues) after: keyed runs it cannot claim (another queue's held-back
    # runs) cost it that bound, never a walk past all of them.
    keyed = (
        "SELECT id, concurrency_key AS k, concurrency_limit AS lim, {src} AS src, priority,"
        f" available_at, ctid AS tid, task_name, version, queue FROM {RUN}"
    )
    # A key's room: its limit less its running runs, looked up in the `running` object.
    room = "coalesce({t}.lim, 1) - coalesce(((SELECT m FROM running) ->> {t}.k)::int, 0)"
    fl = _floor(partitioned)
    # `loose`, the keys' heads, is walked only when the scan was full and its runs with room
    # cannot fill the claim: a head past the scan comes after every scanned run in claim
    # order, so when the scan found enough, they are the best. (It was walked whenever fewer
    # keys than places had room: in a drain of 50 keys of limit 4, claims of 64 places, 50
    # probes for heads the scan had found; the statement took 2.33 ms a claim against 3.27.)
    return f"""
        WITH RECURSIVE locked_queues AS MATERIALIZED (
            SELECT count(pg_advisory_xact_lock({QUEUE_LOCK}, hashtext(q))) AS n
            FROM unnest(%s::text[]) AS q
        ), running AS MATERIALIZED (
            SELECT coalesce(jsonb_object_agg(k, n), '{{}}') AS m FROM (
                SELECT concurrency_key AS k, count(*) AS n FROM {RUN}
                WHERE status = 'running' AND concurrency_key IS NOT NULL{fl}
                GROUP BY concurrency_key
            ) AS r
        ), scan AS MATERIALIZED (
            {keyed.format(src=2)}
            WHERE status = 'pending' AND concurrency_key IS NOT NULL AND available_at <= %s{fl}
            ORDER BY priority DESC, available_at LIMIT %s
        ), woken AS MATERIALIZED (
            SELECT * FROM ({keyed.format(src=1)}
                WHERE status = 'waiting' AND available_at <= %s AND concurrency_key IS NOT NULL{fl}
                ORDER BY available_at LIMIT %s) AS w
            WHERE true{filt}
        ), roomy AS MATERIALIZED (
            SELECT * FROM (
                SELECT f.*, {room.format(t="f")} AS room
                FROM (SELECT * FROM scan WHERE true{filt} UNION ALL SELECT * FROM woken) AS f
            ) AS f WHERE room > 0
        ), heads AS (
            (
                {keyed.format(src=2)}
                WHERE status = 'pending' AND concurrency_key IS NOT NULL AND available_at <= %s{fl}
                ORDER BY concurrency_key, priority DESC, available_at LIMIT 1
            )
            UNION ALL
            SELECT n.* FROM heads CROSS JOIN LATERAL (
                {keyed.format(src=2)}
                WHERE status = 'pending' AND concurrency_key IS NOT NULL AND available_at <= %s
                AND concurrency_key > heads.k{fl}
                ORDER BY concurrency_key, priority DESC, available_at LIMIT 1
            ) AS n
        ), loose AS (
            SELECT * FROM (
                SELECT h.*, {room.format(t="h")} AS room FROM heads h WHERE true{filt}
            ) AS h WHERE room > 0
            AND (SELECT count(*) FROM scan) >= %s AND (SELECT coalesce(sum(least(room, n)), 0)
                FROM (SELECT min(room) AS room, count(*) AS n FROM roomy GROUP BY k) AS r) < %s
        ), ranked AS MATERIALIZED (
            SELECT c.*, row_number() OVER (
                PARTITION BY c.k ORDER BY c.src, c.priority DESC, c.available_at, c.tid) AS rank
            FROM (SELECT DISTINCT ON (id) * FROM (
                SELECT * FROM roomy UNION ALL SELECT * FROM loose) AS c ORDER BY id) AS c
        ), ordered AS (
            SELECT k, coalesce(lim, 1) AS lim FROM ranked
            WHERE rank = 1 AND (SELECT n FROM locked_queues) >= 0
            ORDER BY src, priority DESC, available_at, tid LIMIT %s
        ), got AS MATERIALIZED (
            SELECT k, lim FROM ordered
            WHERE pg_try_advisory_xact_lock({KEY_LOCK}, hashtext(k)) LIMIT %s
        )
        SELECT set_config('{KEYS_SETTING}', coalesce(
                (SELECT json_agg(json_build_object('k', k, 'lim', lim)) FROM got)::text, '[]'),
                true),
            set_config('{RUNS_SETTING}', coalesce((SELECT array_agg(c.id) FROM (
                    SELECT c.id FROM ranked c
                    WHERE c.rank <= c.room AND (SELECT jsonb_object_agg(k, 1) FROM got) ? c.k
                    ORDER BY c.src, c.priority DESC, c.available_at, c.tid LIMIT %s
                ) AS c)::text, '{{}}'), true)
    """


def _claim_statement(
    filt: str,
    rated: int,
    prestart: bool,
    capped: bool = False,
    pfilt: str = "",
    partitioned: bool = False,
) -> str:
    cols = (
        "id, {src} AS src, priority, available_at, ctid AS tid, queue, concurrency_key AS k"
        f" FROM {RUN}"
    )
    not_ours = " AND id NOT IN (SELECT json_array_elements_text(%s::json)::uuid)"
    lock = "FOR UPDATE SKIP LOCKED"
    fl, rfl = _floor(partitioned), _floor(partitioned, "r.")

    def source(status: str, src: int, extra: str, limit: str) -> str:
        order = "available_at" if src < 2 else "priority DESC, available_at"
        where = filt if src == 0 else filt + pfilt  # an expired lease of a paused queue goes on
        return (
            f"SELECT {cols.format(src=src)} WHERE status = '{status}' AND available_at <= %s"
            f"{extra}{where}{fl}"
            f" ORDER BY {order} LIMIT {limit} {lock}"
        )

    # Runs with a rate key are the rate claim's (flow_rate_claims.py), in none of these.
    free = " AND concurrency_key IS NULL AND rate_key IS NULL AND queue <> ALL(%s::text[])"
    # Due timers are few: one source for all queues, those of full queues left out.
    woken = (
        " AND concurrency_key IS NULL AND rate_key IS NULL AND (queue <> ALL(%s::text[])"
        " OR queue IN (SELECT q FROM queues WHERE room > 0))"
    )
    # The rate log: rows older than their queue's window pruned (by its index), one row per
    # rate-limited queue whose runs this claim starts from pending or a due timer.
    # (An ordered index scan, not a bitmap one: it marks the entries of rows deleted before as
    # dead, so that later prunes skip them instead of visiting them again until a vacuum.)
    old = " UNION ALL ".join(
        [
            f"(SELECT id FROM {CLAIMS} WHERE queue = %s AND claimed_at <= %s"
            " ORDER BY queue, claimed_at LIMIT 1000)"
        ]
        * rated
    )
    pruned = f"), pruned AS (DELETE FROM {CLAIMS} WHERE id IN ({old})" if rated else ""
    # A log row numbers its runs on from the queue's last (its seq: the last one's number),
    # at a time never earlier than the row before it (a worker whose clock is behind records
    # the latest): the rows in the window are the queue's last ones, and the runs they
    # started are counted from two sequence numbers, each one index probe (the newest row;
    # the oldest inside the window, past the few that left it since the last claim, which
    # this statement prunes).
    logged = (
        f", logged AS (INSERT INTO {CLAIMS} (queue, claimed_at, seq, claims)"
        " SELECT a.queue, greatest(%s, max(queues.last_at)),"
        " coalesce(max(queues.last_seq), 0) + count(*), count(*)"
        " FROM admitted a JOIN queues ON queues.q = a.queue"
        " WHERE queues.rated AND a.src > 0 GROUP BY a.queue)"
        if rated
        else ""
    )
    per_queue = " AND concurrency_key IS NULL AND rate_key IS NULL AND queue = queues.q"
    # A queue's worker_concurrency caps every run of it this worker takes, a retaken expired
    # lease too (which the queue's fleet-wide room leaves out: it is running already). Its
    # runs come best first, expired leases ahead, so the cap keeps a prefix of them.
    wrank, wcap, wroom, wcol, wdef = "", "", "", "", ""
    if capped:  # only then: a claim without caps keeps the statement it had
        wroom = f",\n                coalesce(j.wroom, {BIG})"
        wcol = f", coalesce(j.wroom, {BIG}) AS wroom"
        wdef = ", wroom int"
        wrank = (
            ", row_number() OVER (PARTITION BY c.queue"
            " ORDER BY c.src, c.priority DESC, c.available_at, c.tid) AS wrank"
        )
        wcap = (
            f" AND c.wrank <= coalesce((SELECT wroom FROM queues WHERE queues.q = c.queue), {BIG})"
        )
    # The plain claim's start of the first steps, its named parameters in their order.
    ks = ", " + _positional(query("claim_prestart")) if prestart else ""
    select = prestarted_select(True) if prestart else "SELECT * FROM k"
    return f"""
        WITH rooms AS MATERIALIZED (
            SELECT jsonb_object_agg(j.k, j.lim - (SELECT count(*) FROM {RUN} r
                WHERE r.status = 'running' AND r.concurrency_key = j.k{rfl})) AS m
            FROM json_to_recordset(current_setting('{KEYS_SETTING}')::json) AS j(k text, lim int)
        ), queues AS MATERIALIZED (
            SELECT j.q, j.rate IS NOT NULL AS rated, j.since, n.seq AS last_seq,
                n.claimed_at AS last_at, least(
                CASE WHEN coalesce(ov.concurrency, j.conc) IS NULL THEN {BIG}
                    ELSE coalesce(ov.concurrency, j.conc) - (SELECT count(*) FROM {RUN} r
                    WHERE r.status = 'running' AND r.queue = j.q{rfl}) END,
                CASE WHEN j.rate IS NULL THEN {BIG}
                    ELSE j.rate - coalesce(n.seq - o.seq + o.claims, 0) END{wroom}
            ) AS room{wcol}
            FROM json_to_recordset(%s::json)
                AS j(q text, conc int, rate int, since timestamptz{wdef})
            LEFT JOIN {QUEUES} ov ON ov.name = j.q
            LEFT JOIN LATERAL (
                SELECT c.seq, c.claimed_at FROM {CLAIMS} c WHERE j.rate IS NOT NULL
                AND c.queue = j.q ORDER BY c.queue, c.seq DESC LIMIT 1
            ) AS n ON true
            LEFT JOIN LATERAL (
                SELECT c.seq, c.claims FROM {CLAIMS} c WHERE j.rate IS NOT NULL
                AND c.queue = j.q AND c.claimed_at > j.since
                ORDER BY c.queue, c.claimed_at, c.seq LIMIT 1
            ) AS o ON true
{pruned}
        ), candidates AS (
            SELECT * FROM ({source("running", 0, not_ours, "%s")}) AS expired
            UNION ALL SELECT * FROM ({source("waiting", 1, woken, "%s")}) AS woken
            UNION ALL SELECT * FROM ({source("pending", 2, free, "%s")}) AS due
            UNION ALL SELECT x.* FROM queues CROSS JOIN LATERAL (
                {source("pending", 2, per_queue, "least(queues.room, %s)")}) AS x
                WHERE queues.room > 0
            UNION ALL SELECT keyed.* FROM unnest(current_setting('{RUNS_SETTING}')::uuid[]) AS f(id)
            CROSS JOIN LATERAL (
                SELECT id, CASE WHEN status = 'waiting' THEN 1 ELSE 2 END AS src, priority,
                    available_at, ctid AS tid, queue, concurrency_key AS k FROM {RUN}
                WHERE id = f.id AND status IN ('pending', 'waiting') AND available_at <= %s{fl}
                AND ((SELECT m FROM rooms) ->> concurrency_key)::int > 0 {lock}
            ) AS keyed
        ), key_ok AS (
            SELECT c.* FROM (
                SELECT c.*, row_number() OVER (PARTITION BY c.src = 0, c.k
                    ORDER BY c.src, c.priority DESC, c.available_at, c.tid) AS rank
                FROM candidates c
            ) AS c
            WHERE c.src = 0 OR c.k IS NULL
            OR c.rank <= coalesce(((SELECT m FROM rooms) ->> c.k)::int, 0)
        ), admitted AS MATERIALIZED (
            SELECT c.id, c.src, c.queue FROM (
                SELECT c.*, row_number() OVER (PARTITION BY c.src = 0, c.queue
                    ORDER BY c.src, c.priority DESC, c.available_at, c.tid) AS qrank{wrank}
                FROM key_ok c
            ) AS c
            WHERE (c.src = 0
            OR c.qrank <= coalesce((SELECT room FROM queues WHERE queues.q = c.queue), {BIG})){wcap}
            ORDER BY c.src, c.priority DESC, c.available_at, c.tid LIMIT %s
        ), k AS (
            {claim_update()} WHERE id = ANY(ARRAY(SELECT id FROM admitted)){fl}
            RETURNING {", ".join(CLAIM_COLUMNS)}
        ){logged}{ks}
        {select}
    """


def _positional(sql: str) -> str:
    """`claim_prestart` with positional parameters: %(now)s, %(first_steps)s, %(now)s."""
    out = sql.replace("%(now)s", "%s").replace("%(first_steps)s", "%s")
    assert out.count("%s") == 3 and "%(" not in out, "claim_prestart's parameters changed"
    return out
