"""Download clients: what the `acquire` workflow asks of one, and which one a plan uses.

A client is idempotent in every call, because a step that was interrupted runs again:
`identify` names the download without touching anything; `own_folder` names a folder that does
not exist yet, for the plan's download alone (the plan records it before `submit`); `submit`
hands the download over, saved in that folder, or adopts it when the client already has it, and
says which (True: UMT added it); `poll` tells whether it finished (None while it is not, or when
only the completion hook can tell) and raises DownloadMissing when the client no longer has it;
`paused` tells whether someone paused the unfinished download; `remove` forgets the download and
deletes its files, but only when one of the `owners` (plans that added it, with the folder each
recorded) put it there and its files are all inside that plan's own folder.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tasks_engine import NonRetryableError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..models import AcquisitionPlan

VIDEO_SUFFIXES = frozenset(
    {".mkv", ".mp4", ".m4v", ".avi", ".mov", ".wmv", ".webm", ".ts", ".m2ts", ".mpg", ".mpeg"}
)


@dataclass(frozen=True)
class Download:
    ref: str  # the client's id (qBittorrent's torrent id, or the folder client's path)
    hashes: tuple[str, ...] = ()  # every form the client may list it under


class DownloadClient(Protocol):
    kind: str

    def identify(self, plan: AcquisitionPlan) -> Download: ...

    def own_folder(self, plan: AcquisitionPlan) -> str: ...

    def submit(self, plan: AcquisitionPlan, download: Download) -> bool: ...

    def poll(self, plan_id: int, download: Download) -> dict[str, Any] | None: ...

    def paused(self, plan_id: int, download: Download) -> bool: ...

    def remove(self, download: Download, owners: Mapping[int, str]) -> bool: ...


class DownloadError(Exception):
    """The client refused or lost a download (retried by the step's policy)."""


class DownloadMissing(DownloadError):
    """The client does not list the download (removed by someone, or lost in a crash)."""


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


def wanted_files(content_path: str | Path, patterns: str = "") -> list[tuple[Path, str]]:
    """The files a plan takes from its download, as (path, path relative to the content),
    sorted: the path itself when it is a file; in a folder (a season pack), every file matching
    one of the comma-separated glob `patterns`, or every video file when there are none."""
    path = Path(content_path)
    if path.is_file():
        return [(path, path.name)]
    if not path.is_dir():
        raise DownloadError(f"the download's content {str(path)!r} does not exist")
    globs = [p.strip() for p in patterns.split(",") if p.strip()]
    found = []
    for p in sorted(path.rglob("*")):
        rel = p.relative_to(path).as_posix()
        if not p.is_file():
            continue
        if globs:
            if any(fnmatch.fnmatch(rel, g) or fnmatch.fnmatch(p.name, g) for g in globs):
                found.append((p, rel))
        elif p.suffix.lower() in VIDEO_SUFFIXES:
            found.append((p, rel))
    if not found:
        what = f"files matching {patterns!r}" if globs else "video files"
        raise BadSource(f"the download's content {str(path)!r} holds no {what}")
    return found
