"""The distribution built once per session from this repository's pyproject.toml (PEP 517),
for the tests that read it (test_wheel.py) and install it (test_fresh_project.py)."""

from __future__ import annotations

import shutil
import sys

import pytest

from tests.helpers import ROOT

from .shell import SOURCE_IGNORE, Dist, run


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
