"""What UMT owns, against a real qbittorrent-nox (issue 40): UMT adds a torrent into a folder of
the plan's own and deletes only what it added there; a failure on the library side keeps the
complete download for the plan's retry; two pack files whose names clean up alike both land in
the library; a download the user pauses shows `paused`, and the timeout keeps it. After every
outcome the user's own torrent, holding a file of the same name in the same save path, is
listed with its tag and its file is byte for byte what it was."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torf
import xxhash
from django.contrib.auth.models import User
from django.test import Client

from tests.helpers import tmpfs, wait_for
from umt.acquisition import retry_plan
from umt.models import AcquisitionPlan, LibraryItem

from .instance import (
    Instance,
    Shared,
    make_torrent,
    needs_qbittorrent,
    only_the_users_torrent_left,
    pseudo_random,
    seed,
    users_own_torrent,
)
from .test_acquire_qbittorrent import (
    SIZE,
    finish,
    partials,
    start_plan,
    throttle,
    umt_worker,
)

pytestmark = [needs_qbittorrent, pytest.mark.process, pytest.mark.django_db(transaction=True)]

Status = AcquisitionPlan.Status
NAME = "Same.Name.mkv"  # the user's file and UMT's download share this name and save path


@pytest.fixture(scope="module")
def own(seeder: Instance, leecher: Instance) -> Shared:
    """The user's own torrent, complete in the client UMT drives, with the user's tag."""
    shared = make_torrent(seeder.downloads / "users" / "files", NAME, SIZE, salt="user")
    users_own_torrent(seeder, leecher, shared)
    return shared


@pytest.fixture(autouse=True)
def only_the_users_torrent(leecher: Instance, own: Shared) -> None:
    only_the_users_torrent_left(leecher, own)


def assert_users_untouched(leecher: Instance, own: Shared) -> None:
    [mine] = leecher.api().torrents_info(torrent_hashes=own.info_hash)
    assert (mine.tags, float(mine.progress)) == ("mine", 1.0)
    assert xxhash.xxh3_128_hexdigest((leecher.downloads / NAME).read_bytes()) == own.content_hash


def umt_torrents(leecher: Instance, own: Shared) -> list[str]:
    return [t.hash for t in leecher.api().torrents_info() if t.hash != own.info_hash]


def test_a_download_named_like_the_users_file_never_touches_it(
    workers, seeder: Instance, leecher: Instance, own: Shared, tmp_path: Path
) -> None:
    """Item 1: UMT's torrent holds a file named as the user's (other bytes): it downloads into
    the plan's own folder, and the cleanup deletes that folder's files only."""
    theirs = make_torrent(seeder.downloads / "umt-same" / "files", NAME, SIZE, salt="umt")
    seed(seeder, theirs)
    library = tmp_path / "library"
    w = umt_worker(workers, seeder, leecher, library, UMT_DOWNLOAD_CHECK_SECONDS="0.5")
    plan = start_plan("Same Name", str(theirs.torrent), retention_seconds=0)
    assert finish(plan) == "completed", plan.failure + w.log()
    [item] = LibraryItem.objects.filter(plan=plan)
    assert (item.content_hash, Path(item.path).read_bytes()) == (
        theirs.content_hash,
        theirs.path.read_bytes(),
    )
    assert_users_untouched(leecher, own)
    assert umt_torrents(leecher, own) == []
    folder = Path(plan.download_dir)
    assert folder.parent == leecher.downloads and not folder.exists()  # used, then removed
    assert partials(library) == []


def test_a_failed_download_named_like_the_users_file_never_touches_it(
    workers, leecher: Instance, seeder: Instance, own: Shared, tmp_path: Path
) -> None:
    """Item 1, the compensation: nobody seeds UMT's torrent, the wait times out, and what UMT
    added goes, with nothing of the user's."""
    nobody = make_torrent(tmp_path / "nobody" / "files", NAME, SIZE, salt="nobody")
    library = tmp_path / "library"
    w = umt_worker(
        workers,
        seeder,
        leecher,
        library,
        UMT_DOWNLOAD_CHECK_SECONDS="0.5",
        UMT_DOWNLOAD_TIMEOUT_SECONDS="3",
    )
    plan = start_plan("Nobody", str(nobody.torrent), retention_seconds=0)
    assert finish(plan) == "failed", w.log()
    assert plan.failure.startswith("FactTimeoutError"), plan.failure
    assert_users_untouched(leecher, own)  # nothing of the user's is touched ...
    assert umt_torrents(leecher, own) == []  # ... and what UMT added is gone
    assert plan.download_dir and not Path(plan.download_dir).exists()


def test_a_torrent_moved_out_of_the_plans_folder_is_left_with_its_files(
    workers, seeder: Instance, leecher: Instance, own: Shared, tmp_path: Path
) -> None:
    """Item 1: the user moves UMT's torrent to a folder of theirs while it seeds: its files no
    longer lie in UMT's folder, so the cleanup neither deletes them nor forgets the torrent."""
    shared = make_torrent(seeder.downloads / "moved" / "files", "Moved.mkv", SIZE)
    seed(seeder, shared)
    library = tmp_path / "library"
    w = umt_worker(workers, seeder, leecher, library, UMT_DOWNLOAD_CHECK_SECONDS="0.5")
    plan = start_plan("Moved", str(shared.torrent), retention_seconds=3)
    wait_for(lambda: refreshed(plan).status == Status.REGISTERED, 60, "the plan to register")
    theirs = leecher.downloads / "kept-by-the-user"
    theirs.mkdir()
    api = leecher.api()
    api.torrents_set_location(location=str(theirs), torrent_hashes=shared.info_hash)
    wait_for(lambda: (theirs / "Moved.mkv").exists(), 10, "qBittorrent to move the files")
    assert finish(plan) == "completed", w.log()
    [torrent] = api.torrents_info(torrent_hashes=shared.info_hash)
    assert Path(torrent.content_path) == theirs / "Moved.mkv"
    assert (theirs / "Moved.mkv").read_bytes() == shared.path.read_bytes()
    assert_users_untouched(leecher, own)


def refreshed(plan: AcquisitionPlan) -> AcquisitionPlan:
    plan.refresh_from_db()
    return plan


@pytest.fixture
def read_only_library(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of its own as the library, mounted read-only (the machine's disks untouched)."""
    with tmpfs(tmp_path / "read-only-library", "16m", "ro") as lib:
        yield lib


def test_a_read_only_library_keeps_the_download_and_the_retry_copies_it(
    workers, seeder: Instance, leecher: Instance, own: Shared, read_only_library: Path
) -> None:
    """Item 2: the copy fails on the library side; the complete download stays, so the plan's
    retry copies it although the seeder no longer has the torrent."""
    shared = make_torrent(seeder.downloads / "ro" / "files", "Read.Only.mkv", SIZE)
    seed(seeder, shared)
    library = read_only_library
    w = umt_worker(workers, seeder, leecher, library, UMT_DOWNLOAD_CHECK_SECONDS="0.5")
    plan = start_plan("Read Only", str(shared.torrent), retention_seconds=0)
    assert finish(plan) == "failed", w.log()
    assert "Read-only file system" in plan.failure, plan.failure
    assert plan.failure.endswith(
        "; the download is kept: it is complete and the library side failed; "
        "retrying the plan copies it"
    ), plan.failure
    [torrent] = leecher.api().torrents_info(torrent_hashes=shared.info_hash)
    assert float(torrent.progress) == 1.0
    assert (Path(plan.download_dir) / "Read.Only.mkv").read_bytes() == shared.path.read_bytes()
    assert not LibraryItem.objects.filter(plan=plan).exists()
    assert_users_untouched(leecher, own)

    seeder.api().torrents_delete(delete_files=False, torrent_hashes=shared.info_hash)  # gone
    subprocess.run(["mount", "-o", "remount,rw", str(library)], check=True)
    assert retry_plan(plan.pk, reason="library writable again", by="test")
    assert finish(plan) == "completed", w.log()
    [item] = LibraryItem.objects.filter(plan=plan)
    assert Path(item.path).read_bytes() == shared.path.read_bytes()
    assert (plan.status, plan.failure, plan.retries) == (Status.DONE, "", 1)
    assert umt_torrents(leecher, own) == [] and not Path(plan.download_dir).exists()
    assert partials(library) == []
    assert_users_untouched(leecher, own)


def make_pack(folder: Path, names: list[str], size: int) -> tuple[Path, str, dict[str, bytes]]:
    """A folder torrent holding `names` (different bytes each): its .torrent and its files."""
    folder.mkdir(parents=True, exist_ok=True)
    data = {name: pseudo_random(name, size) for name in names}
    for name, content in data.items():
        (folder / name).write_bytes(content)
    t = torf.Torrent(path=folder, trackers=[], private=False, piece_size=256 * 1024)
    t.generate()
    torrent = folder.parent / f"{folder.name}.torrent"
    t.write(torrent, overwrite=True)
    return torrent, str(t.infohash).lower(), data


def test_pack_files_whose_names_clean_up_alike_both_land_in_the_library(
    workers, seeder: Instance, leecher: Instance, own: Shared, tmp_path: Path
) -> None:
    """Item 5: "Tom & Jerry.mkv" and "Tom + Jerry.mkv" both clean up to "Tom _ Jerry.mkv": the
    first (by its path in the download) keeps the name, the second is "Tom _ Jerry (2).mkv"."""
    torrent, info_hash, data = make_pack(
        seeder.downloads / "pack" / "Cartoons", ["Tom & Jerry.mkv", "Tom + Jerry.mkv"], SIZE
    )
    seeder.api().torrents_add(torrent_files=torrent.read_bytes(), save_path=str(torrent.parent))
    seeder.wait_complete(info_hash)
    library = tmp_path / "library"
    w = umt_worker(workers, seeder, leecher, library, UMT_DOWNLOAD_CHECK_SECONDS="0.5")
    plan = start_plan("Cartoons", str(torrent), retention_seconds=0)
    assert finish(plan) == "completed", plan.failure + w.log()
    items = {Path(i.path).name: i for i in LibraryItem.objects.filter(plan=plan)}
    assert sorted(items) == ["Tom _ Jerry (2).mkv", "Tom _ Jerry.mkv"]
    for name, source in (
        ("Tom _ Jerry.mkv", "Tom & Jerry.mkv"),
        ("Tom _ Jerry (2).mkv", "Tom + Jerry.mkv"),
    ):
        item = items[name]
        assert Path(item.path).read_bytes() == data[source]
        assert item.registered_at is not None
    assert Path(items["Tom _ Jerry.mkv"].path).parent == library / "Cartoons"
    assert umt_torrents(leecher, own) == [] and not Path(plan.download_dir).exists()
    assert partials(library) == []
    assert_users_untouched(leecher, own)


def admin_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


def test_a_download_the_user_pauses_shows_paused_and_finishes_once_resumed(
    workers, seeder: Instance, leecher: Instance, own: Shared, tmp_path: Path
) -> None:
    """Item 6: the plan (and its admin pages) say `paused` while the user holds it paused."""
    shared = make_torrent(seeder.downloads / "paused" / "files", "Paused.mkv", SIZE)
    seed(seeder, shared)
    throttle(leecher)
    library = tmp_path / "library"
    w = umt_worker(workers, seeder, leecher, library, UMT_DOWNLOAD_CHECK_SECONDS="0.5")
    plan = start_plan("Paused", str(shared.torrent), retention_seconds=0)
    wait_for(lambda: refreshed(plan).status == Status.DOWNLOADING, 30, "the download to start")
    api = leecher.api()
    wait_for(lambda: api.torrents_info(torrent_hashes=shared.info_hash), 10, "the add")
    api.torrents_pause(torrent_hashes=shared.info_hash)
    wait_for(lambda: refreshed(plan).status == Status.PAUSED, 20, "the plan to show paused")
    admin = admin_client()
    listed = admin.get("/admin/umt/acquisitionplan/?status__exact=paused").content.decode()
    assert f"/admin/umt/acquisitionplan/{plan.pk}/change/" in listed
    page = admin.get(f"/admin/umt/acquisitionplan/{plan.pk}/change/").content.decode()
    assert "Paused" in page and str(leecher.downloads) in page  # and its own folder

    api.app_set_preferences({"dl_limit": 0})
    api.torrents_resume(torrent_hashes=shared.info_hash)
    assert finish(plan) == "completed", w.log()
    [item] = LibraryItem.objects.filter(plan=plan)
    assert item.content_hash == shared.content_hash
    assert umt_torrents(leecher, own) == []
    assert_users_untouched(leecher, own)


def test_a_download_paused_at_the_timeout_fails_the_plan_and_is_kept(
    workers, seeder: Instance, leecher: Instance, own: Shared, tmp_path: Path
) -> None:
    """Item 6: the timeout still ends the wait, but the download the user paused stays (the
    user decides about it); resumed, the plan's retry finishes it."""
    shared = make_torrent(seeder.downloads / "paused-out" / "files", "Paused.Out.mkv", SIZE)
    seed(seeder, shared)
    throttle(leecher)
    library = tmp_path / "library"
    w = umt_worker(
        workers,
        seeder,
        leecher,
        library,
        UMT_DOWNLOAD_CHECK_SECONDS="0.5",
        UMT_DOWNLOAD_TIMEOUT_SECONDS="8",
    )
    plan = start_plan("Paused Out", str(shared.torrent), retention_seconds=0)
    api = leecher.api()
    wait_for(lambda: api.torrents_info(torrent_hashes=shared.info_hash), 30, "the add")
    api.torrents_pause(torrent_hashes=shared.info_hash)
    assert finish(plan) == "failed", w.log()
    assert plan.failure.startswith("FactTimeoutError"), plan.failure
    assert plan.failure.endswith(
        "; the download is kept: it is paused in the download client; "
        "resume it, then retry the plan"
    ), plan.failure
    [torrent] = api.torrents_info(torrent_hashes=shared.info_hash)
    assert torrent.state in {"pausedDL", "stoppedDL"} and float(torrent.progress) < 1
    assert Path(torrent.save_path) == Path(plan.download_dir)
    assert_users_untouched(leecher, own)

    api.app_set_preferences({"dl_limit": 0})
    api.torrents_resume(torrent_hashes=shared.info_hash)
    assert retry_plan(plan.pk, reason="resumed", by="test")
    assert finish(plan) == "completed", w.log()
    [item] = LibraryItem.objects.filter(plan=plan)
    assert item.content_hash == shared.content_hash
    assert umt_torrents(leecher, own) == [] and not Path(plan.download_dir).exists()
    assert_users_untouched(leecher, own)
