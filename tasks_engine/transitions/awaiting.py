"""A run someone waits on (tasks_engine.wait): flagged, so that its end sends a NOTIFY.

The migration's trigger `tasks_engine_run_ended` sends `pg_notify(RUN_END_CHANNEL, run id)`
when a flagged run's status becomes completed, failed or canceled, in the transaction that
ends it. Runs nobody waits on send nothing: a drain pays for no notification.
"""

from __future__ import annotations

import uuid
from typing import Any

from ._common import RUN

RUN_END_CHANNEL = "tasks_engine_run_end"


def mark_awaited(conn: Any, run_id: uuid.UUID) -> None:
    """On the waiter's own autocommit connection (never the caller's transaction, whose row
    lock would hold up the very end it waits for). Call after LISTEN, then read the status:
    an end that commits before the flag is seen by that read, one after it notifies."""
    conn.execute(f"UPDATE {RUN} SET awaited = TRUE WHERE id = %s AND NOT awaited", [run_id])
