"""Issue 17, defect 4, end to end against the real client: the hash forms other than a v1
.torrent's hex digest. A hybrid v1+v2 .torrent (built by `hybrid.py`; the seeder's recheck
proves it right), a hybrid magnet as qBittorrent exports it (`xt=urn:btih` + `xt=urn:btmh`),
and a base32 btih magnet. The hybrids end their wait through the completion hook alone, one
given `%I` (a hybrid's v1 hash), the other `%K` (qBittorrent's id for a hybrid: its truncated
v2 hash, not its v1 hash); the base32 magnet through UMT's polling. Each plan completes
through UMT's acquisition: one torrent in qBittorrent while the plan keeps its source, the
file in the library with one LibraryItem, the plan `done`, then no torrent in the client, and
no copy in progress left behind."""

from __future__ import annotations

import base64
import contextlib
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import wait_for
from umt.downloads.qbittorrent import plan_tag
from umt.models import AcquisitionPlan, LibraryItem

from .hybrid import Hybrid, make_hybrid_torrent
from .instance import Instance, Shared, make_torrent, needs_qbittorrent, seed
from .test_acquire_qbittorrent import (
    SIZE,
    finish,
    hook_command,
    partials,
    start_plan,
    umt_worker,
)

pytestmark = [needs_qbittorrent, pytest.mark.process, pytest.mark.django_db(transaction=True)]

Status = AcquisitionPlan.Status
RETENTION = 10  # seconds the plan keeps its source: the test looks at the client meanwhile


@pytest.fixture(autouse=True)
def empty_leecher(leecher: Instance) -> None:
    """A torrent a failed test left behind must not fail the next test's "one torrent" check."""
    api = leecher.api()
    api.app_set_preferences({"dl_limit": 0, "autorun_enabled": False})
    leftovers = [t.hash for t in api.torrents_info()]
    if leftovers:
        api.torrents_delete(delete_files=True, torrent_hashes=leftovers)
        wait_for(lambda: not api.torrents_info(), 10, "the leftover torrents to go")


def seed_hybrid(seeder: Instance, folder: str, name: str) -> Hybrid:
    """A hybrid torrent the seeder seeds. The seeder loads it (libtorrent rejects a hybrid whose
    v1 and v2 file lists disagree, or a piece layer that does not hash to its root) and rechecks
    the data against it to 100 % (a hybrid's pieces are checked against both v1 and v2 hashes):
    the test helper's metainfo is right, and qBittorrent lists it under the hashes we computed
    (its id: the truncated v2 hash)."""
    hybrid = make_hybrid_torrent(seeder.downloads / folder, name, SIZE)
    seed(seeder, hybrid.shared)
    [listed] = seeder.api().torrents_info(torrent_hashes=hybrid.shared.info_hash)
    assert (listed.hash, listed.infohash_v1, listed.infohash_v2) == (
        hybrid.v2[:40],
        hybrid.v1,
        hybrid.v2,
    )
    return hybrid


def acquire(
    workers: Any,
    seeder: Instance,
    leecher: Instance,
    tmp_path: Path,
    title: str,
    source: str,
    *,
    hook_id: str = "",
) -> tuple[AcquisitionPlan, Path, Any]:
    """Start a plan for `source`. With `hook_id` ("%I", "%K"), only qBittorrent's completion
    hook, given that id, can end the wait (no polling); without it, UMT polls."""
    library = tmp_path / "library"
    check = "0.5"
    if hook_id:
        hook = hook_command(tmp_path / "hook.log").replace('"%I"', f'"{hook_id}"')
        leecher.api().app_set_preferences({"autorun_enabled": True, "autorun_program": hook})
        check = "0"
    w = umt_worker(workers, seeder, leecher, library, UMT_DOWNLOAD_CHECK_SECONDS=check)
    return start_plan(title, source, retention_seconds=RETENTION), library, w


def status(plan: AcquisitionPlan) -> str:
    plan.refresh_from_db()
    return str(plan.status)


def assert_acquired(
    plan: AcquisitionPlan, library: Path, w: Any, leecher: Instance, shared: Shared
) -> None:
    """The plan's whole acquisition, looked at while it keeps its source and after its end."""
    with contextlib.suppress(AssertionError):  # the assertion below shows the worker's log
        wait_for(lambda: status(plan) in {Status.REGISTERED, Status.DONE, Status.FAILED}, 60)
    listed = leecher.api().torrents_info()
    # Still keeping its source after the look: the cleanup had not started when it was taken.
    assert status(plan) == Status.REGISTERED, plan.failure + w.log() + leecher.log()
    assert [(t.hash, plan_tag(plan.pk) in str(t.tags)) for t in listed] == [
        (shared.info_hash, True)  # one torrent, the one UMT added, no second add under another id
    ]
    assert finish(plan) == "completed", w.log()
    assert (plan.status, plan.info_hash) == (Status.DONE, shared.info_hash)
    [item] = LibraryItem.objects.filter(plan=plan)
    assert (item.size, item.content_hash) == (shared.size, shared.content_hash)
    assert Path(item.path).read_bytes() == shared.path.read_bytes()
    assert Path(item.path).parent.parent == library
    assert leecher.api().torrents_info() == []  # the cleanup removed what UMT added
    assert not Path(plan.download_dir).exists()  # its files, and the plan's own folder
    assert partials(library) == []


def assert_hook_delivered(tmp_path: Path, plan: AcquisitionPlan) -> None:
    log = (tmp_path / "hook.log").read_text()
    assert f"plan #{plan.pk}: download-done delivered" in log, log


def test_a_hybrid_torrent_file_is_acquired(
    workers: Any, seeder: Instance, leecher: Instance, tmp_path: Path
) -> None:
    hybrid = seed_hybrid(seeder, "hybrid-file", "Hybrid.File.mkv")
    source = str(hybrid.shared.torrent)
    plan, library, w = acquire(
        workers, seeder, leecher, tmp_path, "Hybrid File", source, hook_id="%I"
    )
    assert_acquired(plan, library, w, leecher, hybrid.shared)
    assert_hook_delivered(tmp_path, plan)


def test_a_hybrid_magnet_as_qbittorrent_exports_it_is_acquired(
    workers: Any, seeder: Instance, leecher: Instance, tmp_path: Path
) -> None:
    hybrid = seed_hybrid(seeder, "hybrid-magnet", "Hybrid.Magnet.mkv")
    [listed] = seeder.api().torrents_info(torrent_hashes=hybrid.shared.info_hash)
    magnet = str(listed.magnet_uri)  # the seeder's own "Copy magnet link"
    assert f"xt=urn:btih:{hybrid.v1}" in magnet
    assert f"xt=urn:btmh:1220{hybrid.v2}" in magnet
    plan, library, w = acquire(
        workers, seeder, leecher, tmp_path, "Hybrid Magnet", magnet, hook_id="%K"
    )
    assert_acquired(plan, library, w, leecher, hybrid.shared)
    assert_hook_delivered(tmp_path, plan)


def test_a_base32_magnet_is_acquired(
    workers: Any, seeder: Instance, leecher: Instance, tmp_path: Path
) -> None:
    shared = make_torrent(seeder.downloads / "base32", "Base32.mkv", SIZE)
    seed(seeder, shared)
    b32 = base64.b32encode(bytes.fromhex(shared.info_hash)).decode()
    assert len(b32) == 32
    magnet = f"magnet:?xt=urn:btih:{b32}&dn=Base32.mkv"
    plan, library, w = acquire(workers, seeder, leecher, tmp_path, "Base32 Magnet", magnet)
    assert_acquired(plan, library, w, leecher, shared)
