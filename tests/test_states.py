"""The transition table, its functions and the diagram agree; nothing else writes status."""

from __future__ import annotations

import re
from pathlib import Path

from tasks_engine import states, transitions

ROOT = Path(__file__).resolve().parent.parent


def test_every_edge_has_a_function_in_transitions() -> None:
    for (src, dst), (cause, fns) in states.TRANSITIONS.items():
        for fn in fns.split(", "):
            assert callable(getattr(transitions, fn, None)), f"{src}->{dst} ({cause}): {fn}"


def test_every_status_is_reachable_or_initial() -> None:
    targets = {dst for (_, dst) in states.TRANSITIONS} | {states.RunStatus.PENDING}
    assert targets == set(states.RunStatus)


def test_docs_diagram_is_generated_from_the_table() -> None:
    doc = (ROOT / "docs" / "state_machine.md").read_text()
    assert states.mermaid() in doc


def test_only_transitions_writes_run_status() -> None:
    pattern = re.compile(
        r"status\s*=\s*'(pending|running|waiting|completed|failed|canceled)'|"
        r"\.update\([^)]*status="
    )
    offenders = []
    for path in (ROOT / "tasks_engine").rglob("*.py"):
        if "transitions" in path.parts or "migrations" in path.parts:
            continue
        text = path.read_text()
        for line in text.splitlines():
            if pattern.search(line) and "SET" in line.upper():
                offenders.append(f"{path.name}: {line.strip()}")
    assert offenders == []
