"""manage.py check refuses UMT settings that would make a cleanup or a login misbehave at run
time (umt/checks.py): one line each, naming the environment variable."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings as django_settings

from umt.checks import check_umt_settings


def configured(settings: Any, qbittorrent: dict[str, Any] | None = None, **umt: Any) -> None:
    base = django_settings.UMT
    settings.UMT = {**base, **umt, "QBITTORRENT": {**base["QBITTORRENT"], **(qbittorrent or {})}}


def test_the_defaults_pass() -> None:
    assert check_umt_settings() == []


@pytest.mark.parametrize(
    ("umt", "qbittorrent", "variable"),
    [
        ({}, {"LOGIN_ATTEMPTS": 0}, "UMT_QBITTORRENT_LOGIN_ATTEMPTS"),
        ({}, {"LOGIN_ATTEMPTS": 5}, "UMT_QBITTORRENT_LOGIN_ATTEMPTS"),
        ({}, {"LOGIN_BACKOFF_SECONDS": -1}, "UMT_QBITTORRENT_LOGIN_BACKOFF_SECONDS"),
        ({"CLEANUP_ATTEMPTS": 0}, {}, "UMT_CLEANUP_ATTEMPTS"),
        ({"CLEANUP_RETRY_SECONDS": 0}, {}, "UMT_CLEANUP_RETRY_SECONDS"),
        ({"CLEANUP_RETRY_MAX_SECONDS": float("nan")}, {}, "UMT_CLEANUP_RETRY_MAX_SECONDS"),
        ({"CLEANUP_RETRY_MAX_SECONDS": 1}, {}, "UMT_CLEANUP_RETRY_MAX_SECONDS"),
    ],
)
def test_a_bad_value_is_one_error_naming_its_variable(
    settings: Any, umt: dict[str, Any], qbittorrent: dict[str, Any], variable: str
) -> None:
    configured(settings, qbittorrent, **umt)
    [error] = check_umt_settings()
    assert error.id.startswith("umt.E") and variable in error.msg and "\n" not in error.msg
