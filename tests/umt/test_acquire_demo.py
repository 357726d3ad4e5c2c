"""The newcomer's commands, as a fresh clone runs them: `manage.py demo` and `manage.py
serveadmin`, in subprocesses with the project's own settings and a new SQLite file."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import ROOT

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.one_db("a new SQLite file of its own on either pass"),
]


def project_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UMT_", "TASKS_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="umt.settings",  # the project's settings, not the tests'
        DATABASE_URL=f"sqlite:///{tmp_path / 'fresh.sqlite3'}",
        PYTHONUNBUFFERED="1",
    )
    return env


def test_demo_runs_the_acquisition_end_to_end(tmp_path: Path) -> None:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "demo", "--media", str(tmp_path / "media")],
        cwd=ROOT,
        env=project_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=110,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    for expected in [
        "planned #1 'Big Buck Bunny (2008)'",
        "the relay dispatched it: acquire run",
        "run    waiting (fact:download-done)",
        "downloader ran the hook: umt_download_done plan:1 -> delivered",
        "step   copy-file        function  #1 completed",
        "run    waiting (sleep:retention)",
        "step   cleanup          function  #1 completed",
        "run    completed",
        "worker stopped (exit 0)",
        "relay stopped (exit 0)",
    ]:
        assert expected in out, out
    assert re.search(r"\+\s*\d+\.\ds\s+copying \d+%", out), out  # progress as it goes
    library = tmp_path / "media" / "library" / "Big Buck Bunny (2008)"
    assert [p.name for p in library.iterdir()] == ["Big Buck Bunny (2008).mkv"]
    assert (library / "Big Buck Bunny (2008).mkv").stat().st_size == 24 * 1024 * 1024
    assert time.monotonic() - started < 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serveadmin_prints_a_login_that_works(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "serveadmin", "--addrport", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=project_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(2)]
        assert lines[0].strip() == f"admin:    http://127.0.0.1:{port}/admin/", lines
        login = re.match(r"login:\s+admin / (\S+)\s+\(created\)", lines[1])
        assert login, lines
        page = _get_when_up(f"http://127.0.0.1:{port}/admin/login/")
        assert "Log in" in page
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
        if proc.stdout:
            proc.stdout.close()
    again = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "serveadmin", "--no-serve", "--password", "pw"],
        cwd=ROOT,
        env=project_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "login:    admin / pw  (password reset)" in again.stdout, again.stderr


def _get_when_up(url: str, timeout: float = 20.0) -> str:
    end = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return str(resp.read().decode())
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.2)
