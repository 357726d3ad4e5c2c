"""Test points: a place in UMT's code where a worker stops itself (SIGSTOP), so that a test can
kill it (or change a file) exactly there. Inert unless `UMT_TEST_STOP_AT` names the point;
nothing sets it outside the fault tests (tests/qbittorrent/test_acquire_faults_qbittorrent.py,
tests/test_library_copy.py)."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def stop_here(point: str) -> None:
    if os.environ.get("UMT_TEST_STOP_AT") != point:
        return
    marker = os.environ.get("UMT_TEST_STOP_MARKER")
    if marker:
        Path(marker).write_text(str(os.getpid()))  # tells the test the worker got here
    os.kill(os.getpid(), signal.SIGSTOP)
