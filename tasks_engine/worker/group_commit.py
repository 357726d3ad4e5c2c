"""Group commit: the hot writes of every slot of a worker share statements and commits.

A slot that starts a step hands the write to this thread and waits for it. A slot that
completes a run hands over the write and its slot: it takes its next run at once, and the
group gives the slot on to a run it claims (or frees it) after the commit. While one group is
in flight the next one gathers, so under load each statement (and each WAL flush) carries the
writes of several runs; an idle worker sends a lone write at once. Every write keeps its own
fence: a write whose attempt lost its lease fails alone with `LeaseLostError`, as it would on
its own. PostgreSQL only (it needs data-modifying CTEs).

Under a backlog the group also claims: a group that completes k runs claims up to k runs (plus
any idle slot's) in the same statement, and hands them to the slots those completions free.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import TYPE_CHECKING, Any

from django.db import connection

from .. import transitions
from ..exceptions import EngineUnavailable
from ..outages import DB_ERRORS, Outage

if TYPE_CHECKING:
    from .loop import Worker

MAX_GROUP = 64
# How long a group waits for the writes of slots still in user code. Short: under load it
# doubles the writes per statement (half the statements and commits), and a lone run (every
# executing run already waits in the group) never waits.
GATHER_SECONDS = 0.0003
WATCH_SECONDS = 1.0  # how often a waiting slot checks that the writer thread is alive


class GroupCommit:
    def __init__(self, worker: Worker) -> None:
        self._queue: queue.Queue[transitions.GroupWrite] = queue.Queue()
        self.worker = worker
        self.log = worker.log
        self._slot_state = threading.local()
        self.dead = False

    def start(self) -> None:
        # One committer: two (each with its own connection) measured no faster, with half-size
        # groups and twice the commits.
        threading.Thread(target=self._commit_loop, name="tasks-group-commit", daemon=True).start()

    def submit(self, write: transitions.GroupWrite, *, wait: bool = True) -> Any:
        """Called from a slot thread: block until the write's group has committed and return
        its result. Without `wait` (a run's last write), return at once: the slot goes with the
        write, see `took_slot`."""
        if not wait:
            write.detached = True
            self._slot_state.slot = True
            self._queue.put(write)
            return None
        done = getattr(self._slot_state, "done", None)
        if done is None:  # one event per slot thread, reused: a slot waits for one write
            done = self._slot_state.done = threading.Event()
        done.clear()
        write.done = done
        if self.dead:
            raise EngineUnavailable("group commit thread died")
        self._queue.put(write)
        while not done.wait(WATCH_SECONDS):
            if self.dead:  # it died after this write was queued
                raise EngineUnavailable("group commit thread died")
        if isinstance(write.error, DB_ERRORS):
            # Not the workflow's failure: the run is dropped and replayed after its lease.
            raise EngineUnavailable(str(write.error)) from write.error
        if write.error is not None:
            raise write.error
        return write.result

    def took_slot(self) -> bool:
        """Whether the run this slot thread just finished handed its slot to the group."""
        taken = getattr(self._slot_state, "slot", False)
        self._slot_state.slot = False
        return taken

    def _gather(self) -> list[transitions.GroupWrite]:
        """The next group: every write queued now, and those that slots still running user code
        send within GATHER_SECONDS (a run whose slot waits in this group sends nothing more)."""
        group = [self._queue.get()]
        deadline = time.monotonic() + GATHER_SECONDS
        while len(group) < MAX_GROUP:
            try:
                group.append(self._queue.get_nowait())
                continue
            except queue.Empty:
                pass
            waiting = sum(1 for w in group if not w.detached)
            remaining = deadline - time.monotonic()
            if waiting >= self.worker.executing() or remaining <= 0:
                break
            try:
                group.append(self._queue.get(timeout=remaining))
            except queue.Empty:
                break
        return group

    def _one_by_one(self, group: list[transitions.GroupWrite]) -> None:
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

    def _commit_loop(self) -> None:
        outage = Outage(self.log, "group commit")
        try:
            while True:
                self.commit(self._gather(), outage)
        except BaseException as exc:  # a dead writer must stop the worker, not hang its slots
            self.log.exception("group commit thread died; stopping the worker", error=str(exc))
            self.dead = True
            self.worker.request_stop()
            while True:  # fail whatever is queued: its slots drop their runs
                try:
                    write = self._queue.get_nowait()
                except queue.Empty:
                    break
                write.error = EngineUnavailable("group commit thread died")
                if write.done is not None:
                    write.done.set()

    def commit(self, group: list[transitions.GroupWrite], outage: Outage) -> None:
        """Write one group (and, under a backlog, claim with it); tell each write's slot."""
        handed_over = sum(1 for w in group if w.detached)
        claim = self.worker.reserve_for_group(handed_over)
        claimed: list[transitions.Claimed] = []
        try:
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
        except Exception as exc:
            self.log.exception("group commit failed", error=str(exc))
            connection.close()
            for write in group:
                write.error = exc
        self.worker.after_group(claimed, claim.limit if claim else 0, handed_over)
        for write in group:
            if write.done is not None:
                write.done.set()
            elif write.error is not None:  # nobody waits for it: the run is dropped
                self.log.warning(
                    "run completion not written; dropping the run",
                    run_id=str(write.lease.run_id),
                    error=str(write.error),
                )


def _connection_usable() -> bool:
    try:
        return connection.connection is not None and connection.is_usable()
    except DB_ERRORS:
        return False
