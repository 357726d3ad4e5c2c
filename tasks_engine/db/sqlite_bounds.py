"""SQLite has one write lock for the whole database: the bound on how long an atomic step may
hold it, and the planner statistics that keep the claim (which holds it) short.

Every engine write on SQLite waits for that lock (`BEGIN IMMEDIATE`, busy timeout), so one
long transaction stalls every worker, and their lease renewals with it. PostgreSQL ends a
frozen transaction with `idle_in_transaction_session_timeout`; SQLite has nothing alike.

- `atomic_step(transaction.atomic(), step)`: the transaction of an `atomic=True` step. On
  SQLite, once it has been open `TASKS_ENGINE["SQLITE_ATOMIC_STEP_SECONDS"]`, a watchdog
  thread interrupts the statement running on the step's connection
  (`sqlite3.Connection.interrupt()`) and rolls the transaction back, which releases the lock
  at once, even while the step's code sleeps or waits on the network; a deferred transaction
  takes its place, so whatever the step still writes is rolled back too instead of being
  autocommitted. The step then fails with `AtomicStepTimeoutError`; a step that returns after
  the bound cannot commit either. A plain `transaction.atomic()` on PostgreSQL, when the bound
  is disabled, or inside an enclosing transaction (which holds the lock anyway). In a worker
  the bound is at most a third of its lease (`bound_by_lease`): other workers' renewals wait
  for the lock, and must not wait past their leases.
- `optimize(connection)`: ANALYZE the tables whose queries choose between indexes, so the
  claim reads its partial indexes instead of the status index (`post_migrate`, and hourly from
  every worker's heartbeat through `optimize_periodically`). See docs/SQLITE.md.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction

from ..conf import engine_settings
from ..exceptions import AtomicStepTimeoutError, EngineUnavailable, LeaseLostError, StepTimeoutError
from ..observe.logs import get_logger
from .alias import engine_alias

SETTING = 'TASKS_ENGINE["SQLITE_ATOMIC_STEP_SECONDS"]'

# -- the atomic step's bound ------------------------------------------------------------------


# A worker's lease caps the bound (`bound_by_lease`): a renewal comes up to a heartbeat late
# (at most half the lease) and may then wait the whole bound for the lock; at a third of the
# lease it still lands with a sixth of the lease to spare.
LEASE_SHARE = 1 / 3
_worker_lease: float | None = None


def bound_by_lease(lease_seconds: float) -> float | None:
    """This process is a worker holding leases of `lease_seconds` (runworker --lease-seconds):
    from now on an atomic step is cut at a third of it if the setting allows longer, so that
    no worker's renewal waits for the write lock past its lease. Returns the bound in force."""
    global _worker_lease
    _worker_lease = lease_seconds
    return atomic_step_bound()


def atomic_step_bound(using: str | None = None) -> float | None:
    """Seconds an atomic step may keep its transaction open on this database; None: unbounded."""
    seconds = engine_settings().sqlite_atomic_step_seconds
    if connections[using or engine_alias()].vendor != "sqlite" or not seconds or seconds <= 0:
        return None
    if _worker_lease is not None:
        return min(seconds, _worker_lease * LEASE_SHARE)
    return seconds


@contextmanager
def atomic_step(atomic: transaction.Atomic, step: str = "") -> Iterator[None]:
    """Enter `atomic` (the step's `transaction.atomic()`); on SQLite roll it back and fail with
    `AtomicStepTimeoutError` once it has been open longer than SQLITE_ATOMIC_STEP_SECONDS."""
    using = atomic.using or engine_alias()
    conn = connections[using]
    seconds = atomic_step_bound(using)
    if seconds is None or conn.in_atomic_block:
        with atomic:
            yield
        return
    guard: _Watchdog | None = None
    try:
        with atomic:
            # BEGIN IMMEDIATE has run: the lock is held from here (waiting for it is not counted)
            started = time.monotonic()
            guard = _Watchdog(conn.connection, seconds, step)
            try:
                yield
            finally:
                fired = guard.disarm()  # from here on the watchdog leaves the connection alone
            # Checked before the commit: a step that overran never commits, even if the
            # watchdog had nothing to interrupt and the lock was not wanted meanwhile.
            if fired or time.monotonic() - started > seconds:
                raise AtomicStepTimeoutError(_message(step, seconds))
    except (AtomicStepTimeoutError, LeaseLostError, StepTimeoutError):
        # The step's own timeout stays its outcome (under a worker's lease-capped bound the
        # two often both pass): its retry policy applies, and nothing committed either way.
        raise
    except (Exception, EngineUnavailable) as exc:
        # What the rollback did to the step's code ("interrupted", a savepoint that is gone),
        # or to the engine's checkpoint write, is the bound's doing, not an outage.
        if guard is not None and guard.fired:
            raise AtomicStepTimeoutError(_message(step, seconds)) from exc
        raise


def _message(step: str, seconds: float) -> str:
    setting = engine_settings().sqlite_atomic_step_seconds
    if _worker_lease is not None and setting is not None and seconds < setting:
        why = f"a third of the worker's {_worker_lease:g}s lease; {SETTING} = {setting:g}"
    else:
        why = f"{SETTING} = {seconds:g}"
    return (
        f"atomic step {step!r} kept its transaction open for more than {seconds:g}s and was "
        f"rolled back: on SQLite an atomic step holds the database's only write lock, which "
        f"every worker needs ({why}; do slow work outside atomic steps)"
    )


class _Watchdog:
    """Ends the step's transaction from another thread when the bound passes."""

    def __init__(self, raw: sqlite3.Connection, seconds: float, step: str) -> None:
        self._raw = raw
        self._step = step
        self._seconds = seconds
        self._lock = threading.Lock()
        self._state = "armed"  # -> "fired" (by the timer) or "done" (by the step)
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.name = "tasks-sqlite-atomic-bound"
        self._timer.daemon = True
        self._timer.start()

    @property
    def fired(self) -> bool:
        return self._state == "fired"

    def disarm(self) -> bool:
        """Stop the timer (waiting for a rollback under way); True if it fired."""
        self._timer.cancel()
        with self._lock:
            fired = self._state == "fired"
            if not fired:
                self._state = "done"
        return fired

    def _fire(self) -> None:
        with self._lock:
            if self._state != "armed":
                return
            self._state = "fired"
            try:
                # Both calls are safe from another thread: interrupt() only sets a flag the
                # running statement checks, and the rollback waits for the connection's mutex
                # (without the GIL) until that statement has given up.
                self._raw.interrupt()
                self._rollback()
                # The step's code may still write: into this transaction, rolled back when
                # the step ends, not autocommitted. Deferred: it takes no lock until it writes.
                self._raw.execute("BEGIN")
            except sqlite3.Error as exc:  # the step's own rollback still happens
                get_logger().warning("atomic step bound: rollback failed", error=str(exc))
        get_logger().error(
            "atomic step held SQLite's write lock too long; rolled back",
            step=self._step,
            seconds=self._seconds,
        )

    def _rollback(self) -> None:
        # A statement left half-read keeps the interrupt flag up, and the ROLLBACK would be
        # interrupted too; the step's thread resets it as the error reaches it.
        for delay in (0.0, 0.01, 0.05, 0.1, 0.25, 0.5):
            time.sleep(delay)
            try:
                self._raw.rollback()
                return
            except sqlite3.OperationalError:
                if delay == 0.5:
                    raise


# -- planner statistics -----------------------------------------------------------------------

OPTIMIZE_SECONDS = 3600.0


@dataclass(frozen=True)
class Hints:
    """sqlite_stat1 rows for a table whose queries must read their partial indexes.

    `seeds`: what ANALYZE would write for the table with a few thousand rows in the usual
    shape (a few statuses, most rows finished), written while it has no statistics at all (an
    empty table gets none from ANALYZE). Without any, SQLite prefers the status index, and a
    claim reads every waiting run. `empty`: an empty partial index gets no row either, and
    SQLite then guesses it as large as the table: the status index wins, and keeps winning
    once that index fills up (100,000 sleepers arriving after an ANALYZE that saw none) until
    the next ANALYZE. These queries belong on their partial indexes whatever the sizes, so an
    empty one is recorded as tiny.
    """

    seeds: tuple[tuple[str, str], ...]
    empty: tuple[tuple[str, str], ...]


RUN_HINTS = Hints(
    seeds=(
        ("run_status_created", "10000 2000 1"),
        ("run_claim_pending", "1000 100 1"),
        ("run_wake_due", "1000 1"),
        ("run_lease_expiry", "100 1"),
        ("run_finished", "9000 1"),
    ),
    empty=(
        ("run_claim_pending", "1 1 1"),
        ("run_wake_due", "1 1"),
        ("run_lease_expiry", "1 1"),
        ("run_finished", "1 1"),
    ),
)
_OTHER_TABLES: dict[str, tuple[Callable[[], str], Hints]] = {}


def register_hints(name: str, table: Callable[[], str], hints: Hints) -> None:
    """Another app's claimed table (the outbox's events) gets statistics hints too, from the
    app's `ready()`: `table` names it once the models are loaded. Registered again under the
    same `name`, the last one counts."""
    _OTHER_TABLES[name] = (table, hints)


def _tables() -> dict[str, Hints]:
    from ..models import WorkflowRun

    tables = {WorkflowRun._meta.db_table: RUN_HINTS}
    for table, hints in _OTHER_TABLES.values():
        tables[table()] = hints
    return tables


def optimize(connection: Any) -> bool:
    """Refresh the statistics of the claims' tables (SQLite only; False elsewhere).

    ANALYZE in full: `analysis_limit` samples so few rows that a column with a handful of
    values (the status) looks selective, and the claim keeps the status index (measured). It
    holds the write lock about 0.5 s per million runs (bench/sqlite.py). Then `Hints` fill the
    gaps, and the schema cookie is bumped (an empty table created and dropped): other
    connections load statistics only with the schema, and a worker's connections live as long
    as the worker.
    """
    if connection.vendor != "sqlite":
        return False
    with transaction.atomic(using=connection.alias), connection.cursor() as cur:
        cur.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        existing = {row[0] for row in cur.fetchall()}
        tables = {t: hints for t, hints in _tables().items() if t in existing}
        if not tables:
            return False
        for table, hints in tables.items():
            cur.execute(f'ANALYZE "{table}"')
            cur.execute("SELECT idx FROM sqlite_stat1 WHERE tbl = %s", [table])
            present = {row[0] for row in cur.fetchall()}
            cur.executemany(
                "INSERT INTO sqlite_stat1 (tbl, idx, stat) VALUES (%s, %s, %s)",
                [
                    (table, idx, stat)
                    for idx, stat in (hints.empty if present else hints.seeds)
                    if idx not in present
                ],
            )
        # Load them here (what was just inserted is not yet)...
        cur.execute("ANALYZE sqlite_master")
        # ...and in every other connection, on its next statement: a changed schema cookie
        # makes each reload its schema, statistics included.
        cur.execute("CREATE TABLE tasks_engine_reload_statistics (x INTEGER)")
        cur.execute("DROP TABLE tasks_engine_reload_statistics")
    return True


def analyze_after_migrate(sender: Any, using: str = DEFAULT_DB_ALIAS, **kwargs: Any) -> None:
    """`post_migrate` receiver (connected for the tasks_engine app only): on the engine's alias,
    the one with its tables."""
    if using == engine_alias():
        optimize(connections[using])


_next_optimize: float | None = None
_optimize_lock = threading.Lock()


def optimize_periodically(connection: Any) -> bool:
    """`optimize` once per OPTIMIZE_SECONDS in this process (first on the first call); cheap to
    call often. A failure waits for the next period too (the caller's outage handling)."""
    global _next_optimize
    if connection.vendor != "sqlite":
        return False
    now = time.monotonic()
    with _optimize_lock:
        if _next_optimize is not None and now < _next_optimize:
            return False
        _next_optimize = now + OPTIMIZE_SECONDS
    return optimize(connection)
