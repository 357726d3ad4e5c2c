"""Commands run as a shell outside this repository would run them, and the built distribution."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SOURCE_IGNORE = shutil.ignore_patterns(
    ".git", ".venv*", "site", "build", "dist", "*.egg-info", "__pycache__", "*.sqlite3*", "media"
)

# The environment of a shell outside this repository: not this test run's settings module.
OUTSIDE_ENV = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE",)}


def run(*cmd: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    """The command's stdout; it must exit 0."""
    return run_logged(*cmd, cwd=cwd, env=env)[0]


def run_logged(*cmd: str | Path, cwd: Path, env: dict[str, str] | None = None) -> tuple[str, str]:
    """The command's stdout and stderr (its logs); it must exit 0."""
    done = subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env={**OUTSIDE_ENV, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout, done.stderr


@dataclass(frozen=True)
class Dist:
    wheel: Path
    sdist: Path


@dataclass(frozen=True)
class FreshDatabase:
    """A new database for a fresh project: its URL, and for PostgreSQL its name and server."""

    url: str
    name: str | None = None  # None: SQLite
    host: str | None = None
    port: str | None = None
    user: str | None = None

    @property
    def postgresql(self) -> bool:
        return self.name is not None
