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
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from django.db import Error as DatabaseError
from django.db import InterfaceError, OperationalError

from .. import clock
from ..db.sql import (
    fetchall,
    is_postgres,
    p_uuid,
    share_lock,
)
from ..exceptions import EngineUnavailable
from ..models import StepAttempt, WorkflowRun

if TYPE_CHECKING:
    from .hot import HotWrite

RUN = WorkflowRun._meta.db_table
STEP = StepAttempt._meta.db_table
# Attempts that execute code; sleeps, fact waits and child waits are armed timers, not work.
WORK_KINDS = "('function', 'op')"


class Completion(NamedTuple):
    """A finished step's checkpoint, not yet written (see DeferredCompletion)."""

    step_id: int
    output: Any
    finished_at: datetime


class DeferredCompletion:
    """Finished steps whose checkpoints ride on the run's next write (group commit per run).

    A step's completion is not sent on its own: it goes in the same statement as the next
    step's start or the run's completion, halving the round trips of a workflow; the heartbeat
    sends one that waited too long, so the window in which a crash loses a finished step's
    result (and the step runs again, as an interrupted step would) is about a second.

    A completion stays here until a statement that carries it commits (`settle`): every write
    in between carries it again, so a failed send loses nothing, and a write of the run that
    races a send (the heartbeat's and the slot's) carries it too. A second send is harmless.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: tuple[Completion, ...] = ()

    def put(self, step_id: int, output: Any) -> None:
        with self._lock:
            self._items = (*self._items, Completion(step_id, output, clock.now()))

    def pending(self, older_than: float | None = None) -> tuple[Completion, ...]:
        """What the next write must carry (with `older_than`: nothing unless the oldest waited
        that many seconds)."""
        items = self._items
        age = (clock.now() - items[0].finished_at).total_seconds() if items else 0.0
        if older_than is not None and age < older_than:
            return ()
        return items

    def settle(self, sent: tuple[Completion, ...]) -> None:
        """The statement carrying `sent` succeeded: they are written."""
        if not sent:
            return
        ids = {c.step_id for c in sent}
        with self._lock:
            self._items = tuple(c for c in self._items if c.step_id not in ids)

    @contextlib.contextmanager
    def until_commit(self) -> Iterator[None]:
        """A transaction whose statements carry completions: if it rolls back, they are not
        written after all, and go back in the queue."""
        before = self._items
        try:
            yield
        except BaseException:
            with self._lock:
                ids = {c.step_id for c in self._items}
                lost = tuple(c for c in before if c.step_id not in ids)
                self._items = tuple(sorted((*lost, *self._items), key=lambda c: c.step_id))
            raise


class Writer(Protocol):
    """Where an attempt's hot writes go (transitions/hot.py): a worker passes its group writer
    (worker/group_commit.py), which puts several slots' writes in one statement; without one
    (in-process drain, tests, WorkflowTester) each write goes alone on the caller's connection.
    Either fills each write's `result` or `error`."""

    def send(self, write: HotWrite) -> None:
        """Write it and return once it is committed."""

    def hand_off(self, write: HotWrite) -> None:
        """A run's last write: commit it without the caller waiting (its slot goes with it);
        a write that fails is logged and its run replayed after its lease."""


LeaseKey = tuple[uuid.UUID, uuid.UUID]  # (run id, lease token)


@dataclass(frozen=True)
class Lease:
    run_id: uuid.UUID
    token: uuid.UUID
    worker_id: str
    deferred: DeferredCompletion = field(default_factory=DeferredCompletion, compare=False)
    # The run's deadline_at as the claim read it (it never moves): the completion checks it.
    deadline_at: datetime | None = field(default=None, compare=False)
    # None: every hot write goes alone on the caller's connection.
    writer: Writer | None = field(default=None, compare=False)

    @property
    def key(self) -> LeaseKey:
        """(run, lease token): what tells an attempt from another attempt of the same run."""
        return (self.run_id, self.token)


@dataclass(frozen=True)
class Claimed:
    lease: Lease
    run: WorkflowRun  # the row as the claim left it: no second read needed
    # The first step's attempt the claim started (first_steps.py): (step name, step id).
    prestarted: tuple[str, int] | None = None
    at: float = field(default_factory=time.monotonic, compare=False)  # when claimed


@dataclass(frozen=True)
class Renewal:
    """What renewing a lease found (`renew_leases`, keyed by `LeaseKey`)."""

    cancel_requested: bool
    deadline_passed: bool
    # Still held, not extended: its row was locked (a fenced commit inside the holder's atomic
    # step locks it until the step commits; no claim can take it meanwhile). Renew it again soon.
    locked: bool = False


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
