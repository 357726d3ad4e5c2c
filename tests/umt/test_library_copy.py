"""The copy into the library (PostgreSQL and SQLite): a title folder on another filesystem (a
real tmpfs mounted behind a symlink) gets its temporary file there, and no failure leaves a
temporary file or a folder of the attempt behind; the copy's memory stays bounded."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import tasks_engine
from tasks_engine.engine import RunView
from tests.helpers import FakeClock, drain, tmpfs
from tests.umt.test_acquire import files, rid, started, write
from tests.umt.test_acquire import media as media
from umt.conf import umt_settings
from umt.library import partial_path
from umt.models import AcquisitionPlan, LibraryItem

pytestmark = pytest.mark.django_db

TITLE = "Sintel (2010)"


def title_folder_on(media: Path, disk: Path) -> Path:
    """`<library>/<title>` as a symlink to another filesystem."""
    link = media / "library" / TITLE
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(disk, target_is_directory=True)
    return link


def everything(root: Path) -> list[str]:
    """Every entry under `root` (folders too), symlinks not followed."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def copied(plan: AcquisitionPlan, source: Path, fake_clock: FakeClock) -> RunView:
    tasks_engine.signal(rid(plan), "download-done", {"content_path": str(source)})
    drain(fake_clock)
    run = tasks_engine.get_run(rid(plan))
    assert run is not None
    return run


def test_a_title_folder_on_another_filesystem_receives_the_file_and_nothing_else(
    media: Path, tmp_path: Path, fake_clock: FakeClock
) -> None:
    plan = started(retention_seconds=0)
    drain(fake_clock)
    source = media / "downloads" / f"{TITLE}.mkv"
    digest = write(source, 600_000)
    data = source.read_bytes()
    with tmpfs(tmp_path / "other-disk", "4m") as disk:
        link = title_folder_on(media, disk)
        run = copied(plan, source, fake_clock)
        assert run.status == "completed", run.error
        item = LibraryItem.objects.get(plan=plan)
        assert (item.path, item.content_hash) == (str(link / f"{TITLE}.mkv"), digest)
        assert (disk / f"{TITLE}.mkv").read_bytes() == data
        assert everything(disk) == [f"{TITLE}.mkv"]
    assert everything(media / "library") == [TITLE]  # the symlink: no .partial/, no .part


@pytest.mark.parametrize(
    ("options", "reason"),
    [(("1m",), "No space left"), (("1m", "ro"), "Read-only file system")],
    ids=["full", "read-only"],
)
def test_a_failing_title_folder_filesystem_is_left_as_it_was(
    media: Path, tmp_path: Path, fake_clock: FakeClock, options: tuple[str, ...], reason: str
) -> None:
    plan = started()
    drain(fake_clock)
    source = media / "downloads" / f"{TITLE}.mkv"
    write(source, 3 * 1024 * 1024)
    with tmpfs(tmp_path / "other-disk", *options) as disk:
        title_folder_on(media, disk)
        run = copied(plan, source, fake_clock)
        assert run.status == "failed"
        assert [s.status for s in run.steps if s.name == "copy-file"] == ["failed"] * 3
        plan.refresh_from_db()
        assert plan.status == "failed" and reason in plan.failure
        assert everything(disk) == []
    assert everything(media / "library") == [TITLE]
    assert not LibraryItem.objects.exists() and source.exists()


def test_a_copy_left_in_the_old_partial_folder_is_removed(
    media: Path, fake_clock: FakeClock
) -> None:
    """A copy in progress when UMT still kept them in `<library>/.partial/` (an upgrade
    mid-copy): the next attempt starts afresh next to the destination."""
    plan = started(retention_seconds=0)
    drain(fake_clock)
    source = media / "downloads" / f"{TITLE}.mkv"
    write(source, 100_000)
    dest = media / "library" / TITLE / f"{TITLE}.mkv"
    key = hashlib.sha256(str(dest).encode()).hexdigest()[:16]
    old = media / "library" / ".partial" / f"{plan.pk}-{key}.part"
    old.parent.mkdir(parents=True)
    old.write_bytes(source.read_bytes()[:30_000])
    assert copied(plan, source, fake_clock).status == "completed"
    assert files(media / "library") == [f"{TITLE}/{TITLE}.mkv"]
    assert everything(media / "library") == [TITLE, f"{TITLE}/{TITLE}.mkv"]


def test_a_killed_copys_leftover_goes_when_the_download_is_gone(
    media: Path, fake_clock: FakeClock
) -> None:
    """A worker killed mid-copy left its temporary file; by the next attempt the download has
    vanished, so no copier runs to continue or remove it: the failed step removes it."""
    plan = started()
    drain(fake_clock)
    dest = media / "library" / TITLE / f"{TITLE}.mkv"
    leftover = partial_path(plan, dest, umt_settings())
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"x" * 50_000)
    run = copied(plan, media / "downloads" / "vanished.mkv", fake_clock)
    assert run.status == "failed"
    plan.refresh_from_db()
    assert plan.status == "failed" and "does not exist" in plan.failure
    assert everything(media / "library") == [TITLE]


COPY_IN_A_CHILD = """
import re, sys, threading
import django
django.setup()
from pathlib import Path
from umt.conf import UmtSettings
from umt.library import Copier, partial_path

class Ctx:
    abort_signal = threading.Event()
    def progress(self, *args): pass
    def raise_if_canceled(self): pass

class Plan:
    pk = 1

def kib(field):
    return int(re.search(field + r":\\s+(\\d+) kB", Path("/proc/self/status").read_text())[1])

library, chunk, sources = Path(sys.argv[1]), int(sys.argv[2]), map(Path, sys.argv[3:])
s = UmtSettings(library_dir=library, copy_chunk_bytes=chunk)
Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from here
baseline = kib("VmRSS")
for source in sources:  # one after the other, as a season pack is copied
    dest = library / "Film" / source.name
    Copier(Ctx(), source, dest, partial_path(Plan, dest, s), s).run(resumed=False)
print((kib("VmHWM") - baseline) * 1024)
"""


@pytest.mark.one_db("no database: the copier alone in a child process")
@pytest.mark.parametrize("files", [1, 4], ids=["single-file", "season-pack"])
def test_the_copy_holds_little_memory_whatever_the_chunk_size(tmp_path: Path, files: int) -> None:
    """A 128 MiB chunk (progress and cancel once per chunk) does not mean a 128 MiB buffer:
    the process's peak stays within 64 MiB of what it held before the copy, for one file and
    for a season pack's files copied one after the other."""
    block = b"".join(i.to_bytes(4, "little") for i in range(256 * 1024))  # 1 MiB
    sources = [tmp_path / "download" / f"S01E{n + 1:02d}.mkv" for n in range(files)]
    sources[0].parent.mkdir()
    for n, source in enumerate(sources):
        with source.open("wb") as f:
            for _ in range(150 // files):
                f.write(block[n:] + block[:n])
    out = subprocess.run(
        [sys.executable, "-c", COPY_IN_A_CHILD, str(tmp_path / "lib"), str(128 << 20)]
        + [str(s) for s in sources],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
    )
    assert out.returncode == 0, out.stderr
    grew = json.loads(out.stdout.strip().splitlines()[-1])
    assert grew < 64 * 1024 * 1024, f"the copy grew the process by {grew >> 20} MiB"
    for source in sources:
        assert (tmp_path / "lib" / "Film" / source.name).read_bytes() == source.read_bytes()


COPY_STOPPED_IN_A_CHILD = """
import sys, threading
import django
django.setup()
from pathlib import Path
from umt.conf import UmtSettings
from umt.library import Copier, CopyVerificationError

class Ctx:
    abort_signal = threading.Event()
    def progress(self, *args): pass
    def raise_if_canceled(self): pass

source, dest, partial = map(Path, sys.argv[1:4])
s = UmtSettings(library_dir=dest.parent.parent, copy_chunk_bytes=1 << 30)  # one chunk
try:
    Copier(Ctx(), source, dest, partial, s).run(resumed=False)
except CopyVerificationError as exc:
    print("refused:", exc)
"""


def copy_stopped_after_writing(tmp_path: Path, meddle: Any) -> tuple[str, Path]:
    """A copy in a child process that stops once its chunk is written and before the copy is
    read back; `meddle(partial)` runs there; returns the child's output and the library."""
    source, library = tmp_path / "film.mkv", tmp_path / "lib"
    source.write_bytes(os.urandom(3 * 1024 * 1024 + 123))
    dest = library / "Film" / "Film.mkv"
    partial = dest.parent / ".umt-1-test.part"
    marker = tmp_path / "stopped"
    child = subprocess.Popen(
        [sys.executable, "-c", COPY_STOPPED_IN_A_CHILD, str(source), str(dest), str(partial)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "UMT_TEST_STOP_AT": "copy-chunk-written",
            "UMT_TEST_STOP_MARKER": str(marker),
        },
    )
    try:
        deadline = time.monotonic() + 60
        while not (marker.exists() and child_stopped(child.pid)):
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the copy never reached copy-chunk-written"
            time.sleep(0.02)
        assert partial.stat().st_size == source.stat().st_size  # written, not yet verified
        meddle(source, partial)
        os.kill(child.pid, signal.SIGCONT)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err
    return out, library


def child_stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.one_db("no database: the copier alone in a child process")
def test_verification_catches_a_copy_corrupted_after_it_was_written(tmp_path: Path) -> None:
    """The copy is hashed as the library's filesystem returns it, not from the bytes UMT
    meant to write: a byte changed in the copy between its write and its read-back fails the
    copy, and nothing stays in the library."""

    def corrupt(_source: Path, partial: Path) -> None:
        with partial.open("r+b") as f:
            f.seek(2 * 1024 * 1024)
            byte = f.read(1)
            f.seek(2 * 1024 * 1024)
            f.write(bytes([byte[0] ^ 0xFF]))

    out, library = copy_stopped_after_writing(tmp_path, corrupt)
    assert "refused: the copy differs from" in out
    assert everything(library) == []


@pytest.mark.one_db("no database: the copier alone in a child process")
def test_a_source_written_to_during_the_copy_fails_the_copy(tmp_path: Path) -> None:
    """The source is read once (hashed on its way to the copy): a write to it during the copy
    is caught by its size and modification time, and nothing stays in the library."""

    def rewrite(source: Path, _partial: Path) -> None:
        with source.open("r+b") as f:
            f.seek(1000)
            f.write(b"changed by the download client")

    out, library = copy_stopped_after_writing(tmp_path, rewrite)
    assert f"refused: {tmp_path / 'film.mkv'} changed while it was copied" in out
    assert everything(library) == []
