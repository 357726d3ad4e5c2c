"""System checks for UMT's settings (`settings.UMT`): refused at `manage.py check` and at a
worker's start, one line each, rather than by a cleanup or a login that misbehaves later."""

from __future__ import annotations

import math
from typing import Any

from django.core import checks

from .conf import umt_settings

QBITTORRENT_BAN_AFTER = 5  # qBittorrent's default WebUI\MaxAuthenticationFailCount


@checks.register()
def check_umt_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        s = umt_settings()
    except (TypeError, ValueError) as exc:
        return [checks.Error(f"UMT settings are invalid: {exc}", id="umt.E001")]
    q = s.qbittorrent
    problems = [
        (
            "umt.E002",
            not 1 <= q.login_attempts < QBITTORRENT_BAN_AFTER,
            f"UMT_QBITTORRENT_LOGIN_ATTEMPTS must be from 1 to {QBITTORRENT_BAN_AFTER - 1} "
            f"(qBittorrent bans an address after {QBITTORRENT_BAN_AFTER} failed logins), "
            f"not {q.login_attempts}",
        ),
        (
            "umt.E003",
            not _at_least(q.login_backoff_seconds, 0),
            "UMT_QBITTORRENT_LOGIN_BACKOFF_SECONDS must be a number of seconds >= 0, "
            f"not {q.login_backoff_seconds}",
        ),
        (
            "umt.E004",
            s.cleanup_attempts < 1,
            f"UMT_CLEANUP_ATTEMPTS must be at least 1, not {s.cleanup_attempts}",
        ),
        (
            "umt.E005",
            not (math.isfinite(s.cleanup_retry_seconds) and s.cleanup_retry_seconds > 0),
            f"UMT_CLEANUP_RETRY_SECONDS must be a number of seconds > 0, "
            f"not {s.cleanup_retry_seconds}",
        ),
        (
            "umt.E006",
            not _at_least(s.cleanup_retry_max_seconds, s.cleanup_retry_seconds),
            "UMT_CLEANUP_RETRY_MAX_SECONDS must be a number of seconds >= "
            f"UMT_CLEANUP_RETRY_SECONDS, not {s.cleanup_retry_max_seconds}",
        ),
    ]
    return [checks.Error(message, id=code) for code, bad, message in problems if bad]


def _at_least(value: float, low: float) -> bool:
    return math.isfinite(value) and value >= low
