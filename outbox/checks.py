"""System checks for the OUTBOX setting."""

from __future__ import annotations

import math
from typing import Any

from django.core import checks

from tasks_engine.conf import MAX_RETENTION_DAYS

from .conf import outbox_settings


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        s = outbox_settings()
    except (TypeError, ValueError) as exc:
        return [checks.Error(f"OUTBOX is invalid: {exc}", id="outbox.E001")]
    errors: list[checks.CheckMessage] = []
    if s.max_attempts < 1:
        errors.append(checks.Error("OUTBOX MAX_ATTEMPTS must be >= 1", id="outbox.E002"))
    if not math.isfinite(s.backoff_base_seconds) or s.backoff_base_seconds < 0:
        errors.append(
            checks.Error(
                "OUTBOX BACKOFF_BASE_SECONDS must be a finite number >= 0", id="outbox.E003"
            )
        )
    if not math.isfinite(s.backoff_max_seconds) or s.backoff_max_seconds < s.backoff_base_seconds:
        errors.append(
            checks.Error(
                "OUTBOX BACKOFF_MAX_SECONDS must be a finite number >= BACKOFF_BASE_SECONDS",
                id="outbox.E004",
            )
        )
    if not (0 <= s.claim_seconds < math.inf):  # 0: a dead relay's events are due at once
        errors.append(
            checks.Error("OUTBOX CLAIM_SECONDS must be a finite number >= 0", id="outbox.E005")
        )
    if s.retention_days is not None and not (0 <= s.retention_days <= MAX_RETENTION_DAYS):
        errors.append(
            checks.Error(
                "OUTBOX RETENTION_DAYS must be a number of days from 0 to 36500 (or None: kept)",
                id="outbox.E006",
            )
        )
    return errors
