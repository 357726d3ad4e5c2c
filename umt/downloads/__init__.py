"""Download clients: what the `acquire` workflow asks of one, and which one a plan uses.

A client is idempotent in every call, because a step that was interrupted runs again:
`identify` names the download without touching anything, `add` hands it over (again, harmlessly),
`poll` tells whether it finished (or None when the client cannot tell), `remove` forgets it and
deletes its files.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tasks_engine import NonRetryableError

if TYPE_CHECKING:
    from ..models import AcquisitionPlan


class DownloadClient(Protocol):
    kind: str

    def identify(self, plan: AcquisitionPlan) -> str:
        """The download's reference (an info hash, a path), computed without side effects."""
        ...

    def add(self, plan: AcquisitionPlan, ref: str) -> None:
        """Hand the download over; doing it twice is harmless."""
        ...

    def poll(self, ref: str) -> dict[str, Any] | None:
        """`{"content_path": ...}` once the download is complete; None while it is not (or when
        the client cannot tell, and only its completion hook knows)."""
        ...

    def remove(self, ref: str) -> bool:
        """Forget the download and delete its files. False when there was nothing to remove."""
        ...


class DownloadError(Exception):
    """The client refused or lost a download (retried by the step's policy)."""


class BadSource(DownloadError, NonRetryableError):
    """The plan's source cannot be a download (not retried: it will not get better)."""


def client_for(kind: str) -> DownloadClient:
    from ..conf import umt_settings

    s = umt_settings()
    if kind == "folder":
        from .folder import FolderClient

        return FolderClient(s.downloads_dir)
    if kind == "qbittorrent":
        from .qbittorrent import QBittorrentClient

        return QBittorrentClient(s.qbittorrent)
    raise ValueError(f"unknown download client {kind!r}")


def main_file(content_path: str | Path) -> Path:
    """The file to copy: the path itself, or the largest file of a multi-file download."""
    path = Path(content_path)
    if path.is_file():
        return path
    if path.is_dir():
        files = [p for p in path.rglob("*") if p.is_file()]
        if files:
            return max(files, key=lambda p: p.stat().st_size)
    raise DownloadError(f"the download's content {str(path)!r} holds no file")
