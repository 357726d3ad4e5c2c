"""Group commit: the hot writes of every slot of a worker share statements and commits.

The worker passes this writer to its runs (`transitions.Writer`). A slot that starts a step
hands the write to this thread and waits for it. A slot that completes a run hands over the
write and its slot: it takes its next run at once, and the group gives the slot on to a run it
claims (or frees it) after the commit. While one group is in flight the next one gathers, so
under load each statement (and each WAL flush) carries the writes of several runs; an idle
worker sends a lone write at once. Every write keeps its own fence: a write whose attempt lost
its lease fails alone with `LeaseLostError`, as it would on its own; a row the database
refuses fails alone too. On PostgreSQL a group is one statement (data-modifying CTEs); on
SQLite, where only a worker's async runs use a group writer (`sqlite=True`), it is one
transaction, each write in a savepoint (`transitions.write_group_sqlite`): one commit and one
sync of the WAL for the group instead of one a write, each queued behind the only write lock.
A SQLite group claims nothing: the claim loop claims there.

Under a backlog the group also claims: a group that completes k runs claims up to k runs (plus
any idle slot's) in the same statement, and hands them to the slots those completions free.
Not while flow control guards the worker's claims (`SlotPool.claims_ahead`): the claim loop
claims then, on its own connection, so this thread never waits for a limited queue's lock.

If this thread dies (say its log stream broke: a log call raised), the worker's watch over its
side loops stops the worker (loop.py), and every write the thread held, the group in hand and
the queue behind it, fails with EngineUnavailable: a waiting slot raises it, and a handed-off
completion is dropped, its slot freed and its claim's span ended (`HotWrite.dropped`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
import time
from typing import Any

from .. import transitions
from ..db.alias import connection
from ..db.outages import DB_ERRORS, Outage, drop_if_cut
from ..db.pooler import behind_transaction_pooler
from ..exceptions import EngineUnavailable
from .slots import SlotPool

MAX_GROUP = 64
# How long a group waits for the writes of slots still in user code. Short: under load it
# doubles the writes per statement (half the statements and commits), and a lone run (every
# executing run already waits in the group) never waits.
GATHER_SECONDS = 0.0003
WATCH_SECONDS = 1.0  # how often a waiting slot checks that the writer thread is alive

Queued = tuple[transitions.HotWrite, threading.Event | None]  # None: nobody waits for it


class GroupCommit(threading.Thread):
    """The group writer: one thread, one connection. `claims` is what the worker claims (its
    limit and held runs are filled in per group)."""

    def __init__(
        self,
        slots: SlotPool,
        claims: transitions.ClaimRequest,
        log: Any,
        *,
        sqlite: bool = False,
    ) -> None:
        # One committer: two (each with its own connection) measured no faster, with half-size
        # groups and twice the commits.
        super().__init__(name="tasks-group-commit", daemon=True)
        self.sqlite = sqlite
        self._queue: queue.Queue[Queued | None] = queue.Queue()  # None: stop
        self.slots = slots
        self.claims = claims
        self.log = log
        self._slot_state = threading.local()
        self._tuned: Any = None  # the connection _tune_session set up
        self._in_hand: list[Queued] = []  # the group taken off the queue, until it is told
        self._slots_given = True  # the group in hand's handed-over slots went to after_group
        self.dead = False

    # -- the Writer interface (transitions/_common.py), called from slot threads -------------

    def send(self, write: transitions.HotWrite) -> None:
        """Block until the write's group has committed (its result or error filled in). Once
        this thread died, the write goes alone on the caller's connection: the worker is
        stopping, and its slots hand their runs back."""
        if self.dead:
            transitions.write_alone(write)
            return
        done = getattr(self._slot_state, "done", None)
        if done is None:  # one event per slot thread, reused: a slot waits for one write
            done = self._slot_state.done = threading.Event()
        done.clear()
        self._queue.put((write, done))
        while not done.wait(WATCH_SECONDS):
            if self.dead:  # it died after this write was queued
                if write.result is None and write.error is None:
                    write.error = EngineUnavailable("group commit thread died")
                return

    def hand_off(self, write: transitions.HotWrite) -> None:
        """A run's last write: return at once; the slot goes with the write."""
        if self.dead or not self.slots.hand_over(write.lease):
            self.send(write)  # a slot written off (or no writer left): write it now
            write.outcome()
            return
        write.detached = True
        self._queue.put((write, None))
        if self.dead:  # it died as this was queued, after its last look at the queue
            self._fail_queued()

    # -- the writer thread -----------------------------------------------------------------------

    def stop(self) -> None:
        """End the thread once the writes queued before are committed."""
        self._queue.put(None)

    def run(self) -> None:
        outage = Outage(self.log, "group commit")
        try:
            while True:
                group = self._gather()
                if not group:
                    return
                self.commit([write for write, _ in group], outage)
                for _, done in group:
                    if done is not None:
                        done.set()
                self._in_hand = []
        except BaseException as exc:  # the worker's watch (loop.py) stops the worker
            with contextlib.suppress(Exception):  # a broken log stream may be what killed it
                self.log.exception("group commit thread died", error=str(exc))
        finally:
            self.dead = True  # from now on each write goes alone (see `send`)
            try:
                self._fail_held()
            finally:
                connection.close()

    def _fail_held(self) -> None:
        """This thread ended: each write it held and did not write, in the group in hand (which
        it died with) or queued, fails; their slots drop their runs."""
        in_hand, self._in_hand = self._in_hand, []
        if not self._slots_given:  # it died before the group's after_group
            handed_over = sum(1 for write, _ in in_hand if write.detached)
            if handed_over:
                self.slots.after_group([], 0, handed_over)
        for write, done in in_hand:
            _give_up(write, done)
        self._fail_queued()

    def _fail_queued(self) -> None:
        """Whatever was queued when this thread died: its slots drop their runs. (Also called
        by `hand_off` for a write queued as the thread died: each is taken off once.)"""
        while True:
            try:
                queued = self._queue.get_nowait()
            except queue.Empty:
                return
            if queued is None:
                continue
            write, done = queued
            if write.detached:
                self.slots.after_group([], 0, 1)  # the slot it took along is free again
            _give_up(write, done)

    def _gather(self) -> list[Queued]:
        """The next group: every write queued now, and those sent within GATHER_SECONDS by
        slots still running user code and by prefetched runs an idle slot thread starts (a run
        whose slot waits in this group sends nothing more). Counting the prefetched runs puts a
        claimed run's first write into the group after its claim, not the one after that."""
        first = self._queue.get()
        if first is None:
            return []
        # In hand from now on: if this thread dies before the group is told, `_fail_held`
        # fails what it holds.
        group = self._in_hand = [first]
        self._slots_given = False
        deadline = time.monotonic() + GATHER_SECONDS
        while len(group) < MAX_GROUP:
            try:
                queued = self._queue.get_nowait()
            except queue.Empty:
                pass
            else:
                if queued is None:
                    self._queue.put(None)  # after this group
                    break
                group.append(queued)
                continue
            waiting = sum(1 for _, done in group if done is not None)
            remaining = deadline - time.monotonic()
            if waiting >= self.slots.yet_to_write() or remaining <= 0:
                break
            try:
                queued = self._queue.get(timeout=remaining)
            except queue.Empty:
                break
            if queued is None:
                self._queue.put(None)
                break
            group.append(queued)
        return group

    def commit(self, group: list[transitions.HotWrite], outage: Outage) -> None:
        """Write one group (and, under a backlog, claim with it); fill in each write's
        result or error."""
        handed_over = sum(1 for w in group if w.detached)
        if self.sqlite:
            self._commit_sqlite(group, handed_over, outage)
            return
        limit = self.slots.reserve_for_group(handed_over)
        claim = None
        if limit:
            claim = dataclasses.replace(self.claims, limit=limit, held=self.slots.held_ids())
        claimed: list[transitions.Claimed] = []
        try:
            drop_if_cut()
            self._tune_session()
            claimed = transitions.write_group(group, claim)
            outage.ok()
        except DB_ERRORS as exc:
            if len(group) > 1 and _connection_usable():
                # The database refused a row (a constraint, a value it cannot store), not the
                # connection: find it by writing each alone, so the others commit.
                self._one_by_one(group)
            else:
                outage.failed(exc)  # closes the connection; the slots see the error
                for write in group:
                    write.error = exc
        except Exception as exc:  # noqa: BLE001 - _crashed logs it with its traceback
            self._crashed(group, exc)
        finally:
            self.slots.after_group(claimed, limit, handed_over)
            self._slots_given = True
        self._report_dropped(group)

    def _commit_sqlite(
        self, group: list[transitions.HotWrite], handed_over: int, outage: Outage
    ) -> None:
        """`commit` on SQLite: one transaction, no claim. A refused row failed its write alone
        (its savepoint); an error at the BEGIN or the COMMIT (the write lock not had within the
        busy timeout, the disk) fails the group, an outage."""
        try:
            transitions.write_group_sqlite(group)
            outage.ok()
        except DB_ERRORS as exc:
            outage.failed(exc)
            for write in group:
                write.error = exc
        except Exception as exc:  # noqa: BLE001 - _crashed logs it with its traceback
            self._crashed(group, exc)
        finally:
            self.slots.after_group([], 0, handed_over)
            self._slots_given = True
        self._report_dropped(group)

    def _crashed(self, group: list[transitions.HotWrite], exc: Exception) -> None:
        """Not the database's refusal: a defect. Every write of the group fails with it, and
        the connection goes (its state is unknown)."""
        self.log.exception("group commit failed", error=str(exc))
        connection.close()
        for write in group:
            write.error = exc

    def _report_dropped(self, group: list[transitions.HotWrite]) -> None:
        for write in group:
            if write.detached and write.error is not None:  # nobody waits: the run is dropped
                self.log.warning(
                    "run completion not written; dropping the run",
                    run_id=str(write.lease.run_id),
                    error=str(write.error),
                )
                write.dropped()

    def _tune_session(self) -> None:
        """This thread's session runs the hot statements alone, each a lookup by primary key
        or partial index: it plans them without sequential scans. (Its generic plans are made
        while the tables are young and their statistics small: the step UPDATE was then a
        sequential scan of every attempt, 2.3 ms a group after 5,000 runs, bench/PROFILE.md.)
        Not behind a transaction pooler, where a session setting does not stay."""
        raw = connection.connection
        if raw is not None and raw is self._tuned:
            return
        connection.ensure_connection()
        if not behind_transaction_pooler():
            with connection.cursor() as cur:
                cur.execute("SET enable_seqscan = off")
        self._tuned = connection.connection

    def _one_by_one(self, group: list[transitions.HotWrite]) -> None:
        for write in group:
            try:
                transitions.write_group([write])
            except DB_ERRORS as exc:
                self.log.error(
                    "database refused a write; dropping its run",
                    run_id=str(write.lease.run_id),
                    error=str(exc).strip(),
                )
                write.error = exc


def _give_up(write: transitions.HotWrite, done: threading.Event | None) -> None:
    """A write the dead thread held: an error unless it was written, its slot woken, and a
    detached one that failed dropped (its `ended` hears None, its claim's span ends)."""
    if write.result is None and write.error is None:
        write.error = EngineUnavailable("group commit thread died")
    if done is not None:
        done.set()
    if write.detached and write.error is not None:
        write.dropped()


def _connection_usable() -> bool:
    try:
        return connection.connection is not None and connection.is_usable()
    except DB_ERRORS:
        return False
