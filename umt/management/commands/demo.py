"""manage.py demo: UMT's acquisition end to end, on whatever database is configured (an SQLite
file by default), with nothing to configure.

Migrates, starts a worker and an outbox relay (subprocesses), plans an acquisition (the plan and
its outbox event commit together; the relay starts the `acquire` run), plays the downloader's
part (writes the file, runs the completion hook), prints the run's timeline as it goes, stops
its processes and exits 0 (1 if the run did not complete).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tasks_engine.management.cli import positive_float, positive_int
from umt.acquisition import plan_acquisition, report_download_done
from umt.models import AcquisitionPlan, LibraryItem
from umt.timeline import Timeline

MANAGE = Path(__file__).resolve().parents[3] / "manage.py"
MIB = 1024 * 1024


class Command(BaseCommand):
    help = "Run UMT's acquisition workflow end to end with real worker and relay processes."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--title",
            default="Big Buck Bunny (2008)",
            help="what to acquire (default: %(default)r)",
        )
        parser.add_argument(
            "--size-mb",
            type=positive_int,
            default=24,
            help="size of the file the pretend downloader writes (default: %(default)r)",
        )
        parser.add_argument(
            "--media",
            type=Path,
            default=None,
            help="folder for downloads/ and library/ (default: a new temporary "
            "folder, kept afterwards)",
        )
        parser.add_argument(
            "--timeout",
            type=positive_float,
            default=120.0,
            help="give up after this many seconds (default: %(default)r)",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        call_command("migrate", verbosity=0, interactive=False)
        media = opts["media"] or Path(tempfile.mkdtemp(prefix="umt-demo-"))
        db = settings.DATABASES["default"]
        self.stdout.write(self.style.MIGRATE_HEADING("UMT acquisition demo"))
        self.stdout.write(f"database: {db['ENGINE'].rsplit('.', 1)[-1]} {db['NAME']}")
        self.stdout.write(f"media:    {media}/downloads, {media}/library")
        procs = self._start(media)
        try:
            status = self._acquire(media, opts)
        finally:
            self._stop(procs)
        if status != "completed":
            raise CommandError(f"the run ended {status}; logs: {media}/*.log")

    # -- the story ------------------------------------------------------------------------------

    def _acquire(self, media: Path, opts: dict[str, Any]) -> str:
        title, size = opts["title"], opts["size_mb"] * MIB
        source = f"{title}.mkv"
        plan = plan_acquisition(title=title, source=source, retention_seconds=2)
        self.stdout.write(
            f"planned #{plan.pk} {title!r}: the plan row and its outbox event "
            "acquisition.planned committed in one transaction"
        )
        end = time.monotonic() + opts["timeout"]
        run_id = self._wait(end, lambda: AcquisitionPlan.objects.get(pk=plan.pk).run_id)
        if run_id is None:
            return "never started (is the relay running? see relay.log)"
        self.stdout.write(f"the relay dispatched it: acquire run {run_id}")
        timeline = Timeline(run_id, self.stdout.write)
        downloaded = False
        while time.monotonic() < end:
            view = timeline.poll()
            if view.finished:
                self._report(plan.pk, view.status)
                return view.status
            if not downloaded and view.waiting_on == "fact:download-done":
                self._download(media / "downloads" / source, size, plan.pk, timeline)
                downloaded = True
            time.sleep(0.1)
        return "timed out"

    def _download(self, path: Path, size: int, plan_id: int, timeline: Timeline) -> None:
        """The downloader's part: write the file, then run the completion hook's code."""
        block = hashlib.sha256(path.name.encode()).digest() * (MIB // 32)
        with path.open("wb") as f:
            for _ in range(size // MIB):
                f.write(block)
        timeline.note(f"downloader wrote {size // MIB} MiB to downloads/{path.name}")
        res = report_download_done(f"plan:{plan_id}", str(path))[0].signaled
        said = "delivered" if res.delivered else f"not delivered ({res.status})"
        timeline.note(f"downloader ran the hook: umt_download_done plan:{plan_id} -> {said}")

    def _report(self, plan_id: int, status: str) -> None:
        item = LibraryItem.objects.filter(plan_id=plan_id).first()
        if status == "completed" and item is not None:
            self.stdout.write(self.style.SUCCESS(f"library: {item.path}"))
            self.stdout.write(
                f"          {item.size // MIB} MiB, "
                f"{item.hash_algorithm} {item.content_hash[:16]}…, "
                f"registered {item.registered_at:%H:%M:%S}"
            )
        run_id = AcquisitionPlan.objects.get(pk=plan_id).run_id
        self.stdout.write(f"inspect it: {_python()} manage.py tasks inspect {run_id}")
        self.stdout.write("browse it:  make admin")

    @staticmethod
    def _wait(end: float, probe: Any) -> Any:
        while time.monotonic() < end:
            value = probe()
            if value:
                return value
            time.sleep(0.1)
        return None

    # -- processes ------------------------------------------------------------------------------

    def _start(self, media: Path) -> list[tuple[str, subprocess.Popen[bytes]]]:
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "UMT_LIBRARY_DIR": str(media / "library"),
            "UMT_DOWNLOADS_DIR": str(media / "downloads"),
            "UMT_COPY_CHUNK_BYTES": str(MIB),
            "UMT_COPY_RATE_LIMIT": str(12 * MIB),  # slow enough to watch the progress
        }
        (media / "downloads").mkdir(parents=True, exist_ok=True)
        procs = []
        for name, args in [
            ("worker", ["runworker", "--concurrency", "2", "--poll-interval", "0.2"]),
            ("relay", ["runrelay", "--poll-interval", "0.2"]),
        ]:
            log = open(media / f"{name}.log", "wb")  # noqa: SIM115 - closed by the child's exit
            proc = subprocess.Popen(
                [sys.executable, str(MANAGE), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
            log.close()  # the child holds its own copy
            procs.append((name, proc))
            self.stdout.write(f"started a {name} (pid {proc.pid}, log {media / f'{name}.log'})")
        return procs

    def _stop(self, procs: list[tuple[str, subprocess.Popen[bytes]]]) -> None:
        for _, proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in procs:
            try:
                code = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            self.stdout.write(f"{name} stopped (exit {code})")


def _python() -> str:
    """This interpreter as the user can type it here: `.venv/bin/python` after `make demo`
    (no virtualenv is activated), `python` when it is the one on PATH."""
    exe = Path(sys.executable)
    if shutil.which("python") == str(exe):  # an activated virtualenv's, say
        return "python"
    try:
        return str(exe.relative_to(Path.cwd()))
    except ValueError:
        return str(exe)
