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
# Worker processes of the process tests that wait for a death to be noticed (a killed or
# stalled worker, a killed leader): short periods, so the wait is seconds, not the defaults'
# ten (dead worker) and five (leader lease). tests.helpers.SHORT_PERIODS.
if os.environ.get("TEST_DEAD_WORKER_SECONDS"):
    TASKS_ENGINE["DEAD_WORKER_SECONDS"] = float(os.environ["TEST_DEAD_WORKER_SECONDS"])
if os.environ.get("TEST_LEADER_LEASE_SECONDS"):
    TASKS_ENGINE["LEADER_LEASE_SECONDS"] = float(os.environ["TEST_LEADER_LEASE_SECONDS"])
# ... and SQLite's busy timeout, which a silent child's allowance includes, short.
if os.environ.get("TEST_SQLITE_TIMEOUT") and DATABASES["default"]["ENGINE"].endswith("sqlite3"):  # noqa: F405
    DATABASES["default"]["OPTIONS"]["timeout"] = float(os.environ["TEST_SQLITE_TIMEOUT"])  # noqa: F405
# make test runs its PostgreSQL pass in two parts at once (the Makefile's PG_OWN_SERVER_TIERS):
# the second gets a test database of its own, test_<name>_<suffix>.
if os.environ.get("TEST_DATABASE_SUFFIX") and DATABASES["default"]["ENGINE"].endswith("postgresql"):  # noqa: F405
    _default = DATABASES["default"]  # noqa: F405
    _default.setdefault("TEST", {})["NAME"] = (
        f"test_{_default['NAME']}_{os.environ['TEST_DATABASE_SUFFIX']}"
    )
# The whole suite on partitioned run tables (docs/DATABASES.md, "Partitions"): TASKS_PARTITION=month
# (or week) on a PostgreSQL pass converts the test database's tables after its migrations. Only
# where the engine's tables are on PostgreSQL: a worker a test starts on an SQLite engine
# database (TASKS_DATABASE_URL) inherits the variable.
_engine_db = DATABASES[str(TASKS_ENGINE.get("DATABASE", "default"))]  # noqa: F405
if os.environ.get("TASKS_PARTITION") and _engine_db["ENGINE"].endswith("postgresql"):
    TASKS_ENGINE["PARTITION"] = os.environ["TASKS_PARTITION"]
