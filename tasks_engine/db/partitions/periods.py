"""Making a period's partitions: the leader's maintenance (services/partitions.py) creates the
next periods ahead, so runs land in their period's partition from their first row; a run
whose period has none lands in the DEFAULT partition, and the creation of its period moves
it out first (PostgreSQL refuses to attach a range the DEFAULT partition holds rows of)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from ..alias import atomic, connection
from . import TABLES, Partitioned, bounds, catalog

DEFAULT = "default"
AHEAD = 2  # periods made ahead of the current one
MAX_AHEAD = 24
# Maintenance DDL takes locks the claim waits behind: a round that cannot get them soon gives
# up and the next one tries again, instead of queueing every claim behind it.
LOCK_TIMEOUT = "2s"

_INDEX_HEAD = re.compile(r"^CREATE UNIQUE INDEX \S+ ON (ONLY )?\S+ ")


def partition_name(table: str, tag: str) -> str:
    return f"{table}_{tag}"


def wall_now() -> datetime:
    """Run ids take the wall clock (clock.new_run_id), not the engine's clock a test may fake."""
    return datetime.now(UTC)


def ahead_starts(unit: str, ahead: int, now: datetime | None = None) -> list[datetime]:
    """The current period's start and the next `ahead` ones."""
    start = bounds.period_start(now or wall_now(), unit)
    starts = [start]
    for _ in range(ahead):
        starts.append(bounds.next_start(starts[-1], unit))
    return starts


def ensure_ahead(unit: str, ahead: int = AHEAD, *, lock_timeout: bool = True) -> list[str]:
    """Create the current period's partitions and the next `ahead` periods' that are missing;
    the names of those created. Cheap when they exist: one catalog query per table."""
    made = []
    for start in ahead_starts(unit, ahead):
        for table in TABLES:
            name = create_period(table, start, unit, lock_timeout=lock_timeout)
            if name is not None:
                made.append(name)
    return made


def create_period(
    table: Partitioned, start: datetime, unit: str, *, lock_timeout: bool = False
) -> str | None:
    """Create `table`'s partition of the period starting at `start`, unless a partition
    already covers any of its range; its name, or None."""
    lo, hi = bounds.id_bound(start), bounds.id_bound(bounds.next_start(start, unit))
    existing = catalog.partitions(table.table)
    if any(p.lo is not None and p.lo.int < hi.int and lo.int < p.hi.int for p in existing):  # type: ignore[union-attr]
        return None
    name = partition_name(table.table, bounds.suffix(start))
    default = partition_name(table.table, DEFAULT)
    cols = ", ".join(catalog.columns(table.table))
    with atomic(), connection.cursor() as cur:
        if lock_timeout:
            cur.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        cur.execute(
            f"CREATE TABLE {name} (LIKE {table.table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        )
        if any(p.name == default for p in existing):
            cur.execute(
                f"WITH moved AS (DELETE FROM {default} WHERE {table.key} >= '{lo}'"
                f" AND {table.key} < '{hi}' RETURNING {cols}) INSERT INTO {name} ({cols})"
                " SELECT * FROM moved"
            )
        cur.execute(
            f"ALTER TABLE {table.table} ATTACH PARTITION {name}"
            f" FOR VALUES FROM ('{lo}') TO ('{hi}')"
        )
        copy_local_indexes(cur, default, name, bounds.suffix(start))
    return name


def copy_local_indexes(cur: object, template: str, partition: str, tag: str) -> None:
    """Give `partition` the unique indexes `template` (a sibling partition) has of its own:
    the run keys a parent cannot hold (convert.py says which)."""
    suffix = "_" + template.rsplit("_", 1)[1]
    for index, definition in catalog.local_unique_indexes(template):
        base = index.removesuffix(suffix)
        cur.execute(local_index(definition, base, partition, tag))  # type: ignore[attr-defined]


def local_index(definition: str, base: str, partition: str, tag: str) -> str:
    """A unique index's definition (pg_get_indexdef) made for one partition."""
    return _INDEX_HEAD.sub(f"CREATE UNIQUE INDEX {base}_{tag} ON {partition} ", definition, 1)


def detach_and_drop(tag: str, cur: object) -> None:
    """Detach a period's partitions, children first, and drop them (inside the caller's
    transaction, which has checked that nothing in them may be kept)."""
    for table in TABLES:
        name = partition_name(table.table, tag)
        cur.execute(f"ALTER TABLE {table.table} DETACH PARTITION {name}")  # type: ignore[attr-defined]
        cur.execute(f"DROP TABLE {name}")  # type: ignore[attr-defined]
