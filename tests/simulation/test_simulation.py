"""The engine simulation (issue 12): hypothesis drives the real transitions on the test
database with simulated workers, crashes, lost leases, cancels, facts, timers and database
errors, and checks the engine's invariants after every rule (see machine.py for the rules and
invariants, defects.py for the known defects it steps around).

    HYPOTHESIS_PROFILE=dev  .venv/bin/python -m pytest tests/simulation -q   # a quick look
    make simulate                                 # the long run, PostgreSQL then SQLite
    ... -m pytest tests/simulation --hypothesis-seed=123                      # repeatable
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from hypothesis.stateful import run_state_machine_as_test

from tasks_engine import clock
from tasks_engine.runtime import executor, step_timeouts
from tasks_engine.worker import heartbeat

from . import harness, machine
from .defects import inject
from .harness import ThreadPool, TickingClock, install_hooks
from .invariants import reset_tables
from .machine import RETENTION_DAYS, EngineSimulation, SimEnv
from .profiles import selected, timeout_seconds
from .workflows import NARROW_LIMIT, NARROW_QUEUE, registered

pytestmark = [
    pytest.mark.simulation,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(timeout_seconds()),
]


class QuietLogger:
    """The engine's run logger, silenced: thousands of examples would print millions of lines."""

    def bind(self, **_: Any) -> QuietLogger:
        return self

    def __getattr__(self, _name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


@pytest.fixture
def sim_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimEnv]:
    fake = TickingClock()
    monkeypatch.setattr(clock, "now", fake.now)
    # Step timers and the heartbeat's grace run on the fake clock too (their `monotonic`).
    fake_time = SimpleNamespace(monotonic=fake.monotonic)
    monkeypatch.setattr(step_timeouts, "time", fake_time)
    monkeypatch.setattr(heartbeat, "time", fake_time)
    harness.set_clock(fake)
    narrow = {NARROW_QUEUE: {"concurrency": NARROW_LIMIT}}
    engine = {**settings.TASKS_ENGINE, "QUEUES": narrow, "RETENTION_DAYS": RETENTION_DAYS}
    monkeypatch.setattr(settings, "TASKS_ENGINE", engine)
    inject(monkeypatch)  # SIM_INJECT: broken services, to see the invariants catch them
    monkeypatch.setattr(executor, "run_logger", lambda run: QuietLogger())
    install_hooks(monkeypatch)
    pool = ThreadPool()
    with registered() as pairs:
        machine.ENV = SimEnv(fake, pool, pairs)
        try:
            yield machine.ENV
        finally:
            machine.ENV = None
            harness.set_clock(None)
            pool.shutdown()
            reset_tables()


def test_engine_simulation(sim_env: SimEnv) -> None:
    started = time.monotonic()
    machine.STATS.clear()
    try:
        run_state_machine_as_test(EngineSimulation, settings=selected())
    finally:
        elapsed = time.monotonic() - started
        stats = machine.STATS
        where = connection.vendor
        print(f"\nsimulation: {stats['examples']} examples in {elapsed:.0f}s on {where}")
        for key, n in sorted(stats.items()):
            print(f"  {key}: {n}")
