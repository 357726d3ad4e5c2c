"""runrelay arguments and the OUTBOX system checks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.test import override_settings

from outbox.checks import check_settings
from tests.helpers import ROOT, database_url

pytestmark = pytest.mark.one_db("runrelay arguments and the OUTBOX checks")


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--batch", "0"], "argument --batch: must be a positive integer, got '0'"),
        (["--batch", "many"], "argument --batch: must be a positive integer, got 'many'"),
        (["--poll-interval", "-1"], "argument --poll-interval: must be a positive number"),
        (["--poll-interval", "nan"], "argument --poll-interval: must be a positive number"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_arguments_fail_with_one_line(args: list[str], complaint: str) -> None:
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run(
        [sys.executable, "manage.py", "runrelay", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and complaint in lines[0], done.stderr


def test_default_settings_pass_the_checks() -> None:
    assert check_settings() == []


@pytest.mark.parametrize(
    ("outbox", "error_id"),
    [
        ({"MAX_ATTEMPTS": "ten"}, "outbox.E001"),
        ({"MAX_ATTEMPTS": 0}, "outbox.E002"),
        ({"BACKOFF_BASE_SECONDS": -1}, "outbox.E003"),
        ({"BACKOFF_BASE_SECONDS": 10, "BACKOFF_MAX_SECONDS": 5}, "outbox.E004"),
        ({"CLAIM_SECONDS": -1}, "outbox.E005"),
        ({"CLAIM_SECONDS": float("nan")}, "outbox.E005"),
        ({"RETENTION_DAYS": -3}, "outbox.E006"),
    ],
)
def test_bad_settings_are_system_check_errors(outbox: dict, error_id: str) -> None:
    with override_settings(OUTBOX=outbox):
        assert [e.id for e in check_settings()] == [error_id]
