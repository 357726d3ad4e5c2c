"""`runworker --processes N`: N worker processes under one supervisor that claims nothing.

Each child is the same command line again (Django's own way of re-running itself, as the
autoreloader does), told by the environment that it is a child. The children run in process
groups of their own, so a Ctrl-C at a terminal reaches only the supervisor, which forwards it
once: a child never sees the "second signal" that means "exit at once" by accident.

- Children start one after another: the next once the previous one beats (it is up), or
  STAGGER_SECONDS after it started, so N interpreters do not boot at once on the CPUs.
- SIGTERM/SIGINT: no child starts after it; it is forwarded to every child started; the
  supervisor waits for them all and exits 0 when each stopped cleanly (1 otherwise). A second
  signal is forwarded too (the children exit at once) and the supervisor exits 1.
- A child that exits while the supervisor is not stopping (killed, crashed, its heartbeat or
  leader thread died) is started again, at once if it had run a while, else after a backoff
  that doubles up to 30 s. With --burst, a child that exits 0 has finished and is not
  restarted; the supervisor exits once none is left.
- A wedged child (stopped, or a deadlocked heartbeat or claim loop) stops beating down its pipe
  (pulse.py says what a beat means); silent for `pulse.silence_seconds()` (twice
  DEAD_WORKER_SECONDS), it is killed with SIGKILL, which a stopped process cannot ignore, and
  replaced as a crashed one would be (when stopping, killed only). A child that stops sends a
  last beat that says so, and then gets FINAL_STOP_SECONDS to exit.
- On Linux each child asks to receive SIGTERM when the supervisor dies (prctl
  PR_SET_PDEATHSIG): a supervisor killed with SIGKILL leaves no orphans behind.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from ..observe.logs import get_logger
from .pulse import PULSE_FD_ENV, STOPPING, silence_seconds

CHILD_ENV = "TASKS_ENGINE_WORKER_CHILD"  # set in a child: run one worker, not a supervisor
POLL_SECONDS = 0.2
QUICK_EXIT_SECONDS = 10.0  # a child that dies sooner is restarted after a backoff
MAX_BACKOFF_SECONDS = 30.0
STAGGER_SECONDS = 5.0  # the most a child's start waits for the previous one's first beat
STARTUP_SECONDS = 60.0  # the most a child may take to boot and beat for the first time
FINAL_STOP_SECONDS = 30.0  # the most a child may take to stop after its last beat
PR_SET_PDEATHSIG = 1


def is_child() -> bool:
    return bool(os.environ.get(CHILD_ENV))


def child_index() -> int:
    """This supervised worker's 1-based index (0: not supervised), e.g. for its metrics port."""
    value = os.environ.get(CHILD_ENV, "")
    return int(value) if value.isdigit() else 0


@dataclass
class Child:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    backoff: float = 0.5
    restart_at: float | None = None
    done: bool = False  # exited for good (stopping, or a --burst child that finished)
    codes: list[int] = field(default_factory=list)
    beats: int | None = None  # the read end of its pulse pipe
    last_beat: float | None = None  # None: it has not beaten since it started
    killed: bool = False  # SIGKILLed for its silence; its exit is pending
    stopping: bool = False  # it sent its last beat: it is stopping
    forwarded: int = 0  # how many of the supervisor's signals it was sent

    def booting(self, now: float) -> bool:
        """Started, not beaten yet, for less than STAGGER_SECONDS: the next child waits."""
        up_for = now - self.started
        return self.proc is not None and self.last_beat is None and up_for < STAGGER_SECONDS


class Supervisor:
    def __init__(self, processes: int, *, burst: bool, command: list[str] | None = None) -> None:
        self.command = command or _own_command_line()
        self.burst = burst
        self.children = [Child(i) for i in range(processes)]
        self.log = get_logger(supervisor=os.getpid())
        self.silence = silence_seconds()
        self._signals = 0
        self._signum = signal.SIGTERM

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        while not all(c.done for c in self.children):
            now = time.monotonic()
            self._start_next(now)
            for child in self.children:
                self._read_beats(child, now)
                self._check(child, now)
                self._kill_if_silent(child, now)
            time.sleep(POLL_SECONDS)
        clean = all(self._stopped_cleanly(c) for c in self.children if c.codes)
        self.log.info("supervisor stopped", clean=clean)
        return 0 if clean and self._signals <= 1 else 1

    def _start_next(self, now: float) -> None:
        """Start the next child never started, once none is still booting (and never after a
        signal)."""
        if self._signals or any(c.booting(now) for c in self.children):
            return
        for child in self.children:
            if child.proc is None and not child.codes and not child.done:
                self._start(child)
                return

    def _stopped_cleanly(self, child: Child) -> bool:
        """It exited 0, or the stop signal ended it before it could handle one (it had not
        beaten yet: it held nothing)."""
        code = child.codes[-1]
        return code == 0 or (
            self._signals > 0 and child.last_beat is None and code == -self._signum
        )

    def _check(self, child: Child, now: float) -> None:
        if child.done:
            return
        if child.proc is None:
            if child.restart_at is not None and now >= child.restart_at and not self._signals:
                self._start(child)
            elif self._signals:
                child.done = True
            return
        code = child.proc.poll()
        if code is None:
            return
        child.codes.append(code)
        child.proc = None
        self._close_beats(child)
        if self._signals or (self.burst and code == 0):
            child.done = True
            return
        ran = now - child.started
        delay = 0.0 if ran >= QUICK_EXIT_SECONDS else child.backoff
        child.backoff = 0.5 if ran >= QUICK_EXIT_SECONDS else min(child.backoff * 2, 30.0)
        child.restart_at = now + delay
        self.log.warning(
            "worker process exited; restarting", child=child.index, code=code, restart_in=delay
        )

    def _read_beats(self, child: Child, now: float) -> None:
        if child.beats is None:
            return
        try:
            data = os.read(child.beats, 4096)
        except BlockingIOError:
            return
        if data:
            child.last_beat = now
            child.stopping = child.stopping or STOPPING in data

    def _kill_if_silent(self, child: Child, now: float) -> None:
        if child.proc is None or child.killed:
            return
        if child.last_beat is None:
            silent, limit = now - child.started, max(STARTUP_SECONDS, self.silence)
        else:
            silent, limit = now - child.last_beat, self.silence
        if child.stopping:
            limit = max(limit, FINAL_STOP_SECONDS)
        if silent <= limit:
            return
        child.killed = True
        child.proc.kill()
        self.log.error(
            "worker process silent; killed",
            child=child.index,
            pid=child.proc.pid,
            silent_seconds=round(silent, 1),
            limit_seconds=limit,
            beaten=child.last_beat is not None,
        )

    def _start(self, child: Child) -> None:
        beats, beat_end = os.pipe()
        os.set_blocking(beats, False)
        env = {**os.environ, CHILD_ENV: str(child.index + 1), PULSE_FD_ENV: str(beat_end)}
        try:
            child.proc = subprocess.Popen(
                self.command,
                env=env,
                process_group=0,
                pass_fds=(beat_end,),
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        except BaseException:
            os.close(beats)
            raise
        finally:
            os.close(beat_end)  # the child holds its own copy now
        child.beats = beats
        child.started = time.monotonic()
        child.last_beat = None
        child.killed = False
        child.stopping = False
        child.restart_at = None
        self.log.info("worker process started", child=child.index, pid=child.proc.pid)
        self._forward(child)  # a signal that arrived while it was being started

    def _close_beats(self, child: Child) -> None:
        if child.beats is not None:
            os.close(child.beats)
            child.beats = None

    def _forward(self, child: Child) -> None:
        while child.proc is not None and child.forwarded < self._signals:
            child.forwarded += 1  # before sending: a signal handled meanwhile sends no twice
            if child.proc.poll() is None:
                child.proc.send_signal(self._signum)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._signals += 1
        self._signum = signal.Signals(signum)
        for child in self.children:
            self._forward(child)
        if self._signals > 1:
            os._exit(1)  # the children got the second signal too: they exit at once


def pids(supervisor: Supervisor) -> list[int]:
    return [c.proc.pid for c in supervisor.children if c.proc is not None]


def _own_command_line() -> list[str]:
    from django.utils.autoreload import get_child_arguments

    return [str(a) for a in get_child_arguments()]


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the supervisor dies (Linux)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
