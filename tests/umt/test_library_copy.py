"""The copy into the library (PostgreSQL and SQLite): a title folder on another filesystem (a
real tmpfs mounted behind a symlink) gets its temporary file there, and no failure leaves a
temporary file or a folder of the attempt behind; the copy's memory stays bounded."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

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

source, library, chunk = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
s = UmtSettings(library_dir=library, copy_chunk_bytes=chunk)
dest = library / "Film" / "Film.mkv"
Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from here
baseline = kib("VmRSS")
Copier(Ctx(), source, dest, partial_path(Plan, dest, s), s).run(resumed=False)
print((kib("VmHWM") - baseline) * 1024)
"""


def test_the_copy_holds_little_memory_whatever_the_chunk_size(tmp_path: Path) -> None:
    """A 128 MiB chunk (progress and cancel once per chunk) does not mean a 128 MiB buffer:
    the process's peak stays within 64 MiB of what it held before the copy."""
    source = tmp_path / "film.mkv"
    block = b"".join(i.to_bytes(4, "little") for i in range(256 * 1024))  # 1 MiB
    with source.open("wb") as f:
        for _ in range(150):
            f.write(block)
    out = subprocess.run(
        [sys.executable, "-c", COPY_IN_A_CHILD, str(source), str(tmp_path / "lib"), str(128 << 20)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
    )
    assert out.returncode == 0, out.stderr
    grew = json.loads(out.stdout.strip().splitlines()[-1])
    assert grew < 64 * 1024 * 1024, f"the copy grew the process by {grew >> 20} MiB"
    assert (tmp_path / "lib" / "Film" / "Film.mkv").read_bytes() == source.read_bytes()
