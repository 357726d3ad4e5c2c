"""A maintenance service for the leader's process tests: with LEADER_PROBE set to a file path,
every round appends the process id of the leader that ran it."""

from __future__ import annotations

import os

from tasks_engine.services import registry


def probe() -> None:
    with open(os.environ["LEADER_PROBE"], "a") as f:
        f.write(f"{os.getpid()}\n")


def probed_pids(path: str) -> list[int]:
    try:
        with open(path) as f:
            return [int(line) for line in f.read().split("\n")[:-1] if line]
    except FileNotFoundError:
        return []


if os.environ.get("LEADER_PROBE"):
    registry.register("test-leader-probe", probe, every=0.2)
