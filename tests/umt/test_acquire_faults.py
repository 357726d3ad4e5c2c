"""Defects of issue 17 that need no download client (PostgreSQL and SQLite): bad hook input,
bad plan input, long titles, a failed run's plan, secrets, the admin, hash forms."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

import tasks_engine
from tasks_engine.models import Fact, OpLedger
from tasks_engine.values.serialization import encode_error
from tests.helpers import FakeClock, drain, tmpfs
from tests.umt.test_acquire import files, rid, started, write
from tests.umt.test_acquire import media as media
from umt.acquisition import find_plans, plan_acquisition
from umt.conf import QBittorrentSettings, UmtSettings
from umt.downloads.hashes import NotATorrent, from_magnet
from umt.models import AcquisitionPlan, LibraryItem

pytestmark = pytest.mark.django_db


def test_the_hook_refuses_a_bad_plan_number_and_a_missing_path(media: Path) -> None:
    with pytest.raises(CommandError, match="plan:<id> needs a number"):
        call_command("umt_download_done", "plan:abc", "/tmp")
    plan = started()
    with pytest.raises(CommandError, match="does not exist"):
        call_command("umt_download_done", f"plan:{plan.pk}", str(media / "nowhere.mkv"))
    assert not Fact.objects.filter(run_id=rid(plan)).exists()


def test_the_hook_reaches_every_plan_waiting_on_one_torrent(media: Path) -> None:
    h = "ab" * 20
    plans = [started(f"Plan {i}") for i in range(2)]
    AcquisitionPlan.objects.filter(pk__in=[p.pk for p in plans]).update(
        info_hash=h, status="downloading"
    )
    AcquisitionPlan.objects.create(title="done one", source="x", info_hash=h, status="done")
    assert [p.pk for p in find_plans(h.upper())] == [p.pk for p in plans]
    assert [p.pk for p in find_plans("ab" * 32)] == [p.pk for p in plans]  # %J, the v2 hash
    out = io.StringIO()
    call_command("umt_download_done", h, str(media), stdout=out)
    assert out.getvalue().count("download-done delivered") == 2


@pytest.mark.parametrize("bad", [1e300, -1.0, float("nan"), float("inf")])
def test_an_impossible_retention_is_refused_and_writes_nothing(bad: float) -> None:
    with pytest.raises(ValueError, match="retention_seconds must be between"):
        plan_acquisition(title="x", source="x.mkv", retention_seconds=bad)
    assert not AcquisitionPlan.objects.exists()


def test_a_long_cjk_title_is_cut_on_a_character_boundary(
    media: Path, fake_clock: FakeClock
) -> None:
    title = "千と千尋の神隠し" * 12  # 96 characters, 288 bytes
    plan = started(title)
    drain(fake_clock)
    source = media / "downloads" / "cjk.mkv"
    digest = write(source, 5000)
    tasks_engine.signal(rid(plan), "download-done", {"content_path": str(source)})
    drain(fake_clock)
    item = LibraryItem.objects.get(plan=plan)
    name = Path(item.path).name
    assert item.content_hash == digest and name.endswith(".mkv")
    assert len(name.encode()) <= 255 and len(Path(item.path).parent.name.encode()) <= 255
    name.encode().decode("utf-8")  # whole characters only


def test_a_failed_run_marks_its_plan_failed_with_the_reason(
    media: Path, fake_clock: FakeClock
) -> None:
    plan = started()
    drain(fake_clock)
    tasks_engine.signal(rid(plan), "download-done", {"content_path": str(media / "gone")})
    drain(fake_clock)
    run = tasks_engine.get_run(rid(plan))
    assert run is not None and run.status == "failed"
    assert [s.name for s in run.steps][-2:] == ["fail-plan", "compensate"]
    plan.refresh_from_db()
    assert plan.status == "failed" and "does not exist" in plan.failure
    assert not (media / "library" / ".partial").exists() or files(media / "library") == []


def test_magnets_in_every_hash_form() -> None:
    v1 = "c9e15763f722f23e98a29decdfae341b98d53056"
    b32 = base64.b32encode(bytes.fromhex(v1)).decode()
    assert from_magnet(f"magnet:?xt=urn:btih:{b32}").ref == v1
    v2 = "d" * 64
    hybrid = from_magnet(f"magnet:?xt=urn:btih:{v1}&xt=urn:btmh:1220{v2}&dn=x")
    assert (hybrid.ref, hybrid.forms) == (v2[:40], (v1, v2, v2[:40]))  # qBittorrent's id
    assert from_magnet(f"magnet:?xt=urn:btmh:1220{v2}").ref == v2[:40]
    with pytest.raises(NotATorrent):
        from_magnet("magnet:?dn=nothing")


def test_tracker_passkeys_are_redacted_in_stored_errors() -> None:
    tr = "http%3A%2F%2Ftracker.example%2Fannounce%3Fpasskey%3Dsecretpass123"
    path = "http://tracker.example/0123456789abcdef0123456789abcdef/announce"
    err = encode_error(RuntimeError(f"bad magnet:?xt=urn:btih:{'a' * 40}&tr={tr} and {path}"))
    assert "secretpass123" not in err["message"] + err["traceback"]
    assert "0123456789abcdef0123456789abcdef" not in err["message"] + err["traceback"]


def test_settings_do_not_print_the_password() -> None:
    s = UmtSettings(qbittorrent=QBittorrentSettings(password="hunter2"))
    assert "hunter2" not in repr(s) and "hunter2" not in str(s)


def test_the_op_ledger_names_each_ops_step(media: Path, fake_clock: FakeClock) -> None:
    plan = started()
    drain(fake_clock)
    source = media / "downloads" / "Sintel (2010).mkv"
    write(source, 1000)
    tasks_engine.signal(rid(plan), "download-done", {"content_path": str(source)})
    drain(fake_clock)
    ops = dict(OpLedger.objects.filter(run_id=rid(plan)).values_list("op_key", "step_name"))
    assert ops == {f"submit:{plan.pk}": "submit-download", f"umt:copy:plan:{plan.pk}": "copy-file"}


@pytest.fixture
def small_library(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs of its own as the library (the machine's disks are never filled)."""
    with tmpfs(tmp_path / "small-library") as lib:
        yield lib


def test_a_full_library_disk_fails_the_plan_and_leaves_no_partial_file(
    media: Path, small_library: Path, fake_clock: FakeClock
) -> None:
    plan = started()
    drain(fake_clock)
    source = media / "downloads" / "Sintel (2010).mkv"
    write(source, 3 * 1024 * 1024)
    with override_settings(
        UMT={"LIBRARY_DIR": str(small_library), "DOWNLOADS_DIR": str(media / "downloads")}
    ):
        tasks_engine.signal(rid(plan), "download-done", {"content_path": str(source)})
        drain(fake_clock)
    run = tasks_engine.get_run(rid(plan))
    assert run is not None and run.status == "failed"
    copies = [s.status for s in run.steps if s.name == "copy-file"]
    assert copies == ["failed", "failed", "failed"]  # the file steps' 3 attempts
    plan.refresh_from_db()
    assert plan.status == "failed" and "No space left" in plan.failure
    assert list(small_library.iterdir()) == []  # no partial file, no folder of the attempt
    assert not LibraryItem.objects.exists()
    assert source.exists()  # the only copy of the download is kept
