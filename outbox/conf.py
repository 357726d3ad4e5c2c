"""OUTBOX settings with typed defaults, and the retry backoff they define."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings


@dataclass(frozen=True)
class OutboxSettings:
    max_attempts: int = 10
    backoff_base_seconds: float = 1.0
    backoff_max_seconds: float = 300.0
    # How long a claimed event stays hidden from other relays; after a relay dies mid-batch
    # its events are due again once this passes (only routes known to have started spent an
    # attempt: see relay_once).
    claim_seconds: float = 60.0
    # Dispatched events are pruned this many days after dispatch (None: kept for ever).
    retention_days: float | None = 7.0

    @property
    def retention(self) -> timedelta | None:
        return None if self.retention_days is None else timedelta(days=self.retention_days)

    def backoff(self, attempts: int) -> timedelta:
        """Delay before the next attempt after `attempts` failed ones: base * 2**(n-1), capped."""
        exponent = min(max(attempts - 1, 0), 64)  # 2**64 * base already exceeds any sane cap
        seconds = min(self.backoff_base_seconds * 2**exponent, self.backoff_max_seconds)
        return timedelta(seconds=seconds)


def outbox_settings() -> OutboxSettings:
    raw = getattr(settings, "OUTBOX", {}) or {}
    return OutboxSettings(
        max_attempts=int(raw.get("MAX_ATTEMPTS", 10)),
        backoff_base_seconds=float(raw.get("BACKOFF_BASE_SECONDS", 1.0)),
        backoff_max_seconds=float(raw.get("BACKOFF_MAX_SECONDS", 300)),
        claim_seconds=float(raw.get("CLAIM_SECONDS", 60)),
        retention_days=_optional_float(raw.get("RETENTION_DAYS", 7.0)),
    )


def _optional_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]
