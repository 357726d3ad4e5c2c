"""How the suite uses its databases (tests/conftest.py): which tests `make test`'s SQLite pass
leaves to its PostgreSQL pass, the reset after a `transaction=True` test on PostgreSQL, and
how `make test` runs its parts at once."""

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


@pytest.mark.one_db("runs a shell script")
def test_the_parts_of_make_test_run_at_once_and_each_output_is_printed_whole(
    tmp_path: Path,
) -> None:
    """scripts/at-once: each part's lines together under its header (never interleaved with
    another's), and the exit status fails when any part fails, naming it."""
    slow_ok = "for i in 1 2 3; do echo ok-$i; sleep 0.2; done"
    quick_bad = "for i in 1 2 3; do echo bad-$i; sleep 0.1; done; exit 3"
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "at-once"), "ok", slow_ok, "bad", quick_bad],
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "failed: bad (exit 3)" in done.stderr
    out = done.stdout
    bad, ok = out.index("======== bad: exit 3"), out.index("======== ok: exit 0")
    assert bad < ok  # printed as each part ends
    assert out[bad:ok].split("\n")[1:4] == ["bad-1", "bad-2", "bad-3"]
    assert out[ok:].split("\n")[1:4] == ["ok-1", "ok-2", "ok-3"]
    passing = subprocess.run(
        ["bash", str(ROOT / "scripts" / "at-once"), "a", "true", "b", "echo b"],
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert passing.returncode == 0, passing.stdout + passing.stderr


@pytest.mark.one_db("reads the Makefile")
def test_the_two_parts_of_the_postgresql_pass_are_test_pgs_tests_each_once() -> None:
    """test-pg-tiers names the tier paths, test-pg-rest ignores exactly those."""
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", "test-pg-tiers", "test-pg-rest", "STAMP="],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    tiers_cmd, rest_cmd = done.stdout.replace("\\\n", " ").split("pytest")[1:3]
    tiers = [word for word in tiers_cmd.split() if word.startswith("tests/")]
    ignored = re.findall(r"--ignore=(\S+)", rest_cmd)
    assert tiers and tiers == ignored
    assert "TEST_DATABASE_SUFFIX=" in done.stdout.split("pytest")[0]
