"""Every engine statement goes to TASKS_ENGINE["DATABASE"]: no engine module reaches Django's
default connection (`django.db.connection`, `connections["default"]`, `DEFAULT_DB_ALIAS` as a
connection) or opens a transaction without naming an alias (`transaction.atomic()`,
`transaction.on_commit(...)` of "default"). They use tasks_engine/db/alias.py instead, the one
place that decides the alias."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import tasks_engine

pytestmark = pytest.mark.one_db("reads the source")

ROOT = Path(tasks_engine.__file__).parent
RULES = {
    "imports django.db.connection": re.compile(
        r"^\s*from django\.db import [^\n]*\bconnection\b(?!s)", re.M
    ),
    "a transaction of the default alias": re.compile(
        r"transaction\.(atomic|on_commit|get_rollback|set_rollback)\((?![^)]*using)"
    ),
    "the default alias's connection": re.compile(
        r"connections\[(DEFAULT_DB_ALIAS|\"default\"|'default')\]"
    ),
}


def engine_modules() -> list[Path]:
    return [
        p
        for p in sorted(ROOT.rglob("*.py"))
        if "migrations" not in p.parts and p != ROOT / "db" / "alias.py"
    ]


def offences(text: str) -> list[str]:
    code = re.sub(r'"""[\s\S]*?"""', "", text)  # docstrings may name what not to do
    code = "\n".join(line.split("#", 1)[0] for line in code.splitlines())
    return [what for what, rule in RULES.items() if rule.search(code)]


def test_no_engine_module_reaches_the_default_alias() -> None:
    found = {
        str(p.relative_to(ROOT)): bad for p in engine_modules() if (bad := offences(p.read_text()))
    }
    assert found == {}


def test_the_rules_catch_what_they_name() -> None:
    assert offences("from django.db import IntegrityError, connection\n") == [
        "imports django.db.connection"
    ]
    assert offences("    with transaction.atomic():\n") == ["a transaction of the default alias"]
    assert offences("transaction.on_commit(f)\n") == ["a transaction of the default alias"]
    assert offences("c = connections[DEFAULT_DB_ALIAS]\n") == ["the default alias's connection"]
    assert offences("from django.db import connections\nwith transaction.atomic(using=a):\n") == []
