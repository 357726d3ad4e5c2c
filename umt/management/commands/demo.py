"""manage.py demo: the main job end to end on whatever database is configured (SQLite by default).

Migrates, starts a worker process, enqueues a run, prints its timeline as it goes, stops the
worker and exits 0 (1 if the run did not complete).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tasks_engine import engine
from tasks_engine.states import FINISHED


class Command(BaseCommand):
    help = "Run the demo workflow end to end with a real worker process and print its timeline."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--title", default="Big Buck Bunny (2008) 2160p",
                            help="what to ingest (default: %(default)r)")
        parser.add_argument("--timeout", type=float, default=120.0,
                            help="give up after this many seconds (default: %(default)r)")

    def handle(self, *args: Any, **opts: Any) -> None:
        call_command("migrate", verbosity=0, interactive=False)
        self.stdout.write(self.style.MIGRATE_HEADING("UMT durable tasks demo"))
        worker = self._start_worker()
        try:
            res = engine.enqueue("ingest_demo", {"title": opts["title"], "retention_seconds": 2})
            self.stdout.write(f"enqueued ingest_demo run {res.run_id}")
            status = self._follow(res.run_id, opts["timeout"])
        finally:
            self._stop(worker)
        view = engine.get_run(res.run_id)
        assert view is not None
        if status != "completed":
            raise CommandError(f"run ended {status}: {view.error}")
        self.stdout.write(self.style.SUCCESS(f"completed: {view.output}"))
        self.stdout.write(f"inspect it: python manage.py tasks inspect {res.run_id}")

    def _start_worker(self) -> subprocess.Popen[bytes]:
        manage = Path(__file__).resolve().parents[3] / "manage.py"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        log = open(manage.parent / "demo-worker.log", "wb")  # noqa: SIM115 - lives with the worker
        self.stdout.write(f"started a worker (log: {log.name})")
        return subprocess.Popen(
            [sys.executable, str(manage), "runworker", "--concurrency", "2",
             "--poll-interval", "0.2"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        )

    def _stop(self, worker: subprocess.Popen[bytes]) -> None:
        worker.send_signal(signal.SIGTERM)
        try:
            code = worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            code = worker.wait()
        self.stdout.write(f"worker stopped (exit {code})")

    def _follow(self, run_id: Any, timeout: float) -> str:
        seen: dict[tuple[str, int], str] = {}
        last_status = last_progress = None
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            view = engine.get_run(run_id)
            assert view is not None
            for s in view.steps:
                if seen.get((s.name, s.attempt)) != s.status:
                    seen[(s.name, s.attempt)] = s.status
                    self.stdout.write(f"  step   {s.name:<12} {s.kind:<9} #{s.attempt} {s.status}")
            if view.status != last_status:
                extra = f" ({view.waiting_on})" if view.waiting_on else ""
                self.stdout.write(f"  run    {view.status}{extra}")
                last_status = view.status
            if view.progress and view.progress != last_progress:
                last_progress = view.progress
                self.stdout.write(f"  progress {view.progress.get('message')}")
            if view.status in FINISHED:
                return view.status
            time.sleep(0.2)
        return "timed out"
