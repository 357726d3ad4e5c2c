"""The engine's single time source. Tests may replace `now`.

Also the runs' ids, which are time-ordered: `new_run_id`, a version 7 UUID (RFC 9562)."""

from __future__ import annotations

import os
import threading
import time
import uuid
from datetime import UTC, datetime


def now() -> datetime:
    return datetime.now(UTC)


# -- run ids -----------------------------------------------------------------------------------
#
# Why version 7 and not uuid4: the runs table's primary key is a B-tree on the id. With random
# ids every insert lands on a random leaf page, and every claim and completion (a new row
# version, never a HOT update, so a new primary-key entry beside the old one) lands on that
# run's random page again: the first write to each page after a checkpoint logs the whole 8 kB
# page (a full-page image). Time-ordered ids put the runs being written together at the right
# end of the index (bench/run_ids.py: WAL bytes per enqueue and per claim + completion).
#
# Layout (RFC 9562 section 5.7, with the monotonic counter of its section 6.2, method 1, as
# Python 3.14's uuid.uuid7 lays it out): 48 bits of Unix milliseconds, the version (4 bits),
# a 42-bit counter around the variant (12 + 30 bits), then 32 random bits. The counter starts
# at a random value below 2^41 at every new millisecond and counts up within one, so the ids
# one process makes sort in the order it made them, even within a millisecond or if the wall
# clock steps back. The last 8 hex digits are random: the admin shows those (its first ones are
# a 65-second window of creation time). Hand-written rather than a dependency: 30 lines, and
# Python 3.14's uuid.uuid7 is the same layout, so the ids do not change when the stdlib has it.

_VERSION_7 = 0x7000 << 64  # the version nibble in its place
_VARIANT_RFC = 0b10 << 62
_COUNTER_MAX = (1 << 42) - 1
_wall_ns = time.time_ns  # a test may step it back
_ids_lock = threading.Lock()
_last_ms = -1
_last_counter = 0


def _fresh_counter_and_tail() -> tuple[int, int]:
    rand = int.from_bytes(os.urandom(10))
    return (rand >> 32) & ((1 << 41) - 1), rand & 0xFFFF_FFFF


def new_run_id() -> uuid.UUID:
    """A version 7 UUID of now. Wall-clock time, not `now()`: a faked engine clock in a test
    must not move where ids sort."""
    global _last_ms, _last_counter
    ms = _wall_ns() // 1_000_000
    with _ids_lock:
        if ms > _last_ms:
            counter, tail = _fresh_counter_and_tail()
        else:  # the same millisecond, or the clock stepped back: count on from the last id
            ms = _last_ms
            counter = _last_counter + 1
            if counter > _COUNTER_MAX:  # 2^41 ids in one millisecond at least: the next one
                ms += 1
                counter, tail = _fresh_counter_and_tail()
            else:
                tail = int.from_bytes(os.urandom(4))
        _last_ms, _last_counter = ms, counter
    return uuid.UUID(
        int=(ms & 0xFFFF_FFFF_FFFF) << 80
        | _VERSION_7
        | (counter >> 30) << 64
        | _VARIANT_RFC
        | (counter & 0x3FFF_FFFF) << 32
        | tail
    )
