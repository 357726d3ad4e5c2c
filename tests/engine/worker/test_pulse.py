"""The beat a supervised worker sends its supervisor (worker/pulse.py): from the heartbeat
thread, down a real pipe, and only while the claim loop turns too."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from tasks_engine.db.sqlite_connections import BUSY_TIMEOUT_SECONDS
from tasks_engine.observe.logs import get_logger
from tasks_engine.worker import pulse
from tasks_engine.worker.heartbeat import Heartbeat, WorkerHooks
from tasks_engine.worker.pulse import PULSE_FD_ENV, STOPPING, Pulse
from tasks_engine.worker.slots import SlotPool
from tasks_engine.worker.supervisor import Supervisor
from tests.helpers import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def beats(fd: int) -> int:
    try:
        return len(os.read(fd, 4096))
    except BlockingIOError:
        return 0


def test_the_heartbeat_stops_beating_once_the_claim_loop_stalls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A claim loop that deadlocks while the heartbeat thread runs on falls silent: the
    supervisor must not take a live heartbeat for a live worker."""
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    monkeypatch.setenv(PULSE_FD_ENV, str(write_end))
    pulse = Pulse.from_environment(stall_seconds=0.5, log=get_logger())
    hooks = WorkerHooks(lambda now: None, lambda held: None, lambda now: None, pulse=pulse.beat)
    heartbeat = Heartbeat(
        SlotPool(1, 0), hooks, lease_seconds=0.6, heartbeat_seconds=0.2, log=get_logger()
    )
    turning = threading.Event()
    turning.set()

    def claim_loop() -> None:
        while turning.is_set():
            pulse.loop_turned()
            time.sleep(0.05)

    loop = threading.Thread(target=claim_loop)
    loop.start()
    heartbeat.start()
    received = 0

    def some_beats() -> bool:
        nonlocal received
        received += beats(read_end)
        return received >= 3

    try:
        wait_for(some_beats, 10, "beats while the claim loop turns")
        turning.clear()  # the claim loop stalls; the heartbeat thread goes on
        loop.join()
        time.sleep(0.5 + 0.3)  # past the stall, plus a heartbeat round to drain the last beats
        beats(read_end)
        time.sleep(0.6)  # three heartbeat rounds
        assert heartbeat.is_alive()
        assert beats(read_end) == 0
        pulse.loop_turned()  # it turns again: beats resume
        wait_for(lambda: beats(read_end) >= 1, 10, "beats once the claim loop turns again")
    finally:
        turning.clear()
        heartbeat.stop.set()
        heartbeat.wake.set()
        heartbeat.join(5)
        os.close(read_end)
        os.close(write_end)


def test_an_unsupervised_worker_beats_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PULSE_FD_ENV, raising=False)
    pulse = Pulse.from_environment(stall_seconds=1.0, log=get_logger())
    assert pulse.fd is None
    pulse.beat(time.monotonic())  # nothing to write to, nothing raised


CHILD = """
import os, sys, time
fd = int(os.environ["TASKS_ENGINE_PULSE_FD"])
os.write(fd, b".")
os.write(fd, sys.argv[1].encode())
time.sleep(float(sys.argv[2]))
"""


def test_a_child_that_said_it_stops_is_given_time_to_stop() -> None:
    """A worker's last seconds of a stop pass without a beat (its heartbeat has stopped): once
    it said so, a silence longer than the supervisor allows a running child is no wedge. (The
    child is a small script, not a worker: it beats once, says it stops, sleeps, exits 0.)"""
    command = [sys.executable, "-c", CHILD, STOPPING.decode(), "1.5"]
    sup = Supervisor(1, burst=True, command=command)
    sup.silence = 0.5
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    # Should it kill and restart the child instead, a SIGTERM ends the supervisor.
    bound = threading.Timer(15.0, os.kill, (os.getpid(), signal.SIGTERM))
    bound.start()
    try:
        code = sup.run()
    finally:
        bound.cancel()
        for s, handler in handlers.items():
            signal.signal(s, handler)
    assert code == 0 and sup.children[0].codes == [0]  # not killed, not restarted


def test_the_silence_allowed_on_sqlite_covers_the_busy_timeout_its_connections_use() -> None:
    """A plain SQLite DATABASES gets the engine's 30 s busy timeout (db/sqlite_connections.py): a
    healthy child may wait that long for a wedged sibling's write lock, so the supervisor's
    allowance must be that long too (it assumed Python's 5 s), and the project's own wins."""
    plain = {"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"}
    assert pulse.sqlite_busy_timeout(plain) == BUSY_TIMEOUT_SECONDS
    assert pulse.sqlite_busy_timeout({**plain, "OPTIONS": {"timeout": 7}}) == 7
    assert pulse.sqlite_busy_timeout({"ENGINE": "django.db.backends.postgresql"}) == 0
