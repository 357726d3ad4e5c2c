"""umt.downloads.qbittorrent.QBittorrentClient against a real qbittorrent-nox (seeder + leecher)."""

from __future__ import annotations

from pathlib import Path

import pytest

from umt.conf import QBittorrentSettings
from umt.downloads import DownloadError
from umt.downloads.qbittorrent import QBittorrentClient
from umt.models import AcquisitionPlan

from .instance import Instance, make_torrent, needs_qbittorrent, seed

pytestmark = needs_qbittorrent


def client_of(leecher: Instance, peers: tuple[str, ...] = ()) -> QBittorrentClient:
    return QBittorrentClient(
        QBittorrentSettings(url=leecher.url, save_path=str(leecher.downloads), peers=peers)
    )


def test_identify_reads_torrent_files_and_magnets(tmp_path: Path, leecher: Instance) -> None:
    shared = make_torrent(tmp_path / "files", "identify.bin", 300_000)
    client = client_of(leecher)
    plan = AcquisitionPlan(pk=1, title="t", source=str(shared.torrent))
    assert client.identify(plan).ref == shared.info_hash
    magnet = AcquisitionPlan(
        pk=2, title="m", source=f"magnet:?xt=urn:btih:{shared.info_hash.upper()}"
    )
    assert client.identify(magnet).ref == shared.info_hash
    with pytest.raises(DownloadError, match="cannot read"):
        client.identify(AcquisitionPlan(pk=3, title="x", source=str(tmp_path / "missing.torrent")))
    assert leecher.api().torrents_info() == []  # identify touched nothing


def test_add_poll_and_remove_a_real_download(
    tmp_path: Path, seeder: Instance, leecher: Instance
) -> None:
    shared = make_torrent(seeder.downloads / "client-test", "client.bin", 2 * 1024 * 1024)
    seed(seeder, shared)
    client = client_of(leecher, peers=(seeder.peer,))
    plan = AcquisitionPlan(pk=41, title="Client test", source=str(shared.torrent))
    plan.download_dir = client.own_folder(plan)
    folder = Path(plan.download_dir)
    assert folder.parent == leecher.downloads and not folder.exists()
    d = client.identify(plan)
    ref = d.ref
    assert client.submit(plan, d) is True
    assert client.submit(plan, d) is True  # a step that runs again adds nothing twice
    [torrent] = leecher.api().torrents_info()
    assert set(torrent.tags.split(", ")) == {"umt", "umt-plan-41"}
    leecher.wait_complete(ref)
    done = client.poll(41, d)
    assert done is not None
    content = Path(done["content_path"])
    assert content == folder / "client.bin"
    assert content.read_bytes() == shared.path.read_bytes()
    assert client.remove(d, {7: str(folder)}) is False  # not added by plan 7: kept
    assert client.remove(d, {41: str(leecher.downloads / "other")}) is False  # not in its folder
    assert client.remove(d, {41: str(folder)}) is True
    assert client.remove(d, {41: str(folder)}) is False
    assert leecher.api().torrents_info() == []
    assert not folder.exists()  # the files deleted, then the emptied folder
    with pytest.raises(DownloadError, match="no longer has"):
        client.poll(41, d)
