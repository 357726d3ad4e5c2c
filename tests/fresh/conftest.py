"""The distribution built once per session from this repository's pyproject.toml (PEP 517),
for the tests that read it (test_wheel.py) and install it (test_fresh_project.py,
test_quickstart.py), and a new, empty database of the pass's kind for each fresh project."""

from __future__ import annotations

import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.conf import settings

from tests.helpers import ROOT

from .shell import SOURCE_IGNORE, Dist, FreshDatabase, run


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """The sdist, and the wheel built from it (`python -m build`: what a release uploads), from
    a copy of the repository's tracked tree (the build writes into its source tree)."""
    base = tmp_path_factory.mktemp("dist")
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=SOURCE_IGNORE)
    run(sys.executable, "-m", "build", "--outdir", base / "dist", source, cwd=base)
    (wheel,) = (base / "dist").glob("django_tasks_engine-*.whl")
    (sdist,) = (base / "dist").glob("django_tasks_engine-*.tar.gz")
    return Dist(wheel=wheel, sdist=sdist)


@pytest.fixture
def fresh_database(tmp_path: Path) -> Iterator[FreshDatabase]:
    """A new, empty database of the pass's kind: an SQLite file not yet made, or a database
    created on the pass's PostgreSQL server and dropped afterwards."""
    yield from _new_database(tmp_path, create=True)


@pytest.fixture
def fresh_database_to_create(tmp_path: Path) -> Iterator[FreshDatabase]:
    """As fresh_database, but the PostgreSQL database is not created: the test's commands
    create it (`createdb`). Dropped afterwards if it exists."""
    yield from _new_database(tmp_path, create=False)


def _new_database(tmp_path: Path, *, create: bool) -> Iterator[FreshDatabase]:
    db = settings.DATABASES["default"]
    if db["ENGINE"] == "django.db.backends.sqlite3":
        yield FreshDatabase(url=f"sqlite:///{tmp_path / 'fresh.sqlite3'}")
        return
    name = f"fresh_{uuid.uuid4().hex[:12]}"
    host, port, user = db["HOST"] or "127.0.0.1", str(db["PORT"] or 5432), db["USER"]
    server = f"postgres://{user}@{host}:{port}"
    if create:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    yield FreshDatabase(url=f"{server}/{name}", name=name, host=host, port=port, user=user)
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
