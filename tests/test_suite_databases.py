"""How the suite uses its databases (tests/conftest.py): which tests `make test`'s SQLite pass
leaves to its PostgreSQL pass, and the reset after a `transaction=True` test on PostgreSQL."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.test import TransactionTestCase

from tasks_engine.models import WorkflowRun
from tests.browser.rundata import make_run
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


@pytest.mark.postgres_only("the TRUNCATE it avoids is PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_the_reset_after_a_transactional_test_empties_every_table_as_flush_did() -> None:
    """Django's flush (pytest-django's reset) TRUNCATEs every table, which gives each one new
    files; the reset deletes the rows instead. What a test sees is the same: every table empty,
    the content types and permissions there again (post_migrate), the sequences not reset."""
    types, permissions = ContentType.objects.count(), Permission.objects.count()
    make_run("completed")
    before = User.objects.create(username="someone")
    files = relfilenodes()

    reset_as_after_a_transactional_test()

    assert not WorkflowRun.objects.exists()
    assert tables_with_rows() == {"django_content_type", "auth_permission"}
    assert (ContentType.objects.count(), Permission.objects.count()) == (types, permissions)
    assert relfilenodes() == files  # the same files: no TRUNCATE
    assert User.objects.create(username="someone").pk > before.pk  # flush kept sequences too


def reset_as_after_a_transactional_test() -> None:
    case = TransactionTestCase(methodName="__init__")
    case.databases = {"default"}
    case._fixture_teardown()  # type: ignore[attr-defined]


def tables_with_rows() -> set[str]:
    names = connection.introspection.django_table_names(only_existing=True, include_views=False)
    q = connection.ops.quote_name
    with connection.cursor() as cur:
        return {t for t in names if cur.execute(f"SELECT 1 FROM {q(t)} LIMIT 1").fetchone()}


def relfilenodes() -> dict[str, int]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT relname, relfilenode FROM pg_class WHERE relname = ANY(%s)",
            [["tasks_engine_workflowrun", "auth_user"]],
        )
        return dict(cur.fetchall())
