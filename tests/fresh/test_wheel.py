"""What `pip install django-tasks-engine` puts into site-packages: the engine and its outbox,
with their SQL, templates, static files and type information, and nothing of UMT (this
repository's own project). The wheel and sdist pass `twine check` (their metadata renders on
PyPI) and say the version tasks_engine.__version__ says."""

from __future__ import annotations

import sys
import tarfile
import zipfile

import pytest

import tasks_engine
from tests.helpers import ROOT

from .shell import Dist, run

pytestmark = [pytest.mark.slow, pytest.mark.one_db("reads the built wheel: no database")]


def wheel_files(dist: Dist) -> set[str]:
    with zipfile.ZipFile(dist.wheel) as wheel:
        return set(wheel.namelist())


def test_the_wheel_holds_the_engine_and_the_outbox_only(dist: Dist) -> None:
    files = wheel_files(dist)
    info = f"django_tasks_engine-{tasks_engine.__version__}.dist-info/"
    top_level = {name.split("/")[0] for name in files if not name.startswith(info)}
    assert top_level == {"tasks_engine", "outbox"}, sorted(top_level)
    assert not [name for name in files if name.startswith(("umt/", "tests/", "bench/"))]


def test_the_wheel_holds_sql_templates_static_files_and_type_information(dist: Dist) -> None:
    files = wheel_files(dist)
    for name in ("postgresql.sql", "sqlite.sql"):
        assert f"tasks_engine/db/queries/{name}" in files
    assert "tasks_engine/py.typed" in files and "outbox/py.typed" in files
    templates = {
        path.relative_to(ROOT).as_posix()
        for app in ("tasks_engine", "outbox")
        for path in (ROOT / app).glob("templates/**/*.html")
    }
    assert templates and templates <= files, sorted(templates - files)
    migrations = {
        path.relative_to(ROOT).as_posix()
        for app in ("tasks_engine", "outbox")
        for path in (ROOT / app / "migrations").glob("0*.py")
    }
    assert migrations <= files, sorted(migrations - files)


def test_one_version_names_the_wheel_the_sdist_and_the_package(dist: Dist) -> None:
    version = tasks_engine.__version__
    assert dist.wheel.name.startswith(f"django_tasks_engine-{version}-")
    assert dist.sdist.name == f"django_tasks_engine-{version}.tar.gz"
    with zipfile.ZipFile(dist.wheel) as wheel:
        metadata = wheel.read(f"django_tasks_engine-{version}.dist-info/METADATA").decode()
    assert f"\nVersion: {version}\n" in metadata
    assert f"## {version}" in (ROOT / "CHANGELOG.md").read_text()


def test_the_sdist_builds_the_wheel_without_umt(dist: Dist) -> None:
    """The wheel is built from the sdist (`python -m build`), so the sdist holds what the
    wheel needs; UMT may travel in the sdist as source, never into the wheel."""
    with tarfile.open(dist.sdist) as sdist:
        names = sdist.getnames()
    root = dist.sdist.name.removesuffix(".tar.gz")
    assert f"{root}/tasks_engine/db/queries/postgresql.sql" in names
    assert f"{root}/CHANGELOG.md" in names


def test_twine_check_passes(dist: Dist) -> None:
    out = run(sys.executable, "-m", "twine", "check", "--strict", dist.wheel, dist.sdist, cwd=ROOT)
    assert out.count("PASSED") == 2, out
