"""The leader's partition maintenance (TASKS_ENGINE["PARTITION"]): every round, the current
period's partitions and the next AHEAD periods' are made if missing (a catalog query per table
when they exist). Made ahead, new runs land in their own period; if this ever falls behind,
they land in the DEFAULT partition, and making their period moves them out."""

from __future__ import annotations

from ..db import partitions
from ..db.partitions.periods import AHEAD, ensure_ahead

EVERY_SECONDS = 600.0


def run_once() -> list[str]:
    """The partitions made this round (none without PARTITION on PostgreSQL)."""
    period = partitions.unit()
    return [] if period is None else ensure_ahead(period, AHEAD)
