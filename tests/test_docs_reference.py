"""docs/reference.md stays true: every public name, command option, setting and system check
id it lists exists, and every setting the engine and the outbox read, every name
tasks_engine exports and every command option is listed."""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

import pytest
from django.core.management import load_command_class

from tasks_engine.conf import django_has_tasks
from tasks_engine.runtime.context import StepAPI, TaskContext
from tests.helpers import ROOT

pytestmark = pytest.mark.one_db("reads the docs and the code")

REFERENCE = (ROOT / "docs" / "reference.md").read_text()
FIRST_CELL = re.compile(r"^\| `([^`]+)` \|", re.M)
COMMON_OPTIONS = {
    "-h", "--help", "--version", "-v", "--verbosity", "--settings", "--pythonpath",
    "--traceback", "--no-color", "--force-color", "--skip-checks",
}  # fmt: skip


def section(title: str) -> str:
    start = REFERENCE.index(f"\n## {title}\n")
    end = REFERENCE.find("\n## ", start + 1)
    return REFERENCE[start : end if end != -1 else None]


def first_cells(text: str) -> list[str]:
    return FIRST_CELL.findall(text)


def documented_commands() -> dict[str, list[str]]:
    """`### manage.py X [SUB]` heading -> the first cells of its table."""
    commands: dict[str, list[str]] = {}
    for block in section("Commands").split("\n### ")[1:]:
        heading, _, body = block.partition("\n")
        commands[heading.strip("`").removeprefix("manage.py ")] = first_cells(body)
    return commands


def parser_for(command: str) -> argparse.ArgumentParser:
    name, *sub = command.split()
    app = "outbox" if name == "runrelay" else "tasks_engine"
    parser = load_command_class(app, name).create_parser("manage.py", name)
    for part in sub:
        (choices,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parser = choices.choices[part]
    return parser


def own_options(parser: argparse.ArgumentParser) -> set[str]:
    found = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        names = set(action.option_strings) or {action.dest}
        # Django's own --version prints its version; a subcommand's (tasks list) is its own.
        common = names & COMMON_OPTIONS - (
            set() if isinstance(action, argparse._VersionAction) else {"--version"}
        )
        if not common:
            found.add(max(names, key=len))
    return found


def read_settings(path: str) -> set[str]:
    return set(re.findall(r'raw\.get\("([A-Z_]+)"', (ROOT / path).read_text()))


def test_every_documented_python_name_exists() -> None:
    names = [n for n in first_cells(section("Python API")) if not n.startswith("ctx.")]
    assert len(names) > 20  # the tables were parsed
    for dotted in names:
        module, _, attr = dotted.rpartition(".")
        if module == "tasks_engine.backends" and not django_has_tasks():  # Django 5.2
            with pytest.raises(ImportError, match=r"needs Django 6\.0 or later"):
                importlib.import_module(module)
            continue
        assert hasattr(importlib.import_module(module), attr), f"{dotted} is documented"


def test_every_exported_name_is_documented() -> None:
    import tasks_engine

    documented = set(first_cells(section("Python API")))
    missing = [n for n in tasks_engine.__all__ if f"tasks_engine.{n}" not in documented]
    assert missing == []


def test_every_documented_context_member_exists() -> None:
    members = [n for n in first_cells(section("Python API")) if n.startswith("ctx.")]
    source = (ROOT / "tasks_engine" / "runtime/context.py").read_text()
    for dotted in members:
        if dotted.startswith("ctx.step."):
            assert hasattr(StepAPI, dotted.removeprefix("ctx.step.")), dotted
        else:
            attr = dotted.removeprefix("ctx.")
            assert hasattr(TaskContext, attr) or f"self.{attr} =" in source, dotted


@pytest.mark.parametrize("command", sorted(documented_commands()))
def test_documented_command_options_match_the_parser(command: str) -> None:
    documented = set(documented_commands()[command])
    actual = own_options(parser_for(command))
    assert documented == actual, f"manage.py {command}"


def test_every_tasks_subcommand_is_documented() -> None:
    (choices,) = [
        a for a in parser_for("tasks")._actions if isinstance(a, argparse._SubParsersAction)
    ]
    documented = {c.removeprefix("tasks ") for c in documented_commands() if c.startswith("tasks")}
    assert documented == set(choices.choices)


def test_documented_settings_are_exactly_the_ones_read() -> None:
    cells = first_cells(section("Settings"))
    engine = {m[1] for c in cells if (m := re.fullmatch(r'TASKS_ENGINE\["([A-Z_]+)"\]', c))}
    outbox = {m[1] for c in cells if (m := re.fullmatch(r'OUTBOX\["([A-Z_]+)"\]', c))}
    schedules = (ROOT / "tasks_engine" / "schedules" / "specs.py").read_text()
    read = read_settings("tasks_engine/conf.py") | set(
        re.findall(r'"TASKS_ENGINE", None\) or \{\}\)\.get\("([A-Z_]+)"\)', schedules)
    )
    assert "SCHEDULES" in read
    assert engine == read
    assert outbox == read_settings("outbox/conf.py")


def test_documented_check_ids_are_exactly_the_ones_emitted() -> None:
    documented = set(first_cells(section("System checks")))
    emitted = set()
    for path in [*Path(ROOT, "tasks_engine").rglob("*.py"), *Path(ROOT, "outbox").rglob("*.py")]:
        emitted |= set(re.findall(r'id="((?:tasks_engine|outbox)\.[EW]\d+)"', path.read_text()))
    from tasks_engine.schedules.specs import CODES

    emitted |= {f"tasks_engine.{code}" for code in CODES.values()}
    assert documented == emitted


def test_the_readme_links_only_files_inside_the_repository() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)", readme)
    assert targets
    for target in targets:
        assert "://" not in target, target
        path = (ROOT / target).resolve()
        assert path.is_relative_to(ROOT) and path.exists(), target
