"""How many worker processes `runworker --processes N` may start: what the machine's CPUs and
the database's connections allow. Beyond it, N is a usage error, not a fork loop.

- CPUs: at most CPU_MULTIPLE per CPU. A worker process runs its slots on threads under one
  interpreter lock, so more processes than CPUs only help while steps wait on I/O, and slots
  (`--concurrency`) already serve that.
- PostgreSQL: N x the connections a worker process holds (`loop.connections_per_process`) must
  fit in `max_connections`, less the reserved connections and those already in use. Behind a
  transaction pooler the pooler's own limits apply instead (its clients are not the server's).
- SQLite: at most SQLITE_MAX_PROCESSES; one write lock serialises them all.
"""

from __future__ import annotations

import os

from django.db import DatabaseError

from ..db.alias import connection
from ..db.pooler import behind_transaction_pooler

CPU_MULTIPLE = 4
SQLITE_MAX_PROCESSES = 4

FREE_CONNECTIONS_SQL = """
    SELECT current_setting('max_connections')::int,
           current_setting('superuser_reserved_connections')::int
             + coalesce(current_setting('reserved_connections', true)::int, 0),
           (SELECT count(*) FROM pg_stat_activity
             WHERE backend_type = 'client backend' AND pid <> pg_backend_pid())
"""


class CannotCount(Exception):
    """The database's connection limits could not be read (it is down, say)."""


def cpus() -> int:
    """The CPUs this process may run on (its affinity, where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def too_many(processes: int, per_process: int) -> str | None:
    """Why `processes` worker processes of `per_process` connections each are too many for this
    machine and database (one line), or None when they fit."""
    most = CPU_MULTIPLE * cpus()
    if processes > most:
        return (
            f"--processes {processes} is more than this machine runs well: at most {most} "
            f"({CPU_MULTIPLE} per CPU, {cpus()} CPUs)"
        )
    if connection.vendor == "sqlite" and processes > SQLITE_MAX_PROCESSES:
        return (
            f"--processes {processes} on SQLite: at most {SQLITE_MAX_PROCESSES} (one write lock "
            "serialises them; raise --concurrency instead)"
        )
    if connection.vendor != "postgresql" or behind_transaction_pooler():
        return None
    limit, reserved, in_use = connection_limits()
    free = limit - reserved - in_use
    if processes * per_process > free:
        return (
            f"--processes {processes} needs {processes * per_process} database connections "
            f"({per_process} per worker process) but PostgreSQL has {max(free, 0)} free "
            f"(max_connections {limit} - {reserved} reserved - {in_use} in use): at most "
            f"{max(free, 0) // per_process} at this --concurrency"
        )
    return None


def connection_limits() -> tuple[int, int, int]:
    """(max_connections, reserved connections, connections of other clients) on PostgreSQL."""
    try:
        with connection.cursor() as cur:
            cur.execute(FREE_CONNECTIONS_SQL)
            limit, reserved, in_use = cur.fetchone()
    except DatabaseError as exc:
        lines = str(exc).strip().splitlines()
        raise CannotCount(lines[0] if lines else type(exc).__name__) from None
    finally:
        connection.close()  # the supervisor holds no connection while its children run
    return int(limit), int(reserved), int(in_use)
