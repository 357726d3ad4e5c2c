"""docs/production.md stays true: every TASKS_ENGINE and OUTBOX key it names is one the engine
and the outbox read, every runworker, runrelay and `tasks` option it shows exists, and every
system check id it names is one the engine's checks report; its settings blocks parse as the
engine parses them."""

from __future__ import annotations

import argparse
import re

import pytest
from django.core.management import load_command_class

from tasks_engine.conf import KNOWN_KEYS, _parse
from tests.helpers import ROOT

pytestmark = pytest.mark.one_db("reads the docs and the code")

PAGE = (ROOT / "docs" / "production.md").read_text()
OUTBOX_KEYS = set(re.findall(r'raw\.get\("([A-Z_]+)"', (ROOT / "outbox" / "conf.py").read_text()))


def named_keys(setting: str) -> set[str]:
    """Keys the page gives `setting`: `SETTING["KEY"]` and `"KEY":` inside `SETTING = {...}`."""
    keys = set(re.findall(rf'{setting}\["([A-Z_]+)"\]', PAGE))
    for block in re.findall(rf"^{setting} = \{{\n(.*?)^\}}", PAGE, re.M | re.S):
        keys |= set(re.findall(r'^    "([A-Z_]+)":', block, re.M))
    return keys


def test_every_tasks_engine_key_on_the_page_is_one_the_engine_reads() -> None:
    keys = named_keys("TASKS_ENGINE")
    assert {"LISTEN_URL", "METRICS_TOKEN", "PREPARED_STATEMENTS", "RETENTION_DAYS"} <= keys
    assert keys <= KNOWN_KEYS, sorted(keys - KNOWN_KEYS)


def test_every_outbox_key_on_the_page_is_one_the_outbox_reads() -> None:
    keys = named_keys("OUTBOX")
    assert keys and keys <= OUTBOX_KEYS, sorted(keys - OUTBOX_KEYS)


def test_the_pages_tasks_engine_blocks_are_valid_settings() -> None:
    """Each `TASKS_ENGINE = {...}` block, evaluated with the environment variables it reads
    set, parses as the engine parses its setting."""
    blocks = re.findall(r"^(TASKS_ENGINE = \{\n.*?^\})", PAGE, re.M | re.S)
    assert len(blocks) >= 2
    env = {"TASKS_LISTEN_URL": "postgres://app@db:5432/app", "TASKS_METRICS_TOKEN": "s3cret"}
    for block in blocks:
        namespace: dict[str, object] = {"os": _Env(env)}
        exec(block, namespace)  # the page's own text: no input from outside the repository
        raw = namespace["TASKS_ENGINE"]
        assert isinstance(raw, dict)
        _parse(raw)


class _Env:
    """`os` as far as the page's blocks use it: `os.environ.get`."""

    def __init__(self, environ: dict[str, str]) -> None:
        self.environ = environ


def _options(app: str, name: str, sub: str | None = None) -> set[str]:
    parser = load_command_class(app, name).create_parser("manage.py", name)
    if sub is not None:
        (choices,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parser = choices.choices[sub]
    return {o for a in parser._actions for o in a.option_strings}


def test_every_command_option_on_the_page_exists() -> None:
    commands = re.findall(r"manage\.py (runworker|runrelay|tasks [a-z-]+|check)([^`\n]*)", PAGE)
    assert len(commands) >= 8
    for command, rest in commands:
        used = set(re.findall(r"(?<![\w-])(--[a-z-]+)", rest.split("#")[0]))
        if command == "check":
            known = {"--deploy", "--database"}
        elif command.startswith("tasks "):
            known = _options("tasks_engine", "tasks", command.removeprefix("tasks "))
        else:
            known = _options("outbox" if command == "runrelay" else "tasks_engine", command)
        assert used <= known, (command, sorted(used - known))


def test_every_check_id_on_the_page_is_one_the_engine_reports() -> None:
    ids = set(re.findall(r"tasks_engine\.([EW]\d{3})", PAGE))
    assert {"E020", "W022", "E027", "W002"} <= ids
    source = (ROOT / "tasks_engine" / "checks.py").read_text()
    for check_id in ids:
        assert f'"tasks_engine.{check_id}"' in source, check_id
