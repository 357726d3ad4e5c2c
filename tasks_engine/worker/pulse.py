"""The beat a supervised worker sends its supervisor (supervisor.py): one byte down a pipe per
heartbeat round, without the database, so that a wedged child can be told from a busy one.

What a beat means: the heartbeat thread ran a round (at least every second) AND the claim loop
turned within `stall_seconds`. The heartbeat thread, not a slot, beats, so a step that runs
for hours never silences it. But a heartbeat alone would keep beating for a claim loop that
is deadlocked: that worker renews its leases and keeps its row, yet never claims again. So the
heartbeat beats only while the claim loop turns too. A SIGSTOPped process, a deadlocked
heartbeat and a deadlocked claim loop all fall silent, and the supervisor replaces them.
"""

from __future__ import annotations

import os
import time
from typing import Any

from django.conf import settings

from ..conf import engine_settings
from ..db.alias import engine_alias
from ..db.sqlite_connections import busy_timeout_seconds

PULSE_FD_ENV = "TASKS_ENGINE_PULSE_FD"  # set by the supervisor: the pipe's write end
BEAT = b"."
STOPPING = b"!"  # the last beat: the worker stops, and its heartbeat with it
MIN_SILENCE_SECONDS = 3.0  # three heartbeat rounds


def silence_seconds() -> float:
    """How long a supervised child may be silent before the supervisor kills it: twice
    DEAD_WORKER_SECONDS (by then the fleet has counted it dead for as long again and its runs
    are claimable by others, so the kill takes nothing from it that it still held), plus, on
    SQLite, the busy timeout: a healthy child may wait that long for the write lock that a
    wedged sibling holds, and must not be taken for wedged itself."""
    dead = max(MIN_SILENCE_SECONDS, 2 * engine_settings().dead_worker_seconds)
    return dead + sqlite_busy_timeout()


def sqlite_busy_timeout(db: dict[str, Any] | None = None) -> float:
    """Seconds an SQLite statement waits for the write lock (0 on PostgreSQL, whose claims skip
    locked rows and whose engine writes hold row locks only for a statement or a commit): the
    project's OPTIONS timeout, else the one the engine sets on its connections."""
    if db is None:
        db = settings.DATABASES.get(engine_alias(), {})
    if db.get("ENGINE") != "django.db.backends.sqlite3":
        return 0.0
    return busy_timeout_seconds(db)


class Pulse:
    def __init__(self, fd: int | None, stall_seconds: float, log: Any) -> None:
        self.fd = fd
        self.stall_seconds = stall_seconds
        self.log = log
        self.turned_at = time.monotonic()
        self._withheld = False

    @classmethod
    def from_environment(cls, stall_seconds: float, log: Any) -> Pulse:
        """The pipe the supervisor passed down, if any (an unsupervised worker beats nothing)."""
        value = os.environ.get(PULSE_FD_ENV, "")
        fd = int(value) if value.isdigit() else None
        if fd is not None:
            try:
                os.set_blocking(fd, False)  # a supervisor behind on reading never blocks a beat
                os.set_inheritable(fd, False)  # a process a step starts does not hold it open
            except OSError:
                fd = None
        return cls(fd, stall_seconds, log)

    def loop_turned(self) -> None:
        """The claim loop (or the shutdown waiting for its runs) is alive."""
        self.turned_at = time.monotonic()

    def beat(self, now: float) -> None:
        """From the heartbeat thread, every round."""
        if self.fd is None:
            return
        stalled = now - self.turned_at
        if stalled > self.stall_seconds:
            if not self._withheld:
                self._withheld = True
                self.log.error(
                    "claim loop stalled; no longer beating to the supervisor",
                    stalled_seconds=round(stalled, 1),
                )
            return
        self._withheld = False
        self._write(BEAT)

    def stopping(self) -> None:
        """The worker stops its heartbeat now; the rest of its stop (the leader's resignation,
        closing connections) takes a few seconds without a beat."""
        self._write(STOPPING)

    def _write(self, what: bytes) -> None:
        if self.fd is None:
            return
        try:
            os.write(self.fd, what)
        except BlockingIOError:
            pass  # the pipe is full of beats the supervisor has not read yet
        except OSError:
            self.fd = None  # the supervisor is gone
