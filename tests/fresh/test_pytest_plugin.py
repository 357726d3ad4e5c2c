"""The pytest plugin as a Django team gets it: install the wheel built from pyproject.toml and
pytest-django into a new virtualenv, write a fresh project whose tests use the fixtures
`tasks_tester` and `tasks_clock` (no conftest, no `-p`: pytest finds the plugin by the
distribution's `pytest11` entry point), and run pytest in a subprocess on the database of the
pass (a new SQLite file, or a new database on the same PostgreSQL server). One test of the
project fails on purpose: its output shows what `assert_enqueued` says when the run it expects
was not enqueued. A project without Django settings runs its own tests with the plugin loaded.

Slow-ish (a wheel build and a pip install, about half a minute)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.conf import settings

from tests.helpers import ROOT

from .shell import OUTSIDE_ENV, Dist, run

pytestmark = pytest.mark.slow

PAGE = (ROOT / "docs" / "testing.md").read_text()


def page_block(first_line: str) -> str:
    """The ```python block of docs/testing.md that starts with `first_line`."""
    (block,) = [
        b.split("```", 1)[0] for b in PAGE.split("```python\n")[1:] if b.startswith(first_line)
    ]
    return block


WORKFLOWS = page_block("# shop/workflows.py\n")
# The page's tests, and two more: a transactional test, and one that fails on purpose.
TESTS = (
    page_block("# shop/tests.py\n")
    + """

def test_in_a_transactional_test_too(transactional_db, tasks_tester):
    run = tasks_tester.start(send_welcome, {"email": "eve@example.com"})
    assert tasks_tester.run_to_completion(run).status == "completed"


def test_a_sign_up_that_enqueues_nothing_fails(tasks_tester):  # fails on purpose
    sign_up("ada@example.com")
    tasks_tester.assert_enqueued(send_welcome, {"email": "bob@example.com"})
"""
)

SETTINGS_TAIL = """
import os
import environ

INSTALLED_APPS += ["tasks_engine", "shop"]
DATABASES = {"default": environ.Env.db_url_config(os.environ["DATABASE_URL"])}
"""

PYTEST_INI = """
[pytest]
DJANGO_SETTINGS_MODULE = mysite.settings
"""

FAILURE = (
    "AssertionError: expected at least 1 run of 'send-welcome' with input"
    " {'email': 'bob@example.com'}, found 0; the runs of 'send-welcome':"
    " input {'email': 'ada@example.com'} (pending, queue 'default')"
)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, dist: Dist) -> Path:
    """A new virtualenv holding the wheel built from this repository, pytest and pytest-django."""
    base = tmp_path_factory.mktemp("plugin")
    run(sys.executable, "-m", "venv", base / "venv", cwd=base)
    pip = base / "venv" / "bin" / "pip"
    run(pip, "install", "--quiet", dist.wheel, "pytest>=8", "pytest-django>=4.9", cwd=base)
    return base / "venv"


@pytest.fixture
def database_url(tmp_path: Path) -> Iterator[str]:
    """A new, empty database of the pass's kind (pytest-django makes its test database from
    it: an in-memory one on SQLite, `test_<name>` on PostgreSQL)."""
    db = settings.DATABASES["default"]
    if db["ENGINE"] == "django.db.backends.sqlite3":
        yield f"sqlite:///{tmp_path / 'plugin.sqlite3'}"
        return
    name = f"plugin_{uuid.uuid4().hex[:12]}"
    server = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield f"{server}/{name}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'DROP DATABASE IF EXISTS "test_{name}" WITH (FORCE)')


def pytest_run(venv: Path, cwd: Path, *args: str, env: dict[str, str]) -> tuple[int, str]:
    """Run the venv's pytest as a shell in `cwd` would: its exit code and its output."""
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env={**OUTSIDE_ENV, "PYTHONPATH": "", **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def test_a_fresh_project_tests_its_workflows_with_the_plugins_fixtures(
    venv: Path, database_url: str, tmp_path: Path
) -> None:
    bin_ = venv / "bin"
    run(bin_ / "django-admin", "startproject", "mysite", tmp_path / "proj", cwd=tmp_path)
    proj = tmp_path / "proj"
    run(bin_ / "python", "manage.py", "startapp", "shop", cwd=proj)
    (proj / "shop" / "workflows.py").write_text(WORKFLOWS)
    (proj / "shop" / "tests.py").write_text(TESTS)
    (proj / "pytest.ini").write_text(PYTEST_INI)
    with open(proj / "mysite" / "settings.py", "a") as f:
        f.write(SETTINGS_TAIL)
    env = {"DATABASE_URL": database_url}

    code, out = pytest_run(venv, proj, "-rA", "shop/tests.py", env=env)
    assert code == 1, out  # the one failure on purpose, nothing else
    plugins = next(line for line in out.splitlines() if line.startswith("plugins:"))
    assert "django-tasks-engine-" in plugins and "django-" in plugins, plugins  # entry points
    assert "1 failed, 4 passed" in out, out
    assert "FAILED shop/tests.py::test_a_sign_up_that_enqueues_nothing_fails" in out, out
    assert FAILURE in out, out
    assert FAILURE.removeprefix("AssertionError: ") in PAGE  # the page shows it as it is
    # The failure's traceback shows the test's line, not the engine's frames.
    assert 'tasks_tester.assert_enqueued(send_welcome, {"email": "bob' in out, out
    assert "tasks_engine/testing" not in out, out

    code, out = pytest_run(venv, proj, "shop/tests.py", "-k", "not enqueues_nothing", "-q", env=env)
    assert code == 0 and "4 passed" in out, out


def test_a_project_that_does_not_use_the_plugin_runs_its_tests_as_before(
    venv: Path, tmp_path: Path
) -> None:
    """No Django settings, no database: the plugin is loaded (its fixtures are listed) and
    stays out of the way; a test that asks for its tester there is skipped by pytest-django
    (whose `db` it needs), as a test that asks for `db` is."""
    (tmp_path / "test_plain.py").write_text(
        "def test_arithmetic():\n    assert 1 + 1 == 2\n\n\n"
        "def test_asks_for_the_tester(tasks_tester):\n    pass\n"
    )
    code, out = pytest_run(venv, tmp_path, "-rA", "test_plain.py", env={})
    assert "1 passed, 1 skipped" in out and "no Django settings" in out, out
    assert code == 0
    assert "PASSED test_plain.py::test_arithmetic" in out, out
    code, out = pytest_run(venv, tmp_path, "--fixtures", "test_plain.py", env={})
    assert code == 0 and "tasks_tester" in out and "tasks_clock" in out, out
    code, out = pytest_run(venv, tmp_path, "-p", "no:tasks_engine", "--fixtures", env={})
    assert code == 0 and "tasks_tester" not in out, out  # docs/testing.md: how to turn it off
