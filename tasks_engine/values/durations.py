"""Durations the API takes (seconds, or a timedelta), checked where they are given.

A duration that becomes a wake time (a sleep, a fact or child timeout, a check interval, a
retry backoff) is at most `MAX_DURATION`, 100 years (the longest retention, too: conf.py):
now plus that fits every datetime the engine stores, on both databases, and Python's own.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

MAX_DURATION_DAYS = 36_500
MAX_DURATION = timedelta(days=MAX_DURATION_DAYS)
MAX_SECONDS = MAX_DURATION.total_seconds()


def duration_seconds(
    value: Any, what: str, *, zero_ok: bool = False, limit: float | None = MAX_SECONDS
) -> float:
    """`value` (seconds or a timedelta) in seconds. TypeError for anything else (a bool too);
    ValueError for NaN, ±inf, a negative duration, 0 unless `zero_ok`, and more than `limit`
    seconds (None: no bound but finiteness). The message names `what` and the value given."""
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise TypeError(
            f"{what} must be seconds (a number) or a timedelta, not {type(value).__name__}"
            f" ({value!r})"
        )
    try:
        seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    except OverflowError:  # an int too large for a float
        seconds = math.inf
    low_ok = seconds >= 0 if zero_ok else seconds > 0
    if not (low_ok and math.isfinite(seconds) and (limit is None or seconds <= limit)):
        low = "0 or more" if zero_ok else "more than 0"
        high = f"at most {limit / 86_400:g} days" if limit is not None else "finite"
        raise ValueError(f"{what} must be {low} seconds and {high}, got {value!r}")
    return seconds
