"""The maintenance leader's periodic services: a registry any app adds to in its `ready()`.

Each service is a `run_once()` that does one round of its work and can be called on its own
(tests, `tasks prune`); the leader (one `runworker` at a time) calls every registered service
about every `every` seconds. Services must be idempotent and short: each round in its own
short transactions, since a round may be cut off when leadership moves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Service:
    name: str
    run_once: Callable[[], Any]
    every: float  # seconds between two rounds on the leader


_SERVICES: dict[str, Service] = {}


def register(name: str, run_once: Callable[[], Any], *, every: float) -> None:
    """Add (or replace) the service `name`; the leader runs `run_once()` every `every` s."""
    if every <= 0:
        raise ValueError(f"service {name!r}: every must be positive, not {every!r}")
    _SERVICES[name] = Service(name, run_once, float(every))


def registered() -> list[Service]:
    return list(_SERVICES.values())
