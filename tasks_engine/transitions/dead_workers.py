"""Dead workers: which worker rows are alive, and the reap of the dead ones' runs.

A worker whose beat is older than DEAD_WORKER_SECONDS is dead (`kill -9`, a lost host). The
reap writes run rows (their lease expiry and `due_at`), so it lives here with the other
writers; services/fleet.py keeps the rows' own upkeep (beats, listing, what is served).
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Q

from ..conf import engine_settings
from ..db.alias import atomic, connection
from ..db.sql import db_now, db_now_sql, placeholders, skip_locked
from ..models import Worker, WorkflowRun

WORKER = Worker._meta.db_table
RUN = WorkflowRun._meta.db_table


def alive() -> Q:
    """Workers whose beat is at most DEAD_WORKER_SECONDS old, on the database's clock, in the
    query itself (no round trip to read the clock first)."""
    dead_after = timedelta(seconds=engine_settings().dead_worker_seconds)
    return Q(last_heartbeat__gte=db_now() - dead_after)


def reap_dead_workers() -> dict[str, int]:
    """One round of the leader's dead-worker service: for every worker whose beat is older than
    DEAD_WORKER_SECONDS, make its running runs claimable now and delete its row, in one short
    transaction. Returns {"workers": n, "runs": m}.

    The runs' lease expiry becomes the dead worker's last beat, not this leader's clock:
    claimers compare the expiry with their own clocks, and a leader whose clock ran ahead
    would keep the runs from them for the difference. The last beat is on the database's
    clock and DEAD_WORKER_SECONDS old or more, so neither the leader's clock nor a database
    clock that far ahead of a claimer's delays the takeover. The runs' `due_at` is the reap
    (database clock): the claim keeps it for a running run whose `due_at` is past its expiry,
    so the claim-delay metric counts from when the runs became claimable, not from the beat."""
    cutoff_sql, cutoff_params = db_now_sql(-engine_settings().dead_worker_seconds)
    # Not sql.execute(): a statement shape per number of dead workers is not worth preparing.
    with atomic(), connection.cursor() as cur:
        # Locked, so a late beat of one of them waits and then re-inserts its row.
        cur.execute(
            f"SELECT id FROM {WORKER} WHERE last_heartbeat < {cutoff_sql}{skip_locked()}",
            cutoff_params,
        )
        dead = [r[0] for r in cur.fetchall()]
        if not dead:
            return {"workers": 0, "runs": 0}
        now_sql, now_params = db_now_sql()
        ids = placeholders(len(dead))
        last_beat = f"(SELECT w.last_heartbeat FROM {WORKER} w WHERE w.id = {RUN}.worker_id)"
        cur.execute(
            f"""UPDATE {RUN} SET available_at = {last_beat}, due_at = {now_sql}
                WHERE status = 'running' AND worker_id IN ({ids})
                    AND available_at > {last_beat}""",
            [*now_params, *dead],
        )
        runs = cur.rowcount
        cur.execute(f"DELETE FROM {WORKER} WHERE id IN ({ids})", dead)
        workers = cur.rowcount
    return {"workers": workers, "runs": runs}
