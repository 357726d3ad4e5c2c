"""Turning PARTITION on: the engine's run tables, plain tables made by the migrations, become
partitioned tables of the same names, in one transaction (migrate's post_migrate, and
`tasks partition`). Idempotent: a table already partitioned is left as it is.

Per table: the old table is renamed, a partitioned parent takes its name with its columns,
defaults and checks, partitions are made for every period its rows fall in and the next
ones, plus a DEFAULT partition (rows no period holds: version 4 ids made before migration
0020, and the rows of a period the maintenance has not made yet), the rows are copied over,
the old table dropped and its indexes made again on the parent. Three things differ:

- a primary key must include the partition key: a step's and a fact's is (id, run_id); the
  ledger's run id may be NULL, which no primary key column may be, so its (id, run_id) is a
  unique index instead (the id's sequence keeps ids unique in the DEFAULT partition too);
- a unique key without the run id (the runs' idempotency, queueing and debounce keys) cannot
  be an index of the parent: each partition has its own (named `<key>_<partition tag>`), and
  creating.py makes keyed inserts correct across periods;
- triggers (the runs' end NOTIFY of migration 0010) are made again on the parent, which gives
  them to every partition;
- foreign keys to the runs are dropped: Django's ORM does CASCADE and SET NULL itself, and a
  database foreign key would make every DETACH and DROP of a period check whole tables.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ..alias import atomic, connection
from . import RUNS, TABLES, Partitioned, bounds, catalog
from .periods import AHEAD, DEFAULT, ahead_starts, local_index, partition_name


def convert(unit: str, ahead: int = AHEAD) -> list[str]:
    """Partition every run table not partitioned yet; the names of those converted."""
    todo = [t for t in TABLES if not catalog.is_partitioned(t.table)]
    if not todo:
        return []
    with atomic(), connection.cursor() as cur:
        _drop_foreign_keys(cur)
        starts = sorted(_periods_holding_runs(cur, unit) | set(ahead_starts(unit, ahead)))
        for table in todo:
            _convert(cur, table, starts, unit)
    return [t.table for t in todo]


def _drop_foreign_keys(cur: Any) -> None:
    cur.execute(
        "SELECT conrelid::regclass::text, quote_ident(conname) FROM pg_constraint"
        " WHERE contype = 'f' AND confrelid = to_regclass(%s)"
        " AND conrelid = ANY(%s::regclass[])",
        [RUNS.table, [t.table for t in TABLES]],
    )
    for table, name in cur.fetchall():
        cur.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")


def _periods_holding_runs(cur: Any, unit: str) -> set[datetime]:
    """The starts of the periods that version 7 run ids fall in (the others go to DEFAULT)."""
    cur.execute(
        f"SELECT DISTINCT date_trunc('{unit}', to_timestamp(('x' || left(replace(id::text,"
        " '-', ''), 12))::bit(48)::bigint / 1000.0) AT TIME ZONE 'UTC')"
        f" FROM {RUNS.table} WHERE substr(id::text, 15, 1) = '7'"
    )
    starts = {start.replace(tzinfo=UTC) for (start,) in cur.fetchall()}
    return {s for s in starts if s < bounds.LAST_START}


def _indexes(cur: Any, table: Partitioned) -> list[tuple[str, str, bool, str | None, str, bool]]:
    """(name, index definition, unique, constraint kind, constraint definition, whether the
    partition key is one of its columns) of each index of `table`."""
    cur.execute(
        "SELECT quote_ident(c.relname), pg_get_indexdef(x.indexrelid), x.indisunique,"
        " con.contype, pg_get_constraintdef(con.oid),"
        " (SELECT attnum FROM pg_attribute WHERE attrelid = x.indrelid AND attname = %s)"
        " = ANY(x.indkey::int2[])"
        " FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid"
        " LEFT JOIN pg_constraint con ON con.conindid = x.indexrelid"
        " AND con.conrelid = x.indrelid"
        " WHERE x.indrelid = to_regclass(%s) ORDER BY c.relname",
        [table.key, table.table],
    )
    return list(cur.fetchall())


def _identity(cur: Any, table: str) -> list[tuple[str, str, int, bool]]:
    """(column, sequence, last value, is_called) of each identity column: a partitioned table
    cannot have one before PostgreSQL 17, so the column gets the sequence as its default."""
    cur.execute(
        "SELECT quote_ident(attname), pg_get_serial_sequence(%s, attname) FROM pg_attribute"
        " WHERE attrelid = to_regclass(%s) AND attidentity <> ''",
        [table, table],
    )
    found = []
    for column, sequence in cur.fetchall():
        cur.execute(f"SELECT last_value, is_called FROM {sequence}")
        last, called = cur.fetchone()
        found.append((column, sequence, last, called))
    return found


def _convert(cur: Any, table: Partitioned, starts: list[datetime], unit: str) -> None:
    name, old = table.table, f"{table.table}__unpartitioned"
    indexes = _indexes(cur, table)
    identity = _identity(cur, name)
    # Read before the rename: the definitions name the table, which the parent takes over.
    cur.execute(
        "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = to_regclass(%s)"
        " AND NOT tgisinternal ORDER BY tgname",
        [name],
    )
    triggers = [definition for (definition,) in cur.fetchall()]
    cur.execute(f"ALTER TABLE {name} RENAME TO {old}")
    cur.execute(
        f"CREATE TABLE {name} (LIKE {old} INCLUDING DEFAULTS INCLUDING CONSTRAINTS"
        f" INCLUDING STORAGE) PARTITION BY RANGE ({table.key})"
    )
    tags = [DEFAULT]
    cur.execute(f"CREATE TABLE {partition_name(name, DEFAULT)} PARTITION OF {name} DEFAULT")
    for start in starts:
        tag = bounds.suffix(start)
        lo, hi = bounds.id_bound(start), bounds.id_bound(bounds.next_start(start, unit))
        cur.execute(
            f"CREATE TABLE {partition_name(name, tag)} PARTITION OF {name}"
            f" FOR VALUES FROM ('{lo}') TO ('{hi}')"
        )
        tags.append(tag)
    cols = ", ".join(catalog.columns(old))
    cur.execute(f"INSERT INTO {name} ({cols}) SELECT {cols} FROM {old}")
    cur.execute(f"DROP TABLE {old}")
    for column, sequence, last, called in identity:
        cur.execute(f"CREATE SEQUENCE {sequence} AS bigint OWNED BY {name}.{column}")
        cur.execute("SELECT setval(%s, %s, %s)", [sequence, last, called])
        cur.execute(f"ALTER TABLE {name} ALTER {column} SET DEFAULT nextval('{sequence}')")
    for index, definition, unique, kind, constraint, has_key in indexes:
        if kind == "p":
            columns = constraint if has_key else constraint[:-1] + f", {table.key})"
            if table.key_nullable:
                columns = columns.removeprefix("PRIMARY KEY ")
                cur.execute(f"CREATE UNIQUE INDEX {index} ON {name} {columns}")
            else:
                cur.execute(f"ALTER TABLE {name} ADD CONSTRAINT {index} {columns}")
        elif unique and not has_key:  # a key of the partition, not of the table
            for tag in tags:
                cur.execute(local_index(definition, index, partition_name(name, tag), tag))
        elif kind == "u":
            cur.execute(f"ALTER TABLE {name} ADD CONSTRAINT {index} {constraint}")
        else:
            cur.execute(definition)
    for definition in triggers:
        cur.execute(definition)
    cur.execute(f"ANALYZE {name}")
