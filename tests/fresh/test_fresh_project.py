"""A Django team adopts the engine from outside this repository: build the wheel from
pyproject.toml, install it into a new virtualenv, `django-admin startproject`, add the two
apps, migrate, define a workflow in the new project's own app, enqueue it, run
`runworker --burst` and see the run complete. On the database of the pass (a new SQLite file,
or a new database on the same PostgreSQL server). Nothing of UMT is imported.

Slow-ish (a wheel build and a pip install, cached after the first time: about half a minute)."""

from __future__ import annotations

import json
import sqlite3
import sys
import textwrap
from contextlib import closing
from pathlib import Path

import pytest

from tests.helpers import ROOT

from .shell import Dist, FreshDatabase, run, run_logged

pytestmark = pytest.mark.slow

WORKFLOW = """
from datetime import timedelta

from pydantic import BaseModel

from tasks_engine import TaskContext, workflow


class GreetInput(BaseModel):
    name: str


@workflow(name="greet", input=GreetInput)
def greet(ctx: TaskContext) -> dict:
    hello = ctx.step.run("hello", lambda: f"hello {ctx.input.name}")
    ctx.step.sleep("pause", timedelta(seconds=0.2))
    shout = ctx.step.run("shout", lambda: hello.upper())
    return {"greeting": shout}
"""

SETTINGS_TAIL = """
import os
import environ

INSTALLED_APPS += ["tasks_engine", "outbox", "shop"]
DATABASES = {"default": environ.Env.db_url_config(os.environ["DATABASE_URL"])}
"""  # no OPTIONS on SQLite either: the engine sets what it needs (BEGIN IMMEDIATE, WAL, ...)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, dist: Dist) -> Path:
    """A new virtualenv holding the wheel built from this repository's pyproject.toml."""
    base = tmp_path_factory.mktemp("fresh")
    run(sys.executable, "-m", "venv", base / "venv", cwd=base)
    pip = base / "venv" / "bin" / "pip"
    run(pip, "install", "--quiet", "--disable-pip-version-check", dist.wheel, cwd=base)
    return base / "venv"


@pytest.fixture
def database_url(fresh_database: FreshDatabase) -> str:
    return fresh_database.url


def test_a_fresh_project_runs_a_workflow_from_the_installed_wheel(
    venv: Path, database_url: str, tmp_path: Path
) -> None:
    bin_ = venv / "bin"
    metadata = run(bin_ / "pip", "show", "django-tasks-engine", cwd=tmp_path)
    assert "Name: django-tasks-engine" in metadata and "Summary: Durable workflows" in metadata
    site = Path(
        run(
            bin_ / "python", "-c", "import tasks_engine; print(tasks_engine.__file__)", cwd=tmp_path
        ).strip()
    ).parent
    assert (site / "py.typed").exists() and (site.parent / "outbox" / "py.typed").exists()
    assert str(ROOT) not in str(site)  # the installed copy, not this repository

    run(bin_ / "django-admin", "startproject", "mysite", tmp_path / "proj", cwd=tmp_path)
    proj = tmp_path / "proj"
    run(bin_ / "python", "manage.py", "startapp", "shop", cwd=proj)
    (proj / "shop" / "workflows.py").write_text(WORKFLOW)
    with open(proj / "mysite" / "settings.py", "a") as f:
        f.write(SETTINGS_TAIL)
    env = {"DATABASE_URL": database_url, "PYTHONPATH": ""}
    manage = (bin_ / "python", "manage.py")

    assert "no issues" in run(*manage, "check", cwd=proj, env=env)  # no W026 without OPTIONS
    run(*manage, "migrate", "--noinput", cwd=proj, env=env)
    enqueued = json.loads(
        run(
            *manage,
            "tasks",
            "enqueue",
            "greet",
            "--input",
            '{"name": "ada"}',
            "--json",
            cwd=proj,
            env=env,
        )
    )
    _, logged = run_logged(
        *manage, "runworker", "--burst", "--poll-interval", "0.1", cwd=proj, env=env
    )
    # startproject's settings configure no logging: the engine prints its events itself, one
    # JSON object a line on stderr (docs/logging.md)
    events = [json.loads(line) for line in logged.splitlines() if line.startswith("{")]
    started = next(e for e in events if e["event"] == "worker started")
    assert started["logger"] == "tasks_engine" and started["level"] == "info", started
    assert "worker stopped" in [e["event"] for e in events]
    view = json.loads(
        run(*manage, "tasks", "inspect", enqueued["run_id"], "--json", cwd=proj, env=env)
    )
    assert view["status"] == "completed", view
    assert view["output"] == {"greeting": "HELLO ADA"}
    if database_url.startswith("sqlite:"):  # the engine switched the file to WAL
        with closing(sqlite3.connect(database_url.removeprefix("sqlite:///"))) as db:
            assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert [(s["name"], s["kind"], s["status"]) for s in view["steps"]] == [
        ("hello", "function", "completed"),
        ("pause", "sleep", "completed"),
        ("shout", "function", "completed"),
    ]
    imported = run(
        bin_ / "python",
        "-c",
        textwrap.dedent("""
            import sys, django
            django.setup()
            from django.core.management import call_command
            print(sorted(m for m in sys.modules if m.split('.')[0] == 'umt'))
        """),
        cwd=proj,
        env={**env, "DJANGO_SETTINGS_MODULE": "mysite.settings"},
    )
    assert imported.strip() == "[]"
