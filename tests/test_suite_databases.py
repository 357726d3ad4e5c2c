"""How the suite uses its databases (tests/conftest.py): which tests `make test`'s SQLite pass
leaves to its PostgreSQL pass."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

SAMPLE = "tests/db_passes_sample.py"
ALL_FOUR = {
    "test_unmarked",
    "test_one_db",
    "TestOneDbClass::test_in_a_one_db_class",
    "TestOneDbClass::test_both_dbs_in_a_one_db_class",
}


def outcomes(tmp_path: Path, database_url: str, **env: str) -> dict[str, set[str]]:
    """Run the sample module in a new pytest: the tests that passed and those skipped."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", SAMPLE, "-v", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url, "ONE_DB_TESTS_ON_PG": "", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    found: dict[str, set[str]] = {"PASSED": set(), "SKIPPED": set()}
    for name, outcome in re.findall(rf"{re.escape(SAMPLE)}::(\S+) (PASSED|SKIPPED)", proc.stdout):
        found[outcome].add(name)
    assert found["PASSED"] | found["SKIPPED"] == ALL_FOUR, proc.stdout + proc.stderr
    return found


@pytest.mark.one_db("runs pytest on a sample, on SQLite and PostgreSQL URLs of its own")
def test_make_tests_sqlite_pass_leaves_only_one_db_tests_to_the_postgresql_pass(
    tmp_path: Path,
) -> None:
    sqlite = f"sqlite:///{tmp_path / 'sample.sqlite3'}"
    second_pass = outcomes(tmp_path, sqlite, ONE_DB_TESTS_ON_PG="1")
    assert second_pass["SKIPPED"] == {"test_one_db", "TestOneDbClass::test_in_a_one_db_class"}
    # without the PostgreSQL pass (make test-sqlite, test-fast, a plain pytest): every test
    assert outcomes(tmp_path, sqlite)["PASSED"] == ALL_FOUR
