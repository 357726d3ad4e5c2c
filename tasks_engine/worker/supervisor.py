"""`runworker --processes N`: N worker processes under one supervisor that claims nothing.

Each child is the same command line again (Django's own way of re-running itself, as the
autoreloader does), told by the environment that it is a child. The children run in process
groups of their own, so a Ctrl-C at a terminal reaches only the supervisor, which forwards it
once: a child never sees the "second signal" that means "exit at once" by accident.

- SIGTERM/SIGINT: forwarded to every child; the supervisor waits for them all and exits 0 when
  each stopped cleanly (1 otherwise). A second signal is forwarded too (the children exit at
  once) and the supervisor exits 1.
- A child that exits while the supervisor is not stopping (killed, crashed, its heartbeat or
  leader thread died) is started again, at once if it had run a while, else after a backoff
  that doubles up to 30 s. With --burst, a child that exits 0 has finished and is not
  restarted; the supervisor exits once none is left.
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

from ..logs import get_logger

CHILD_ENV = "TASKS_ENGINE_WORKER_CHILD"  # set in a child: run one worker, not a supervisor
POLL_SECONDS = 0.2
QUICK_EXIT_SECONDS = 10.0  # a child that dies sooner is restarted after a backoff
MAX_BACKOFF_SECONDS = 30.0
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


class Supervisor:
    def __init__(self, processes: int, *, burst: bool, command: list[str] | None = None) -> None:
        self.command = command or _own_command_line()
        self.burst = burst
        self.children = [Child(i) for i in range(processes)]
        self.log = get_logger(supervisor=os.getpid())
        self._signals = 0

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        for child in self.children:
            self._start(child)
        while not all(c.done for c in self.children):
            now = time.monotonic()
            for child in self.children:
                self._check(child, now)
            time.sleep(POLL_SECONDS)
        clean = all(c.codes and c.codes[-1] == 0 for c in self.children)
        self.log.info("supervisor stopped", clean=clean)
        return 0 if clean and self._signals <= 1 else 1

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

    def _start(self, child: Child) -> None:
        env = {**os.environ, CHILD_ENV: str(child.index + 1)}
        child.proc = subprocess.Popen(
            self.command,
            env=env,
            process_group=0,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        child.started = time.monotonic()
        child.restart_at = None
        self.log.info("worker process started", child=child.index, pid=child.proc.pid)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._signals += 1
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signum)
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
