"""Time partitions of the engine's history on PostgreSQL (TASKS_ENGINE["PARTITION"]; the
Partitions section of docs/DATABASES.md).

Runs are partitioned by their id (version 7: creation-time ordered, bounds.py), their steps,
facts and op ledger rows by their run's id with the same bounds, so a run and its rows share
one period and leave together. An op key is unique across every run (fencing.py looks a key up
whoever holds it), which a partition's own unique index cannot promise: fencing.py locks the
key before it looks, as keyed enqueues do (transitions/creating.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...conf import engine_settings
from ...models import Fact, OpLedger, StepAttempt, WorkflowRun
from ..sql import is_postgres


@dataclass(frozen=True)
class Partitioned:
    table: str
    key: str  # the partition key: the run id column
    # A ledger row outlives a run deleted by hand (SET NULL): rows whose key is NULL live in the
    # DEFAULT partition, and the key cannot be part of a primary key (convert.py).
    key_nullable: bool = False


RUNS = Partitioned(WorkflowRun._meta.db_table, "id")
STEPS = Partitioned(StepAttempt._meta.db_table, "run_id")
FACTS = Partitioned(Fact._meta.db_table, "run_id")
LEDGER = Partitioned(OpLedger._meta.db_table, "run_id", key_nullable=True)
# Parents last: children's periods are detached first (retention) and converted after.
TABLES = (LEDGER, FACTS, STEPS, RUNS)


def unit() -> str | None:
    """The period of the engine's partitions ("month", "week"), None when it has none (not
    set, or not PostgreSQL: checks.py's E042)."""
    period = engine_settings().partition
    return period if period is not None and is_postgres() else None
