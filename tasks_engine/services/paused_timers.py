"""The leader's paused-queues service: a waiting run of a paused queue whose timer comes due
is claimed by no worker, so it is moved to `pending`, where it waits for the resume like the
queue's other runs (and shows as such in lists and counts)."""

from __future__ import annotations

from .. import transitions
from ..models import Queue

EVERY_SECONDS = 1.0


def run_once() -> int:
    """One round: the due timers of every paused queue (the table, not a snapshot)."""
    paused = list(Queue.objects.filter(paused=True).values_list("name", flat=True))
    return transitions.pend_paused_timers(paused)
