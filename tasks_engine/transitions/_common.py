"""What every transition module shares: tables, the lease, and the fence."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import Error as DatabaseError
from django.db import InterfaceError, OperationalError

from .. import clock
from ..exceptions import EngineUnavailable
from ..models import StepAttempt, WorkflowRun
from ..sql import (
    fetchall,
    is_postgres,
    p_uuid,
    share_lock,
)

RUN = WorkflowRun._meta.db_table
STEP = StepAttempt._meta.db_table
# Attempts that execute code; sleeps, fact waits and child waits are armed timers, not work.
WORK_KINDS = "('function', 'op')"


class DeferredCompletion:
    """A finished step whose checkpoint rides on the run's next write (group commit per run).

    A step's completion is not sent on its own: it goes in the same statement as the next
    step's start or the run's completion, halving the round trips of a workflow. Every other
    write of the attempt sends it first, and the heartbeat sends one that waited too long, so
    the window in which a crash loses a finished step's result (and the step runs again, as an
    interrupted step would) is the user code between two steps, at most about a second.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._item: tuple[int, Any, datetime] | None = None

    def put(self, step_id: int, output: Any) -> tuple[int, Any, datetime] | None:
        with self._lock:
            previous, self._item = self._item, (step_id, output, clock.now())
        return previous

    def restore(self, item: tuple[int, Any, datetime]) -> None:
        """Put back a completion whose write failed, unless a newer one took its place."""
        with self._lock:
            if self._item is None:
                self._item = item

    def take(self, older_than: float | None = None) -> tuple[int, Any, datetime] | None:
        with self._lock:
            item = self._item
            if item is None:
                return None
            if older_than is not None and (clock.now() - item[2]).total_seconds() < older_than:
                return None
            self._item = None
            return item


@dataclass(frozen=True)
class Lease:
    run_id: uuid.UUID
    token: uuid.UUID
    worker_id: str
    deferred: DeferredCompletion = field(default_factory=DeferredCompletion, compare=False)
    # A worker's group commit (worker/group_commit.py): the hot writes of all its slots share
    # statements and commits. None: every write goes on its own.
    group: Any = field(default=None, compare=False)


@dataclass(frozen=True)
class Claimed:
    lease: Lease
    run: WorkflowRun  # the row as the claim left it: no second read needed
    at: float = field(default_factory=time.monotonic, compare=False)  # when claimed


@dataclass(frozen=True)
class Renewal:
    cancel_requested: bool
    deadline_passed: bool
    token: uuid.UUID | None = field(default=None, compare=False)  # the lease renewed


def _fence(*, unless_canceled: bool = False) -> str:
    canceled = " AND cancel_requested_at IS NULL" if unless_canceled else ""
    return (
        f"EXISTS (SELECT 1 FROM {RUN} WHERE id = %s AND lease_token = %s{canceled}{share_lock()})"
    )


def held_row(lease: Lease, column: str = "1", lock: str = "") -> tuple[Any, ...] | None:
    """The run's row (one column of it) if this attempt still holds the run, else None. `lock`
    (" FOR UPDATE" or " FOR SHARE") applies on PostgreSQL; SQLite has one writer."""
    rows = fetchall(
        f"SELECT {column} FROM {RUN} WHERE id = %s AND lease_token = %s"
        + (lock if is_postgres() else ""),
        _fence_params(lease),
    )
    return rows[0] if rows else None


def holds(lease: Lease) -> bool:
    """Whether the attempt still holds its run: after a fenced write with a further condition
    matched nothing, this tells a lost lease from the condition."""
    return held_row(lease) is not None


def _fence_params(lease: Lease) -> list[Any]:
    return [p_uuid(lease.run_id), p_uuid(lease.token)]


# The errors of a connection or server (not of a statement's data): in a block that also runs
# user code, only these are outages; a constraint the user's own write breaks is the user's.
TRANSIENT_ERRORS: tuple[type[DatabaseError], ...] = (OperationalError, InterfaceError)


@contextlib.contextmanager
def outage_guard(
    what: str, errors: tuple[type[BaseException], ...] = (DatabaseError,)
) -> Iterator[None]:
    """A database error inside the block (its BEGIN and COMMIT included) is an outage, not the
    workflow's failure: it becomes `EngineUnavailable`, a BaseException that unwinds user code
    like a suspension; the worker backs off and the run is replayed."""
    try:
        yield
    except errors as exc:
        raise EngineUnavailable(f"{what}: {exc}".strip()) from exc


def attempt_write[**P, R](fn: Callable[P, R]) -> Callable[P, R]:
    """Marks a write (or read) an attempt makes while it runs: a database error there (a
    dropped connection, a deadlock, a serialization failure, a statement timeout, SQLite's
    "database is locked") is an outage (see `outage_guard`)."""

    @functools.wraps(fn)
    def write(*args: P.args, **kwargs: P.kwargs) -> R:
        with outage_guard(fn.__name__):
            return fn(*args, **kwargs)

    return write
