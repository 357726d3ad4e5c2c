"""The qBittorrent client, through its Web API (`qbittorrent-api`).

The download's reference is the torrent's v1 info hash, computed from the .torrent file or the
magnet link before anything is added, so the plan records it before qBittorrent can finish (and
run its completion hook, which looks the plan up by `%I`). Torrents are tagged `umt` and
`umt-plan-<id>` so that they are easy to find in qBittorrent's own UI.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import qbittorrentapi
import torf

from . import BadSource, DownloadError

if TYPE_CHECKING:
    from ..conf import QBittorrentSettings
    from ..models import AcquisitionPlan

APPEAR_SECONDS = 15.0  # how long `add` waits for qBittorrent to list a torrent it accepted
TIMEOUT = (5.0, 30.0)  # connect, read


class QBittorrentClient:
    kind = "qbittorrent"

    def __init__(self, config: QBittorrentSettings) -> None:
        self.config = config
        self.api = qbittorrentapi.Client(
            host=config.url,
            username=config.username or None,
            password=config.password or None,
            REQUESTS_ARGS={"timeout": TIMEOUT},
            DISABLE_LOGGING_DEBUG_OUTPUT=True,
        )

    def identify(self, plan: AcquisitionPlan) -> str:
        source = plan.source.strip()
        try:
            if source.startswith("magnet:"):
                return str(torf.Magnet.from_string(source).infohash).lower()
            return str(torf.Torrent.read(source).infohash).lower()
        except (torf.TorfError, OSError) as exc:
            raise BadSource(f"plan #{plan.pk}: cannot read {source!r}: {exc}") from exc

    def add(self, plan: AcquisitionPlan, ref: str) -> None:
        if not self._info(ref):
            source = plan.source.strip()
            what: dict[str, Any] = (
                {"urls": source}
                if source.startswith("magnet:")
                else {"torrent_files": Path(source).read_bytes()}
            )
            self.api.torrents_add(
                **what,
                save_path=self.config.save_path or None,
                tags=["umt", f"umt-plan-{plan.pk}"],
            )
            end = time.monotonic() + APPEAR_SECONDS
            while not self._info(ref):  # add returns before the torrent is listed
                if time.monotonic() > end:
                    raise DownloadError(f"qBittorrent did not list torrent {ref} after adding it")
                time.sleep(0.1)
        self.add_peers(ref)

    def add_peers(self, ref: str) -> None:
        """Point the torrent at the configured peers (trackerless LANs; harmless to repeat)."""
        if self.config.peers:
            self.api.torrents_add_peers(peers=list(self.config.peers), torrent_hashes=ref)

    def poll(self, ref: str) -> dict[str, Any] | None:
        info = self._info(ref)
        if info is None:
            raise DownloadError(f"qBittorrent no longer has torrent {ref}")
        if float(info.progress) < 1:
            self.add_peers(ref)  # a restarted qBittorrent does not reconnect on its own
            return None
        return {"content_path": str(info.content_path), "ref": ref, "via": "poll"}

    def remove(self, ref: str) -> bool:
        if self._info(ref) is None:
            return False
        self.api.torrents_delete(delete_files=True, torrent_hashes=ref)
        return True

    def _info(self, ref: str) -> Any:
        found = self.api.torrents_info(torrent_hashes=ref)
        return found[0] if found else None
