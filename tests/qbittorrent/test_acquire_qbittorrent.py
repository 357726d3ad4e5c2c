"""The acquire workflow end to end through a real qbittorrent-nox: a worker process submits the
torrent, qBittorrent downloads it from a second instance over loopback, and its "run external
program on torrent finished" hook runs `manage.py umt_download_done` for real."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import tasks_engine
from outbox.relay import relay_once
from tasks_engine.models import Fact
from tests.helpers import ROOT, database_url, wait_for
from umt.acquisition import plan_acquisition
from umt.models import AcquisitionPlan, LibraryItem

from .instance import Instance, make_torrent, needs_qbittorrent, seed

pytestmark = [needs_qbittorrent, pytest.mark.process, pytest.mark.django_db(transaction=True)]

SIZE = 3 * 1024 * 1024


def hook_command(log: Path) -> str:
    """What an operator puts in qBittorrent (docs/QBITTORRENT-HOOK.md), pointed at the test DB."""
    return (
        f"/usr/bin/env DATABASE_URL={database_url()} DJANGO_SETTINGS_MODULE=tests.settings "
        f'{sys.executable} {ROOT / "manage.py"} umt_download_done "%I" "%F" --name "%N" '
        f"--log {log}"
    )


def test_acquire_through_qbittorrent_and_its_completion_hook(
    workers, seeder: Instance, leecher: Instance, tmp_path: Path
) -> None:
    shared = make_torrent(seeder.downloads / "e2e", "Sintel.2010.mkv", SIZE)
    seed(seeder, shared)
    hook_log = tmp_path / "hook.log"
    leecher.api().app_set_preferences(
        {"autorun_enabled": True, "autorun_program": hook_command(hook_log)}
    )
    library = tmp_path / "library"
    w = workers(
        "--poll-interval",
        "0.2",
        env={
            "UMT_QBITTORRENT_URL": leecher.url,
            "UMT_QBITTORRENT_SAVE_PATH": str(leecher.downloads),
            "UMT_QBITTORRENT_PEERS": seeder.peer,
            "UMT_LIBRARY_DIR": str(library),
            "UMT_DOWNLOAD_CHECK_SECONDS": "0",  # no polling: only the hook can end the wait
        },
    )
    plan = plan_acquisition(
        title="Sintel (2010)",
        source=str(shared.torrent),
        client="qbittorrent",
        retention_seconds=1,
    )
    relay_once()
    plan.refresh_from_db()
    assert plan.run_id is not None
    run_id = plan.run_id

    def finished() -> bool:
        view = tasks_engine.get_run(run_id)
        return view is not None and view.status in {"completed", "failed", "canceled"}

    wait_for(finished, 60, "the acquire run to finish")
    run = tasks_engine.get_run(run_id)
    assert run is not None and run.status == "completed", w.log() + leecher.log()
    fact = Fact.objects.get(run_id=run_id, name="download-done")
    assert fact.payload == {
        "content_path": str(leecher.downloads / "Sintel.2010.mkv"),
        "ref": shared.info_hash,
        "name": "Sintel.2010.mkv",
    }
    assert f"{shared.info_hash}: plan #{plan.pk}: download-done delivered" in hook_log.read_text()
    item = LibraryItem.objects.get(plan=plan)
    dest = library / "Sintel (2010)" / "Sintel (2010).mkv"
    assert (item.path, item.size, item.sha256) == (str(dest), SIZE, shared.sha256)
    assert dest.read_bytes() == shared.path.read_bytes()
    plan.refresh_from_db()
    assert (plan.info_hash, plan.status) == (shared.info_hash, AcquisitionPlan.Status.DONE)
    assert leecher.api().torrents_info() == []  # cleanup removed the torrent ...
    wait_for(lambda: not (leecher.downloads / "Sintel.2010.mkv").exists(), 10, "its files")
    assert [t.hash for t in seeder.api().torrents_info()] == [shared.info_hash]  # still seeding
