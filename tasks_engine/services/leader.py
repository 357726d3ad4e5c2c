"""The maintenance leader: one `runworker` process at a time runs the registered services
(`tasks_engine.services.registry`: pruning, dead-worker detection, schedules, gauges).

Leadership is a lease row (`LeaderLease`) on the database's clock, not a session advisory lock:
every election, renewal and resignation is one autocommit statement, so it works unchanged when
the engine's connections go through a transaction pooler (PgBouncer in transaction mode, where a
session lock would be taken on whichever server connection the statement borrowed, and kept
by it), needs no pinned connection per worker, and is the same code on SQLite. See
ANCHORS-WAVE2.md §3 (River's elector is the model).

- Elected: an expired (or missing) row is taken with a new `term` (one upsert; the database
  decides which of several candidates wins).
- Renewal and resignation name (worker id, term): a leader that lost its lease can never extend
  or end its successor's.
- Trust ends early: the leader counts its lease from the moment it *sent* the renewal, minus a
  margin, on its own monotonic clock, and starts no service past that point (fencing by term).
  A leader that stalls, or cannot reach the database, stops running services before anyone
  else can be elected.
- Graceful stop resigns (expires the row at once) so another worker takes over in a second.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime

from ..conf import engine_settings
from ..db.alias import connection
from ..db.outages import DB_ERRORS, Outage
from ..db.sql import db_now, db_now_sql, execute, fetchall
from ..models import LeaderLease
from . import registry
from .worker_process import WorkerProcess

ROLE = "maintenance"
LEASE = LeaderLease._meta.db_table
TICK_SECONDS = 0.5


@dataclass(frozen=True)
class CurrentLeader:
    worker_id: str
    term: int
    elected_at: datetime
    expires_at: datetime


def current_leader(using: str | None = None) -> CurrentLeader | None:
    """The leader whose lease has not expired (on the database's clock), or None. `using`: the
    alias to read (the admin's, a replica), else the engine's."""
    row = LeaderLease.objects.using(using).filter(name=ROLE, expires_at__gt=db_now()).first()
    if row is None:
        return None
    return CurrentLeader(row.worker_id, row.term, row.elected_at, row.expires_at)


class Elector:
    """One candidate's view of the lease. `refresh()` elects or renews; `leading()` says
    whether this candidate may start a service right now."""

    def __init__(self, worker_id: str, lease_seconds: float | None = None) -> None:
        self.worker_id = worker_id
        self.lease_seconds = lease_seconds or engine_settings().leader_lease_seconds
        self.margin = min(1.0, self.lease_seconds / 4)
        self.term: int | None = None
        self.trusted_until = 0.0
        self._next = 0.0

    def leading(self) -> bool:
        return self.term is not None and time.monotonic() < self.trusted_until

    def renew_every(self) -> float:
        return self.lease_seconds / 5

    def refresh(self) -> bool:
        """Renew the lease if this candidate holds it, else try to take it if it lapsed.
        Returns whether this candidate leads (a new term resets `term`)."""
        sent = time.monotonic()
        self._next = sent + self.renew_every()
        if self.term is not None and self._renew():
            self.trusted_until = sent + self.lease_seconds - self.margin
            return True
        self.term = None
        term = self._elect()
        if term is not None:
            self.term = term
            self.trusted_until = sent + self.lease_seconds - self.margin
        return self.term is not None

    def refresh_if_due(self) -> bool:
        if time.monotonic() >= self._next:
            return self.refresh()
        return self.leading()

    def due_now(self) -> None:
        """The next `refresh_if_due` refreshes: after an outage the leader's next round makes a
        statement, so that only a statement that went through says the database is back."""
        self._next = 0.0

    def resign(self) -> None:
        """Expire this term's lease now, so that another candidate is elected at once."""
        term, self.term = self.term, None
        if term is None:
            return
        now_sql, params = db_now_sql()
        execute(
            f"UPDATE {LEASE} SET expires_at = {now_sql}"
            " WHERE name = %s AND worker_id = %s AND term = %s",
            [*params, ROLE, self.worker_id, term],
        )

    def _renew(self) -> bool:
        expires_sql, params = db_now_sql(self.lease_seconds)
        rows = fetchall(
            f"UPDATE {LEASE} SET expires_at = {expires_sql}"
            " WHERE name = %s AND worker_id = %s AND term = %s RETURNING term",
            [*params, ROLE, self.worker_id, self.term],
        )
        return bool(rows)

    def _elect(self) -> int | None:
        # A read first: while a leader holds the lease (nearly always), candidates write nothing.
        now_sql, now_params = db_now_sql()
        held = fetchall(
            f"SELECT 1 FROM {LEASE} WHERE name = %s AND expires_at > {now_sql}",
            [ROLE, *now_params],
        )
        if held:
            return None
        expires_sql, expires_params = db_now_sql(self.lease_seconds)
        rows = fetchall(
            f"""INSERT INTO {LEASE} (name, worker_id, term, elected_at, expires_at)
                VALUES (%s, %s, 1, {now_sql}, {expires_sql})
                ON CONFLICT (name) DO UPDATE SET worker_id = EXCLUDED.worker_id,
                    term = {LEASE}.term + 1, elected_at = EXCLUDED.elected_at,
                    expires_at = EXCLUDED.expires_at
                WHERE {LEASE}.expires_at <= EXCLUDED.elected_at
                RETURNING term, worker_id""",
            [ROLE, self.worker_id, *now_params, *expires_params],
        )
        if rows and rows[0][1] == self.worker_id:
            return int(rows[0][0])
        return None


class Leader(threading.Thread):
    """The worker's leader thread: stands for election, and while it leads runs each
    registered service about every `service.every` seconds. A service that raises is logged
    and tried again next round; if this thread itself dies, the worker stops (like the
    heartbeat), rather than run on without anyone doing maintenance."""

    def __init__(self, worker: WorkerProcess) -> None:
        super().__init__(name="tasks-leader", daemon=True)
        self.worker = worker
        self.log = worker.log
        self.elector = Elector(worker.id)
        self.stop = threading.Event()
        self._due: dict[str, float] = {}

    def run(self) -> None:
        outage = Outage(self.log, "leader")
        try:
            while not self.stop.is_set():
                try:
                    self.round()
                    outage.ok()
                except DB_ERRORS as exc:
                    self.elector.due_now()
                    self.stop.wait(min(outage.failed(exc), self.elector.renew_every()))
                    continue
                self.stop.wait(TICK_SECONDS)
        except BaseException as exc:
            self.log.exception("leader thread crashed; stopping the worker", error=str(exc))
            self.worker.request_stop()
        finally:
            self.step_down()
            connection.close()

    def round(self) -> None:
        was = self.elector.term
        leading = self.elector.refresh_if_due()
        if self.elector.term != was:
            if self.elector.term is not None:
                self.log.info("elected maintenance leader", term=self.elector.term)
                self._due = {}  # a new leader runs every service at once
            elif was is not None:
                self.log.warning("lost the maintenance leadership", term=was)
        if leading:
            self.run_due_services()

    def run_due_services(self) -> None:
        for service in registry.registered():
            # Fencing by term: no service starts once this leader's trust has lapsed.
            if self.stop.is_set() or not self.elector.refresh_if_due():
                return
            now = time.monotonic()
            if now < self._due.get(service.name, 0.0):
                continue
            self._due[service.name] = now + service.every
            try:
                service.run_once()
            except DB_ERRORS:
                raise  # an outage: the leader backs off and renews before going on
            except Exception as exc:
                self.log.exception(
                    "maintenance service failed", service=service.name, error=str(exc)
                )

    def step_down(self) -> None:
        try:
            self.elector.resign()
        except DB_ERRORS as exc:
            self.log.warning("could not resign the leadership", error=str(exc).strip())
