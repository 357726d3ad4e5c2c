"""Group commit: the hot writes of every slot of a worker share statements and commits.

A slot that starts a step or completes a run hands the write to this thread and waits for it.
While one group is in flight the next one gathers, so under load each statement (and each WAL
flush) carries the writes of several runs; an idle worker sends a lone write at once. Every
write keeps its own fence: a write whose attempt lost its lease fails alone with
`LeaseLostError`, as it would on its own. PostgreSQL only (it needs data-modifying CTEs).

Under a backlog the group also claims: a group that completes k runs claims up to k runs (plus
any idle slot's) in the same statement, and hands them to the slots those completions free.
"""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING, Any

from django.db import connection

from .. import transitions
from ..exceptions import EngineUnavailable
from .dbretry import DB_ERRORS, Outage

if TYPE_CHECKING:
    from .loop import Worker

MAX_GROUP = 64


class GroupCommit:
    def __init__(self, worker: Worker, committers: int = 2) -> None:
        self._queue: queue.Queue[transitions.GroupWrite] = queue.Queue()
        self.worker = worker
        self.log = worker.log
        self.committers = committers

    def start(self) -> None:
        for i in range(self.committers):
            name = f"tasks-group-commit-{i}"
            threading.Thread(target=self._commit_loop, name=name, daemon=True).start()

    def submit(self, write: transitions.GroupWrite) -> Any:
        """Called from a slot thread: block until the write's group has committed."""
        self._queue.put(write)
        write.done.wait()
        if isinstance(write.error, DB_ERRORS):
            # Not the workflow's failure: the run is dropped and replayed after its lease.
            raise EngineUnavailable(str(write.error)) from write.error
        if write.error is not None:
            raise write.error
        return write.result

    def _commit_loop(self) -> None:
        outage = Outage(self.log, "group commit")
        while True:
            group = [self._queue.get()]
            while len(group) < MAX_GROUP:
                try:
                    group.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            completing = sum(1 for w in group if w.kind == "complete")
            claim = self.worker.reserve_for_group(completing)
            claimed: list[transitions.Claimed] = []
            try:
                claimed = transitions.write_group(group, claim)
                outage.ok()
            except DB_ERRORS as exc:
                outage.failed(exc)  # closes the connection; the slots see the error
                for write in group:
                    write.error = exc
            except Exception as exc:
                self.log.exception("group commit failed", error=str(exc))
                connection.close()
                for write in group:
                    write.error = exc
            if claim is not None:
                self.worker.take_claimed(claimed, claim.limit)
            for write in group:
                write.done.set()
