"""Two workers, 500 runs, a random worker SIGKILLed every 2 s for 60 s (bench/soak.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.process


def test_soak_500_runs_with_random_sigkills(fault_db) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "soak.py"),
            "--runs",
            "500",
            "--workers",
            "2",
            "--concurrency",
            "4",
            "--kill-every",
            "2",
            "--duration",
            "60",
            "--step-ms",
            "150",
            "--lease-seconds",
            "2",
            "--log-dir",
            str(fault_db.tmp),
        ],
        env=fault_db.env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    counts = json.loads(out.stdout.strip().splitlines()[-1])
    assert counts["completed"] == 500
    assert counts["fenced_commits"] == counts["atomic_commits"] == counts["ops_done"] == 500
    assert counts["attempts_running"] == 0
    assert counts["kills"] >= 10
    assert counts["attempts_abandoned"] > 0  # the kills really interrupted work
