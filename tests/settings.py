"""Test settings: the project's, plus a test app with workflows and a side-effect table."""

import json
import os

from umt.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]  # noqa: F405
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Flow-control limits for worker processes started by tests (tests/process/test_flow.py).
TASKS_ENGINE = {**TASKS_ENGINE, "QUEUES": json.loads(os.environ.get("TEST_TASKS_QUEUES") or "{}")}  # noqa: F405
# The relay processes of tests/process/test_outbox_relay.py: OUTBOX["MAX_ATTEMPTS"] set low.
if os.environ.get("TEST_OUTBOX_MAX_ATTEMPTS"):
    OUTBOX = {**OUTBOX, "MAX_ATTEMPTS": int(os.environ["TEST_OUTBOX_MAX_ATTEMPTS"])}  # noqa: F405
