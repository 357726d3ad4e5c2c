"""docs/SCALING.md stays true: every TASKS_ENGINE key it names is one the engine reads, every
file it cites exists, every check id is one the engine reports, every `manage.py` option it
shows exists, and the trigger and error text its reasoning quotes are the engine's own."""

from __future__ import annotations

import re

import pytest
from django.core.management import load_command_class

from tasks_engine.conf import KNOWN_KEYS
from tests.helpers import ROOT

pytestmark = pytest.mark.one_db("reads the docs and the code")

PAGE = (ROOT / "docs" / "SCALING.md").read_text()
# The contract's partitioned history ("Contract: where the engine's tables live"), which the
# engine reads once that work lands; the page describes it per the contract until then.
CONTRACT_KEYS = {"PARTITION"}


def test_every_tasks_engine_key_on_the_page_is_one_the_engine_reads() -> None:
    keys = set(re.findall(r'TASKS_ENGINE\["([A-Z_]+)"\]', PAGE))
    assert {"DATABASE", "ADMIN_READ_DATABASE", "PREPARED_STATEMENTS", "LISTEN_URL"} <= keys
    assert keys <= KNOWN_KEYS | CONTRACT_KEYS, sorted(keys - KNOWN_KEYS - CONTRACT_KEYS)


def test_every_file_the_page_cites_exists() -> None:
    paths = set(re.findall(r"`((?:bench|tests|tasks_engine)/[\w/.]+\.py)[` ]", PAGE))
    assert {"bench/history.py", "tests/faults/test_admin_replica.py"} <= paths
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, missing


def test_every_check_id_on_the_page_is_one_the_engine_reports() -> None:
    source = (ROOT / "tasks_engine" / "checks.py").read_text()
    for check_id in set(re.findall(r"tasks_engine\.([EW]\d{3})", PAGE)):
        assert f'"tasks_engine.{check_id}"' in source, check_id


def test_every_manage_py_option_on_the_page_exists() -> None:
    commands = re.findall(r"manage\.py (migrate|runworker)([^`\n]*)", PAGE)
    assert commands
    for command, rest in commands:
        app = "django.core" if command == "migrate" else "tasks_engine"
        parser = load_command_class(app, command).create_parser("manage.py", command)
        known = {o for a in parser._actions for o in a.option_strings}
        used = set(re.findall(r"(?<![\w-])(--[a-z-]+)", rest))
        assert used <= known, (command, sorted(used - known))


def test_the_names_its_reasoning_quotes_are_the_engines() -> None:
    migrations = "".join(
        p.read_text() for p in (ROOT / "tasks_engine" / "migrations").glob("0*.py")
    )
    assert (
        "tasks_engine_run_ended" in PAGE and "CREATE TRIGGER tasks_engine_run_ended" in migrations
    )
    router = "tasks_engine.db.routers.EngineRouter"
    assert router in PAGE and (ROOT / "tasks_engine" / "db" / "routers.py").exists()
    assert "class EngineRouter" in (ROOT / "tasks_engine" / "db" / "routers.py").read_text()
    claims = (ROOT / "tasks_engine" / "db" / "sql.py").read_text()
    assert "FOR UPDATE SKIP LOCKED" in PAGE and "FOR UPDATE SKIP LOCKED" in claims
