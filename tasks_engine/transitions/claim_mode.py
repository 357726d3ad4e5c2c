"""Which claims must go through flow control (docs/FLOW_CONTROL.md).

A worker claims with the plain one-statement claim unless a limit can apply to what it claims:
a limited queue among its queues, or keyed runs (this process enqueued one, or the worker's
probe found one in the database; from then on the process stays guarded). The plain claim
never takes keyed runs nor runs of limited queues, so it cannot break a limit; the guarded
claim (transitions/flow_claims.py) takes those, and everything else along with them."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from ..conf import QueueLimits, engine_settings
from . import queue_state

# Keyed runs exist: set by this process's keyed enqueue, or by a worker's probe (`refresh`).
# Once set, every claim of this process is guarded.
_keyed_seen = threading.Event()
# Runs with a rate limit key exist (the same two ways): the rate claim runs before the guarded
# claim (flow_rate_claims.py).
_rated_seen = threading.Event()
_probed_at = [float("-inf")]


def limited_queues(queues: list[str] | None) -> dict[str, QueueLimits]:
    """The limited queues a worker serving `queues` (None: all) claims from: QUEUES with the
    operators' runtime overrides (queue_state.py)."""
    limits = queue_state.limits()
    if queues is None:
        return dict(limits)
    return {q: limits[q] for q in queues if q in limits}


def worker_caps(limited: dict[str, QueueLimits]) -> dict[str, int]:
    """Each of these queues' `worker_concurrency`, where it has one: its runs at once in one
    worker process."""
    return {q: lim.worker_concurrency for q, lim in limited.items() if lim.worker_concurrency}


def worker_room(
    given: Iterable[tuple[str, int]], limited: dict[str, QueueLimits]
) -> dict[str, int]:
    """How many more runs of each capped queue this worker may take: what its slot pool counted
    (`given`, ClaimRequest.worker_room), else the whole cap."""
    counted = dict(given)
    return {q: counted.get(q, cap) for q, cap in worker_caps(limited).items()}


def note_keyed() -> None:
    _keyed_seen.set()


def note_rate_keyed() -> None:
    _rated_seen.set()
    _keyed_seen.set()


def rate_keyed_seen() -> bool:
    return _rated_seen.is_set()


def forget_keyed() -> None:
    """Tests only: back to the plain claim once their keyed runs are gone."""
    _keyed_seen.clear()
    _rated_seen.clear()
    _probed_at[0] = float("-inf")


def guarded(pairs: list[tuple[str, int]], queues: list[str] | None) -> bool:
    return _keyed_seen.is_set() or bool(limited_queues(queues))


def refresh() -> None:
    """Called by a worker's claim loop: read the queue snapshot if it is due (queue_state.py:
    so that the claim itself does not), and at most once per poll interval, look for keyed
    runs (pending, or waiting with a due timer), so that a worker whose own workflows declare
    no key still learns of runs another process enqueued with `concurrency_key=`."""
    queue_state.current()
    if _keyed_seen.is_set() and _rated_seen.is_set():
        return
    now = time.monotonic()
    if now - _probed_at[0] < engine_settings().poll_interval:
        return
    _probed_at[0] = now
    from .flow_claims import any_keyed_run, any_rate_keyed_run

    if not _rated_seen.is_set() and any_rate_keyed_run():
        note_rate_keyed()
    if not _keyed_seen.is_set() and any_keyed_run():
        _keyed_seen.set()
