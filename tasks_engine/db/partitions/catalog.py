"""What PostgreSQL's catalog says about a partitioned table: whether it is one, its partitions
and their bounds."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import connections

from ..alias import connection

_BOUND = re.compile(r"FROM \('([0-9a-f-]{36})'\) TO \('([0-9a-f-]{36})'\)")


@dataclass(frozen=True)
class Partition:
    name: str
    lo: uuid.UUID | None  # None for the DEFAULT partition
    hi: uuid.UUID | None

    @property
    def is_default(self) -> bool:
        return self.lo is None


def _rows(sql: str, relation: str, using: str | None = None) -> list[tuple[Any, ...]]:
    """A catalog query about one relation (its name the one parameter), on the engine's
    alias or `using`."""
    with (connection if using is None else connections[using]).cursor() as cur:
        cur.execute(sql, [relation])
        return list(cur.fetchall())


def is_partitioned(table: str) -> bool:
    rows = _rows("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", table)
    return bool(rows) and rows[0][0] == "p"


def partitions(table: str, using: str | None = None) -> list[Partition]:
    """`table`'s partitions, oldest range first, the DEFAULT one last (`using`: read through
    that alias, a replica of the engine's, say)."""
    rows = _rows(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i"
        " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)",
        table,
        using,
    )
    found = []
    for name, bound in rows:
        m = _BOUND.search(bound)
        lo, hi = (uuid.UUID(m.group(1)), uuid.UUID(m.group(2))) if m else (None, None)
        found.append(Partition(name, lo, hi))
    return sorted(found, key=lambda p: (p.lo is None, p.lo.int if p.lo else 0))


def covered(table: str, using: str | None = None) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """The ranges `table`'s period partitions cover, adjacent ones joined, oldest first: a
    query whose key lies inside them (every bound included) leaves the DEFAULT partition out."""
    ranges: list[tuple[uuid.UUID, uuid.UUID]] = []
    for part in partitions(table, using):
        if part.lo is None or part.hi is None:
            continue
        if ranges and ranges[-1][1] == part.lo:
            ranges[-1] = (ranges[-1][0], part.hi)
        else:
            ranges.append((part.lo, part.hi))
    return ranges


def columns(table: str) -> list[str]:
    """The table's columns in their order (dropped ones left out), quoted."""
    rows = _rows(
        "SELECT quote_ident(attname) FROM pg_attribute WHERE attrelid = to_regclass(%s)"
        " AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        table,
    )
    return [name for (name,) in rows]


def local_unique_indexes(partition: str) -> list[tuple[str, str]]:
    """The unique indexes of a partition that no index of its parent stands for (a unique
    key without the partition key, kept per partition): (name, definition)."""
    rows = _rows(
        "SELECT c.relname, pg_get_indexdef(x.indexrelid) FROM pg_index x"
        " JOIN pg_class c ON c.oid = x.indexrelid"
        " WHERE x.indrelid = to_regclass(%s) AND x.indisunique"
        " AND NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = x.indexrelid)"
        " ORDER BY c.relname",
        partition,
    )
    return [(name, definition) for name, definition in rows]
