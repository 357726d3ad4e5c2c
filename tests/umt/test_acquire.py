"""The acquire workflow in-process with the folder client (PostgreSQL and SQLite): plan -> outbox
-> run, the completion hook command, the copy's reconciliation, retention and cleanup."""

from __future__ import annotations

import hashlib
import io
import uuid
from pathlib import Path
from typing import Any

import pytest
import xxhash
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction
from django.test import override_settings

import tasks_engine
from outbox.models import OutboxEvent
from outbox.relay import relay_once
from tasks_engine.models import OpLedger
from tests.helpers import FakeClock, drain
from umt.acquisition import PLANNED, plan_acquisition
from umt.conf import umt_settings
from umt.library import partial_path
from umt.models import AcquisitionPlan, LibraryItem

pytestmark = pytest.mark.django_db


@pytest.fixture
def media(tmp_path: Path) -> Any:
    settings = {
        "LIBRARY_DIR": str(tmp_path / "library"),
        "DOWNLOADS_DIR": str(tmp_path / "downloads"),
        "RETENTION_SECONDS": 3600,
        "COPY_CHUNK_BYTES": 64 * 1024,
    }
    with override_settings(UMT=settings):
        yield tmp_path


def write(path: Path, size: int, seed: int = 1) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    block = hashlib.sha256(str(seed).encode()).digest() * 4096  # 128 KiB, not all zeros
    data = (block * (size // len(block) + 1))[:size]
    path.write_bytes(data)
    return xxhash.xxh3_128_hexdigest(data)


def rid(plan: AcquisitionPlan) -> uuid.UUID:
    assert plan.run_id is not None, f"plan #{plan.pk} has no run"
    return plan.run_id


def files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def partial_of(plan: AcquisitionPlan, media: Path) -> Path:
    dest = media / "library" / "Sintel (2010)" / "Sintel (2010).mkv"
    return partial_path(plan, dest, umt_settings())


def started(title: str = "Sintel (2010)", **kw: Any) -> AcquisitionPlan:
    plan = plan_acquisition(title=title, source=f"{title}.mkv", **kw)
    relay_once()
    plan.refresh_from_db()
    assert plan.run_id is not None
    return plan


def test_a_plan_and_its_event_commit_together() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        plan_acquisition(title="Gone", source="gone.mkv")
        raise RuntimeError("rolled back")
    assert not AcquisitionPlan.objects.exists() and not OutboxEvent.objects.exists()
    plan = plan_acquisition(title="Kept", source="kept.mkv")
    event = OutboxEvent.objects.get()
    assert (event.type, event.payload, event.idempotency_key) == (
        PLANNED,
        {"plan_id": plan.pk},
        f"plan:{plan.pk}",
    )
    relay_once()
    plan.refresh_from_db()
    run = tasks_engine.get_run(rid(plan))
    assert run is not None and (run.task_name, run.queue, run.input) == (
        "acquire",
        "io",
        {"plan_id": plan.pk},
    )


def test_happy_path_with_the_folder_client(media: Path, fake_clock: FakeClock) -> None:
    plan = started(retention_seconds=60)
    assert drain(fake_clock) == ["suspended"]
    run = tasks_engine.get_run(rid(plan))
    assert run is not None and (run.status, run.waiting_on) == ("waiting", "fact:download-done")
    plan.refresh_from_db()
    assert plan.status == "downloading"
    source = media / "downloads" / "Sintel (2010).mkv"
    digest = write(source, 300_000)  # the downloader's part
    out = io.StringIO()
    call_command("umt_download_done", f"plan:{plan.pk}", str(source), stdout=out)
    assert "download-done delivered" in out.getvalue()
    assert drain(fake_clock) == ["suspended", "completed"]  # parks for retention, then ends
    run = tasks_engine.get_run(rid(plan))
    assert run is not None and run.status == "completed"
    assert [s.name for s in run.steps] == [
        "submit-download",
        "download-done",
        "copy-file",
        "register",
        "retention",
        "cleanup",
    ]
    item = LibraryItem.objects.get(plan=plan)
    dest = media / "library" / "Sintel (2010)" / "Sintel (2010).mkv"
    assert (item.path, item.size, item.content_hash) == (str(dest), 300_000, digest)
    assert item.hash_algorithm == "xxh3_128"
    assert item.registered_at is not None
    assert xxhash.xxh3_128_hexdigest(dest.read_bytes()) == digest
    assert files(media / "library") == ["Sintel (2010)/Sintel (2010).mkv"]
    assert not source.exists()  # cleaned up after retention
    plan.refresh_from_db()
    assert plan.status == "done"
    assert run.output == {
        "plan_id": plan.pk,
        "path": str(dest),
        "hash_algorithm": "xxh3_128",
        "content_hash": digest,
        "source_removed": True,
    }


def test_a_fact_signalled_before_the_wait_is_not_lost(media: Path, fake_clock: FakeClock) -> None:
    plan = started()
    source = media / "downloads" / "Sintel (2010).mkv"
    write(source, 10_000)
    call_command("umt_download_done", f"plan:{plan.pk}", str(source), stdout=io.StringIO())
    drain(fake_clock)
    assert LibraryItem.objects.filter(plan=plan).exists()


def test_retention_holds_the_source_without_a_worker(media: Path, fake_clock: FakeClock) -> None:
    plan = started(retention_seconds=3 * 24 * 3600)  # beyond the drain's horizon
    drain(fake_clock)
    source = media / "downloads" / "Sintel (2010).mkv"
    write(source, 1000)
    tasks_engine.signal(rid(plan), "download-done", {"content_path": str(source)})
    drain(fake_clock)
    run = tasks_engine.get_run(rid(plan))
    assert run is not None and (run.status, run.waiting_on) == ("waiting", "sleep:retention")
    assert source.exists()
    fake_clock.advance(3 * 24 * 3600)
    assert drain(fake_clock) == ["completed"]
    assert not source.exists()


def test_a_season_pack_copies_every_video_file(media: Path, fake_clock: FakeClock) -> None:
    plan = started("Tears of Steel")
    folder = media / "downloads" / "Tears of Steel"
    d1 = write(folder / "S01E01.mkv", 500)
    d2 = write(folder / "feature" / "S01E02.mkv", 5000, seed=2)
    write(folder / "notes.nfo", 50, seed=3)
    tasks_engine.signal(rid(plan), "download-done", {"content_path": str(folder)})
    drain(fake_clock)
    items = sorted((i.path, i.content_hash) for i in LibraryItem.objects.filter(plan=plan))
    lib = media / "library" / "Tears of Steel"
    assert items == [(str(lib / "S01E01.mkv"), d1), (str(lib / "feature" / "S01E02.mkv"), d2)]
    assert files(media / "library") == [
        "Tears of Steel/S01E01.mkv",
        "Tears of Steel/feature/S01E02.mkv",
    ]


def test_pack_files_whose_names_clean_up_alike_get_numbered_names(
    media: Path, fake_clock: FakeClock
) -> None:
    """In the order of their paths: the first keeps the cleaned name, the others are numbered,
    and a number never takes the name another file of the pack has of its own."""
    plan = started("Cartoons")
    folder = media / "downloads" / "Cartoons"
    amp = write(folder / "Tom & Jerry.mkv", 500, seed=1)
    plus = write(folder / "Tom + Jerry.mkv", 600, seed=2)
    own = write(folder / "Tom _ Jerry (2).mkv", 700, seed=3)
    tasks_engine.signal(rid(plan), "download-done", {"content_path": str(folder)})
    assert drain(fake_clock) == ["suspended"]  # registered, keeping the source
    lib = media / "library" / "Cartoons"
    items = sorted((i.path, i.content_hash) for i in LibraryItem.objects.filter(plan=plan))
    assert items == [
        (str(lib / "Tom _ Jerry (2).mkv"), own),
        (str(lib / "Tom _ Jerry (3).mkv"), plus),
        (str(lib / "Tom _ Jerry.mkv"), amp),
    ]
    assert not LibraryItem.objects.filter(registered_at=None).exists()


def test_a_plan_takes_the_files_its_pattern_names(media: Path, fake_clock: FakeClock) -> None:
    plan = plan_acquisition(title="Pack", source="Pack", files="*.srt")
    relay_once()
    plan.refresh_from_db()
    folder = media / "downloads" / "Pack"
    write(folder / "e1.mkv", 500)
    digest = write(folder / "e1.srt", 70, seed=4)
    tasks_engine.signal(rid(plan), "download-done", {"content_path": str(folder)})
    drain(fake_clock)
    assert [(i.path, i.content_hash) for i in LibraryItem.objects.filter(plan=plan)] == [
        (str(media / "library" / "Pack" / "Pack.srt"), digest)  # one file: named after the plan
    ]


def test_a_different_file_in_the_way_fails_the_run_without_touching_it(
    media: Path, fake_clock: FakeClock
) -> None:
    plan = started()
    squatter = media / "library" / "Sintel (2010)" / "Sintel (2010).mkv"
    write(squatter, 100, seed=9)
    source = media / "downloads" / "Sintel (2010).mkv"
    write(source, 100, seed=1)
    tasks_engine.signal(rid(plan), "download-done", {"content_path": str(source)})
    drain(fake_clock)
    run = tasks_engine.get_run(rid(plan))
    assert run is not None and run.status == "failed"
    assert run.error["type"] == "umt.library.LibraryConflict"
    assert not LibraryItem.objects.exists()
    plan.refresh_from_db()
    assert plan.status == "failed" and "LibraryConflict" in plan.failure
    assert squatter.read_bytes() != source.read_bytes()


def test_a_resumed_copy_continues_a_partial_file(media: Path, fake_clock: FakeClock) -> None:
    """What a worker killed mid-copy leaves: a partial file and a started ledger entry."""
    plan = started()
    source = media / "downloads" / "Sintel (2010).mkv"
    digest = write(source, 200_000)
    partial = partial_of(plan, media)
    partial.parent.mkdir(parents=True)
    partial.write_bytes(source.read_bytes()[:70_000])
    drain(fake_clock)
    OpLedger.objects.create(
        op_key=f"umt:copy:plan:{plan.pk}",
        run_id=plan.run_id,
        attempt_token=rid(plan),
        status="started",
        created_at=fake_clock.now(),
        updated_at=fake_clock.now(),
    )
    tasks_engine.signal(rid(plan), "download-done", {"content_path": str(source)})
    drain(fake_clock)
    copy = next(s for s in tasks_engine.get_run(rid(plan)).steps if s.name == "copy-file")
    assert copy.output[0]["resumed_from"] == 70_000
    assert LibraryItem.objects.get(plan=plan).content_hash == digest
    assert files(media / "library") == ["Sintel (2010)/Sintel (2010).mkv"]


def test_a_corrupt_partial_file_is_dropped_and_copied_again(
    media: Path, fake_clock: FakeClock
) -> None:
    plan = started()
    source = media / "downloads" / "Sintel (2010).mkv"
    digest = write(source, 100_000)
    partial = partial_of(plan, media)
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"\0" * 50_000)  # a torn write: the length is there, the bytes are not
    drain(fake_clock)
    OpLedger.objects.create(
        op_key=f"umt:copy:plan:{plan.pk}",
        run_id=plan.run_id,
        attempt_token=rid(plan),
        status="started",
        created_at=fake_clock.now(),
        updated_at=fake_clock.now(),
    )
    tasks_engine.signal(rid(plan), "download-done", {"content_path": str(source)})
    drain(fake_clock)
    attempts = [
        (s.attempt, s.status)
        for s in tasks_engine.get_run(rid(plan)).steps
        if s.name == "copy-file"
    ]
    assert attempts == [(1, "failed"), (2, "completed")]
    assert LibraryItem.objects.get(plan=plan).content_hash == digest


def test_the_hook_command_refuses_unknown_downloads() -> None:
    with pytest.raises(CommandError, match="no acquisition plan for"):
        call_command("umt_download_done", "a" * 40, "/tmp/x")
    with pytest.raises(CommandError, match="neither plan:<id> nor"):
        call_command("umt_download_done", "nonsense", "/tmp/x")
    plan = AcquisitionPlan.objects.create(title="no run yet", source="x.mkv")
    with pytest.raises(CommandError, match="has no workflow run yet"):
        call_command("umt_download_done", f"plan:{plan.pk}", "/tmp/x")


def test_a_fact_without_a_content_path_fails_the_run_at_once(
    media: Path, fake_clock: FakeClock
) -> None:
    plan = started()
    drain(fake_clock)
    tasks_engine.signal(rid(plan), "download-done", {"oops": True})
    assert drain(fake_clock) == ["failed"]
    run = tasks_engine.get_run(rid(plan))
    assert run is not None and run.error["type"] == "umt.downloads.BadSource"
    assert [(s.name, s.attempt) for s in run.steps if s.name == "copy-file"] == [("copy-file", 1)]
