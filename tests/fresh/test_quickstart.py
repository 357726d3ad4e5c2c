"""docs/quickstart.md is this test. Every fenced block on the page carries a marker (an HTML
comment, invisible on the site) saying what the test does with it:

- `run [postgresql|sqlite]`: the commands, as they are written, in one bash shell that runs
  the whole page in order (on that database only, when one is named);
- `append PATH [postgresql|sqlite]`, `write PATH`: the block's text, added to or written as
  the file PATH of the new project;
- `output`: what the `run` block above it prints: each line, where `…` stands for anything,
  must match a line of that output, in order;
- `server`: the development server, started after the shell ends; the test logs in to the
  admin over HTTP as the user the page created and reads the runs' pages;
- `skip (why)`: not run.

The shell starts in a new directory holding the wheel built from this repository (what the
page's first section asks the reader to do), with this test's Python first on PATH as
`python3`. The test changes two things only: the PostgreSQL database's name (`mysite` on the
page, a new database of its own here) and the address `runserver` listens on (a free port).

On the database of the pass: SQLite, or PostgreSQL on the pass's server (which must be the one
the page names). Slow: a virtualenv, a pip install and a dozen manage.py commands (a minute or
two)."""

from __future__ import annotations

import http.cookiejar
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import ROOT, wait_for
from tests.pgcluster import free_port

from .shell import OUTSIDE_ENV, Dist, FreshDatabase

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PAGE = ROOT / "docs" / "quickstart.md"
MARKED = re.compile(
    r"^<!-- quickstart: (?P<marker>.+?) -->\n\n```(?P<lang>\w+)[^\n]*\n(?P<text>.*?)^```$",
    re.MULTILINE | re.DOTALL,
)
DATABASES = ("postgresql", "sqlite")
BLOCK_START = "@@@ quickstart block {} at $EPOCHREALTIME @@@"  # bash 5: the time, in seconds


@dataclass(frozen=True)
class Block:
    index: int
    action: str  # run, append, write, output, server, skip
    path: str | None  # append and write: the project's file
    only: str | None  # "postgresql" or "sqlite": that database's pass alone
    text: str

    def applies_to(self, database: str) -> bool:
        return self.only in (None, database)


def page_blocks(page: str) -> list[Block]:
    """The page's fenced blocks with their markers; every fenced block has one."""
    blocks = []
    for index, m in enumerate(MARKED.finditer(page)):
        words = m["marker"].split()
        action, rest = words[0], words[1:]
        path = None
        if action in ("append", "write"):
            path, rest = rest[0], rest[1:]
        elif action == "skip":
            assert rest, f"block {index}: say why it is skipped"
            rest = []
        else:
            assert action in ("run", "output", "server"), f"unknown marker {m['marker']!r}"
        only = rest[0] if rest else None
        assert only in (None, *DATABASES) and len(rest) <= 1, f"bad marker {m['marker']!r}"
        blocks.append(Block(index, action, path, only, m["text"]))
    fences = re.findall(r"^```\w", page, re.MULTILINE)
    assert len(fences) == len(blocks), (
        f"{len(fences)} fenced blocks on the page, {len(blocks)} marked: mark each one"
        " (<!-- quickstart: ... --> and a blank line before it)"
    )
    return blocks


def for_database(block: Block, db: FreshDatabase) -> str:
    """The block's text on this pass: on PostgreSQL, the page's database `mysite` is this
    test's new database, on the server the page names."""
    if block.only != "postgresql":
        return block.text
    assert db.name is not None
    page_server = re.search(
        r'"USER": "(.*?)".*"HOST": "(.*?)",\s*"PORT": "(.*?)"', block.text, re.S
    )
    if page_server is not None:
        assert page_server.groups() == (db.user, db.host, db.port), (
            f"the page's PostgreSQL server {page_server.groups()} is not the pass's"
            f" {(db.user, db.host, db.port)}"
        )
    text, renamed = re.subn(r"\bmysite\b", db.name, block.text)
    assert renamed == 1, block.text
    return text


def shell_script(blocks: list[Block], db: FreshDatabase, database: str) -> str:
    lines = ["set -eo pipefail", "set -x"]
    for block in blocks:
        if not block.applies_to(database) or block.action in ("output", "skip", "server"):
            continue
        lines.append(f'echo "{BLOCK_START.format(block.index)}"')
        text = for_database(block, db)
        if block.action == "run":
            lines.append(text)
        else:
            assert block.path is not None and "QUICKSTART_EOF" not in text
            redirect = ">>" if block.action == "append" else ">"
            lines.append(f"cat {redirect} {block.path} <<'QUICKSTART_EOF'\n{text}QUICKSTART_EOF")
    lines.append(f'echo "{BLOCK_START.format("end")}"')
    return "\n".join(lines) + "\n"


def outputs_by_block(stdout: str) -> tuple[dict[int, str], dict[int | str, float]]:
    """What each block printed, and when it started (seconds since the epoch; "end": when
    the last one ended)."""
    parts = re.split(r"^@@@ quickstart block (\d+|end) at ([\d.,]+) @@@$", stdout, flags=re.M)
    assert len(parts) >= 4 and parts[-3] == "end", stdout[-2000:]
    names = [int(n) if n != "end" else n for n in parts[1::3]]
    started = {n: float(t.replace(",", ".")) for n, t in zip(names, parts[2::3], strict=True)}
    outputs = dict(zip(names[:-1], parts[3:-3:3], strict=True))
    return {int(n): out for n, out in outputs.items()}, started


def report_times(
    database: str, took: float, started: dict[int | str, float], blocks: list[Block]
) -> None:
    """How long the page took, block by block (printed with `pytest -s`; never asserted)."""
    first = min(started.values())
    print(f"\nquickstart on {database}: the page's shell took {took:.1f} s")
    for block in blocks:
        if block.index in started:
            heading = block.text.strip().splitlines()[0][:70]
            print(f"  {started[block.index] - first:6.1f} s  block {block.index}: {heading}")
    print(f"  {started['end'] - first:6.1f} s  end")


def expected_line(line: str) -> re.Pattern[str]:
    parts = [r"\s+".join(map(re.escape, piece.split())) for piece in line.strip().split("…")]
    return re.compile(r"\s*" + ".*?".join(parts) + r"\s*")


def assert_shows(expected: str, actual: str, where: str) -> None:
    """Each line of `expected` matches a line of `actual`, in order (`…`: anything)."""
    lines = actual.splitlines()
    at = 0
    for line in expected.splitlines():
        pattern = expected_line(line)
        while at < len(lines) and not pattern.fullmatch(lines[at]):
            at += 1
        assert at < len(lines), f"{where}: no line {line!r} (in order) in:\n{actual}"
        at += 1


def test_the_quickstart_page_runs_as_written(
    dist: Dist, fresh_database_to_create: FreshDatabase, tmp_path: Path
) -> None:
    fresh_database = fresh_database_to_create
    database = "postgresql" if fresh_database.postgresql else "sqlite"
    blocks = page_blocks(PAGE.read_text())
    applying = [b for b in blocks if b.applies_to(database)]
    servers = [b for b in applying if b.action == "server"]
    assert len(servers) == 1 and all(
        b.action in ("output", "skip") for b in applying[applying.index(servers[0]) + 1 :]
    ), "one server block, and nothing to run after it"
    if database == "postgresql":
        assert any(b.only == "postgresql" and b.action == "append" for b in blocks)

    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(dist.wheel, project)
    env = {
        k: v
        for k, v in OUTSIDE_ENV.items()
        if k not in ("DATABASE_URL", "VIRTUAL_ENV", "PYTHONPATH", "DJANGO_SUPERUSER_PASSWORD")
    }
    # python3 is this test's Python (3.12+), as the page asks
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    started = time.monotonic()
    done = subprocess.run(
        ["bash", "-c", shell_script(blocks, fresh_database, database)],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
        check=False,
    )
    took = time.monotonic() - started
    assert done.returncode == 0, f"the page's shell failed:\n{done.stdout}\n{done.stderr}"
    outputs, block_started = outputs_by_block(done.stdout)
    report_times(database, took, block_started, blocks)

    # each output block shows what the run block before it printed
    checked = 0
    for before, block in itertools.pairwise(applying):
        if block.action == "output":
            assert before.action == "run", f"block {block.index}: an output follows a run block"
            assert_shows(block.text, outputs[before.index], f"block {block.index}")
            checked += 1
    assert checked >= 4

    # the runs the page made, first to last: the two orders (`tasks inspect` names them)
    runs = list(dict.fromkeys(re.findall(r"^order@1\s+(\S+)\s", done.stdout, re.MULTILINE)))
    assert len(runs) == 2, done.stdout
    (create_user,) = [b.text for b in applying if "createsuperuser" in b.text]
    m = re.search(r"DJANGO_SUPERUSER_PASSWORD=(\S+) .*--username (\S+)", create_user)
    assert m is not None, create_user
    password, username = m.groups()
    pages = admin_pages(
        project,
        env,
        servers[0].text.strip(),
        username,
        password,
        [
            "/admin/",
            "/admin/tasks_engine/workflowrun/",
            *[f"/admin/tasks_engine/workflowrun/{r}/change/" for r in runs],
        ],
    )
    index, listing, first, second = pages
    # the way the page tells the reader to go: **App → Model** on the admin's index
    way = re.search(r"\*\*(.+?) → (.+?)\*\*", PAGE.read_text())
    assert way is not None
    for name in way.groups():
        assert name in index, (name, index)
    for run_id in runs:  # each order's row links to its page
        assert f"/admin/tasks_engine/workflowrun/{run_id}/change/" in listing, listing
    for page, run_id in ((first, runs[0]), (second, runs[1])):
        assert run_id in page
        for step in ("reserve", "cool-off", "invoice", "approved"):
            assert step in page, (step, page)
    assert "INV-ADA" in first and "INV-GRACE" in second
    assert "not a duplicate after all" in second  # who retried it, and why


def admin_pages(
    project: Path, env: dict[str, str], command: str, username: str, password: str, paths: list[str]
) -> list[str]:
    """The admin's pages at `paths`, read over HTTP from the page's server command (on a free
    port) after logging in through the admin's login form."""
    assert command == "python manage.py runserver", command
    port = free_port()
    log = (project / "runserver.log").open("w")
    server = subprocess.Popen(
        ["bash", "-c", f". .venv/bin/activate && exec {command} 127.0.0.1:{port}"],
        cwd=project,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    jar = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    try:
        login = wait_for(
            lambda: _get(browser, f"{base}/admin/login/") or server.poll() is not None,
            timeout=120,
            what="runserver",
        )
        assert server.poll() is None, (project / "runserver.log").read_text()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login)
        assert token is not None, login
        form = urllib.parse.urlencode(
            {
                "csrfmiddlewaretoken": token[1],
                "username": username,
                "password": password,
                "next": "/admin/",
            }
        ).encode()
        with browser.open(f"{base}/admin/login/?next=/admin/", data=form) as answer:
            assert urllib.parse.urlparse(answer.url).path == "/admin/", answer.read().decode()
        pages = []
        for path in paths:
            with browser.open(f"{base}{path}") as answer:
                assert answer.status == 200 and urllib.parse.urlparse(answer.url).path == path
                pages.append(answer.read().decode())
        return pages
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        log.close()


def _get(browser: urllib.request.OpenerDirector, url: str) -> str | None:
    try:
        with browser.open(url, timeout=10) as answer:
            return answer.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None


@pytest.mark.one_db("reads the page: no database")
def test_every_fenced_block_on_the_page_says_what_the_test_does_with_it() -> None:
    page = PAGE.read_text()
    actions = [b.action for b in page_blocks(page)]
    assert actions.count("run") >= 5 and actions.count("output") >= 4, actions
    unmarked = page + "\n```sh\npython manage.py flush\n```\n"
    with pytest.raises(AssertionError, match="mark each one"):
        page_blocks(unmarked)
    with pytest.raises(AssertionError, match="unknown marker"):
        page_blocks(page.replace("<!-- quickstart: run -->", "<!-- quickstart: rnu -->", 1))
