"""Faults against a real qbittorrent-nox (issue 17): the download client killed or restarted, the
seeder gone for good, the library disk full (then the plan retried), the worker killed between
the verified rename and the commit. Each test asserts what a user must be able to rely on: one
torrent per download in qBittorrent, the right file in the library, one LibraryItem per file,
no copy in progress left behind, the plan's final status, and the user's own torrent untouched."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import tasks_engine
from tasks_engine.models import OpLedger
from tests.helpers import tmpfs, wait_for
from umt.acquisition import retry_plan
from umt.models import AcquisitionPlan, LibraryItem

from .instance import (
    Instance,
    Shared,
    make_torrent,
    needs_qbittorrent,
    only_the_users_torrent_left,
    seed,
    users_own_torrent,
)
from .test_acquire_qbittorrent import (
    SIZE,
    finish,
    partials,
    start_plan,
    throttle,
    umt_env,
    umt_worker,
)

pytestmark = [needs_qbittorrent, pytest.mark.process, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def own(seeder: Instance, leecher: Instance) -> Shared:
    """The user's own torrent, complete in the client UMT drives, with the user's tag."""
    shared = make_torrent(seeder.downloads / "own", "Home.Video.mkv", SIZE)
    users_own_torrent(seeder, leecher, shared)
    leecher.restart()  # a clean stop saves its resume data: a later SIGKILL cannot lose it
    return shared


@pytest.fixture(autouse=True)
def only_the_users_torrent(leecher: Instance, own: Shared) -> None:
    only_the_users_torrent_left(leecher, own)


def downloading(leecher: Instance, shared: Shared) -> bool:
    """The client lists the torrent and has received some of it, not all."""
    found = leecher.api().torrents_info(torrent_hashes=shared.info_hash)
    return bool(found) and int(found[0].downloaded) > 0 and float(found[0].progress) < 1


def assert_outcome(
    plan: AcquisitionPlan,
    status: str,
    library: Path,
    leecher: Instance,
    own: Shared,
    acquired: Shared | None,
) -> None:
    assert plan.status == status, plan.failure
    items = list(LibraryItem.objects.filter(plan=plan))
    if acquired is None:
        assert items == []
    else:
        [item] = items  # one LibraryItem for the one file
        assert (item.size, item.content_hash) == (acquired.size, acquired.content_hash)
        assert Path(item.path).read_bytes() == acquired.path.read_bytes()
        files = [p for p in library.rglob("*") if p.is_file() and p not in partials(library)]
        assert files == [Path(item.path)]
    assert partials(library) == []
    # What UMT added is gone; the user's torrent is the only one, untouched, with its files.
    [torrent] = leecher.api().torrents_info()
    assert (torrent.hash, torrent.tags, float(torrent.progress)) == (own.info_hash, "mine", 1.0)
    assert (leecher.downloads / own.path.name).read_bytes() == own.path.read_bytes()
    if acquired is not None:
        assert not Path(plan.download_dir).exists()  # the download's files and folder


def assert_kept_for_a_retry(
    plan: AcquisitionPlan, library: Path, leecher: Instance, own: Shared, shared: Shared
) -> None:
    """A failure on the library side: the plan failed, and says so; nothing is in the library;
    the complete download stays in the client, in the plan's folder, for a retry to copy."""
    assert plan.status == AcquisitionPlan.Status.FAILED
    assert plan.failure.endswith(
        "; the download is kept: it is complete and the library side failed; "
        "retrying the plan copies it"
    ), plan.failure
    assert not LibraryItem.objects.filter(plan=plan).exists() and partials(library) == []
    torrents = {t.hash: t for t in leecher.api().torrents_info()}
    assert set(torrents) == {own.info_hash, shared.info_hash}
    assert float(torrents[shared.info_hash].progress) == 1.0
    assert (Path(plan.download_dir) / shared.path.name).read_bytes() == shared.path.read_bytes()
    mine = torrents[own.info_hash]
    assert (mine.tags, float(mine.progress)) == ("mine", 1.0)
    assert (leecher.downloads / own.path.name).read_bytes() == own.path.read_bytes()


def one_torrent_for(leecher: Instance, shared: Shared) -> None:
    listed = [t for t in leecher.api().torrents_info() if t.hash != ""]
    assert len([t for t in listed if t.hash == shared.info_hash]) <= 1
    assert len(listed) <= 2  # the user's and, at most, this one


def test_qbittorrent_killed_right_after_accepting_the_add(
    workers, seeder: Instance, leecher: Instance, own: Shared, tmp_path: Path
) -> None:
    """SIGKILL as soon as qBittorrent lists the new torrent (its resume data may not be
    saved yet), then a restart: the run re-adds or finds it, and completes once."""
    shared = make_torrent(seeder.downloads / "killed", "Killed.mkv", SIZE)
    seed(seeder, shared)
    throttle(leecher)
    library = tmp_path / "library"
    w = umt_worker(workers, seeder, leecher, library, UMT_DOWNLOAD_CHECK_SECONDS="0.5")
    plan = start_plan("Killed", str(shared.torrent), retention_seconds=0)
    api = leecher.api()
    wait_for(lambda: api.torrents_info(torrent_hashes=shared.info_hash), 30, "the add")
    leecher.kill()
    leecher.start()  # unthrottled: the profile's settings are written afresh
    one_torrent_for(leecher, shared)
    assert finish(plan) == "completed", w.log() + leecher.log()
    assert_outcome(plan, AcquisitionPlan.Status.DONE, library, leecher, own, shared)


def test_qbittorrent_restarted_during_the_download(
    workers, seeder: Instance, leecher: Instance, own: Shared, tmp_path: Path
) -> None:
    shared = make_torrent(seeder.downloads / "restarted", "Restarted.mkv", SIZE)
    seed(seeder, shared)
    throttle(leecher)
    library = tmp_path / "library"
    w = umt_worker(workers, seeder, leecher, library, UMT_DOWNLOAD_CHECK_SECONDS="0.5")
    plan = start_plan("Restarted", str(shared.torrent), retention_seconds=0)
    wait_for(lambda: downloading(leecher, shared), 30, "the download to start")
    leecher.restart()
    one_torrent_for(leecher, shared)
    assert finish(plan) == "completed", w.log() + leecher.log()
    assert_outcome(plan, AcquisitionPlan.Status.DONE, library, leecher, own, shared)
    assert not OpLedger.objects.filter(op_key__startswith=f"submit:{plan.pk}:").exists()


def test_the_seeder_gone_for_good_fails_the_run_and_leaves_no_orphan(
    workers, qbt_root: Path, leecher: Instance, own: Shared, tmp_path: Path
) -> None:
    gone = Instance(qbt_root, "gone-seeder").start()
    try:
        shared = make_torrent(gone.downloads / "gone", "Gone.mkv", SIZE)
        seed(gone, shared)
        throttle(leecher)
        library = tmp_path / "library"
        w = umt_worker(
            workers,
            gone,
            leecher,
            library,
            UMT_DOWNLOAD_CHECK_SECONDS="0.5",
            UMT_DOWNLOAD_TIMEOUT_SECONDS="15",
        )
        plan = start_plan("Gone", str(shared.torrent), retention_seconds=0)
        wait_for(lambda: downloading(leecher, shared), 15, "the download to start")
        gone.kill()  # for good: the download can never finish
    finally:
        gone.stop()
    assert finish(plan) == "failed", w.log()
    assert "FactTimeoutError" in plan.failure
    assert_outcome(plan, AcquisitionPlan.Status.FAILED, library, leecher, own, None)
    assert not Path(plan.download_dir).exists()  # the partial download and its folder


@pytest.fixture
def small_library(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs of its own as the library (the machine's disks are never filled)."""
    with tmpfs(tmp_path / "small-library") as lib:
        yield lib


def test_a_full_library_disk_fails_the_plan_and_a_retry_then_completes_it(
    workers, seeder: Instance, leecher: Instance, own: Shared, small_library: Path
) -> None:
    shared = make_torrent(seeder.downloads / "full", "Full.Disk.mkv", SIZE)  # 3 MiB > 1 MiB
    seed(seeder, shared)
    w = umt_worker(workers, seeder, leecher, small_library, UMT_DOWNLOAD_CHECK_SECONDS="0.5")
    plan = start_plan("Full Disk", str(shared.torrent), retention_seconds=0)
    assert finish(plan) == "failed", w.log()
    assert "No space left" in plan.failure
    assert_kept_for_a_retry(plan, small_library, leecher, own, shared)
    assert plan.run_id is not None
    run = tasks_engine.get_run(plan.run_id)
    assert run is not None
    assert [s.status for s in run.steps if s.name == "copy-file"] == ["failed"] * 3

    # The operator makes room and retries the plan: its run gets a fresh pass.
    subprocess.run(["mount", "-o", "remount,size=16m", str(small_library)], check=True)
    assert retry_plan(plan.pk, reason="disk enlarged", by="test")
    assert not retry_plan(plan.pk)  # no longer failed: nothing to retry
    assert finish(plan) == "completed", w.log()
    assert_outcome(plan, AcquisitionPlan.Status.DONE, small_library, leecher, own, shared)
    assert (plan.retries, plan.failure) == (1, "")
    assert OpLedger.objects.get(op_key=f"submit:{plan.pk}:r1").result["added"] is True


def test_the_worker_killed_between_the_verified_rename_and_the_commit(
    workers, seeder: Instance, leecher: Instance, own: Shared, tmp_path: Path
) -> None:
    """The worker stops itself right after renaming the verified copy into place (the test
    point `copy-renamed`) and is SIGKILLed there; the next worker adopts the file and commits
    one LibraryItem."""
    shared = make_torrent(seeder.downloads / "renamed", "Renamed.mkv", SIZE)
    seed(seeder, shared)
    library = tmp_path / "library"
    marker = tmp_path / "stopped-at-copy-renamed"
    env = umt_env(seeder, leecher, library, UMT_DOWNLOAD_CHECK_SECONDS="0.5")
    first = workers(
        "--poll-interval",
        "0.2",
        "--lease-seconds",
        "2",
        env={**env, "UMT_TEST_STOP_AT": "copy-renamed", "UMT_TEST_STOP_MARKER": str(marker)},
    )
    plan = start_plan("Renamed", str(shared.torrent), retention_seconds=0)
    wait_for(marker.exists, 60, "the worker to stop after the rename")
    dest = library / "Renamed" / "Renamed.mkv"
    assert dest.read_bytes() == shared.path.read_bytes()  # renamed into place ...
    assert not LibraryItem.objects.filter(plan=plan).exists()  # ... and not committed
    first.send(signal.SIGKILL)
    first.wait(10)
    second = workers("--poll-interval", "0.2", env=env)
    assert finish(plan) == "completed", first.log() + second.log()
    assert_outcome(plan, AcquisitionPlan.Status.DONE, library, leecher, own, shared)


def test_a_title_folder_on_a_full_filesystem_fails_cleanly_and_a_retry_completes_it(
    workers, seeder: Instance, leecher: Instance, own: Shared, tmp_path: Path
) -> None:
    """Issue 40, item 3: `<library>/<title>` is a symlink to a filesystem of its own (a 1 MiB
    tmpfs). The copy's temporary file goes there, so the full disk fails the plan with nothing
    left on either side and the download kept; once the disk is enlarged, the retried plan's
    copy lands on it."""
    shared = make_torrent(seeder.downloads / "elsewhere", "Elsewhere.mkv", SIZE)  # 3 MiB
    seed(seeder, shared)
    library = tmp_path / "library"
    with tmpfs(tmp_path / "other-disk") as disk:
        library.mkdir()
        (library / "Elsewhere").symlink_to(disk, target_is_directory=True)
        env = umt_env(seeder, leecher, library, UMT_DOWNLOAD_CHECK_SECONDS="0.5")
        w = workers("--poll-interval", "0.2", env=env)
        plan = start_plan("Elsewhere", str(shared.torrent), retention_seconds=0)
        assert finish(plan) == "failed", w.log()
        assert "No space left" in plan.failure
        assert_kept_for_a_retry(plan, library, leecher, own, shared)  # the library's fault
        assert list(disk.iterdir()) == [] and list(library.iterdir()) == [library / "Elsewhere"]

        subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)
        assert retry_plan(plan.pk, reason="disk enlarged", by="test")
        assert finish(plan) == "completed", w.log()
        [item] = LibraryItem.objects.filter(plan=plan)
        assert (item.path, item.content_hash) == (
            str(library / "Elsewhere" / "Elsewhere.mkv"),
            shared.content_hash,
        )
        assert list(disk.iterdir()) == [disk / "Elsewhere.mkv"]  # no temporary file beside it
        assert (disk / "Elsewhere.mkv").read_bytes() == shared.path.read_bytes()
        assert list(library.iterdir()) == [library / "Elsewhere"]
        [torrent] = leecher.api().torrents_info()  # UMT's torrent removed, the user's kept
        assert (torrent.hash, torrent.tags) == (own.info_hash, "mine")
        assert (leecher.downloads / own.path.name).read_bytes() == own.path.read_bytes()
