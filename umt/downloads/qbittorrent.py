"""The qBittorrent client, through its Web API (`qbittorrent-api`).

A torrent is found by every hash form qBittorrent may list it under (`hashes.py`) or by the
plan's tag. UMT adds a torrent into a folder of the plan's own,
`<save path>/umt-plan-<id>-<random>` (one that did not exist: qBittorrent never writes over a
file UMT did not create), tags it `umt` and `umt-plan-<id>`, and never tags, removes or deletes
a torrent it found already there (the user's own, or another plan's): `submit` says which it
was, the workflow records that in the op ledger, and `remove` deletes only a torrent carrying
the tag of a plan that added it whose files all lie in that plan's folder (a torrent someone
moved elsewhere is left as it is).
"""

from __future__ import annotations

import contextlib
import functools
import os
import posixpath
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import qbittorrentapi

from . import BadSource, Download, DownloadError, DownloadMissing
from .hashes import NotATorrent, TorrentId, from_magnet, from_torrent_file
from .logins import LoginRation, LoginRefused

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..conf import QBittorrentSettings
    from ..models import AcquisitionPlan

APPEAR_SECONDS = 15.0  # how long `submit` waits for qBittorrent to list a torrent it accepted
TIMEOUT = (5.0, 30.0)  # connect, read
INCOMPLETE_SUFFIX = ".!qB"  # qBittorrent's "append .!qB to incomplete files"
# States in which progress may read 1 while the files are not (yet) where content_path says.
UNSETTLED = frozenset(
    {"moving", "checkingUP", "checkingDL", "checkingResumeData", "allocating", "metaDL"}
)
PAUSED_DOWNLOADING = frozenset({"pausedDL", "stoppedDL"})  # 5.x renamed paused to stopped
FILES_GONE_SECONDS = 10.0  # how long `remove` waits for qBittorrent to delete the files


def plan_tag(plan_id: int) -> str:
    return f"umt-plan-{plan_id}"


class _RationedApi(qbittorrentapi.Client):
    """The Web API client, whose logins (it logs in again by itself on a 403) go through
    UMT's ration (logins.py): never a burst of failed logins that gets the address banned."""

    ration: LoginRation

    def auth_log_in(
        self, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> None:
        self.ration.reserve()
        try:
            super().auth_log_in(username, password, **kwargs)
        except qbittorrentapi.HTTP403Error as exc:  # banned, or logins refused outright
            raise LoginRefused(self.ration.failed(f"403 Forbidden ({_said(exc)})")) from exc
        except qbittorrentapi.LoginFailed as exc:
            raise LoginRefused(self.ration.failed("wrong username or password")) from exc
        except qbittorrentapi.APIConnectionError:
            self.ration.not_answered()  # no answer (a restart): not a failed login
            raise
        self.ration.succeeded()


def _said(exc: Exception) -> str:
    return str(exc).strip() or "no reason given"


def _speaking_errors[T](method: Callable[..., T]) -> Callable[..., T]:
    """qBittorrent's errors as DownloadErrors that say what happened (its LoginFailed and
    some 403s carry no message at all)."""

    @functools.wraps(method)
    def call(self: QBittorrentClient, *args: Any, **kwargs: Any) -> T:
        url = self.config.url
        try:
            return method(self, *args, **kwargs)
        except DownloadError:
            raise
        except qbittorrentapi.HTTP403Error as exc:
            raise DownloadError(
                f"qBittorrent at {url} answered 403 Forbidden ({_said(exc)})"
            ) from exc
        except qbittorrentapi.LoginFailed as exc:
            raise DownloadError(f"qBittorrent at {url} refused UMT's login ({_said(exc)})") from exc
        except qbittorrentapi.APIConnectionError as exc:
            raise DownloadError(f"cannot reach qBittorrent at {url}: {_said(exc)}") from exc
        except qbittorrentapi.APIError as exc:
            raise DownloadError(
                f"qBittorrent at {url}: {type(exc).__name__} ({_said(exc)})"
            ) from exc

    return call


class QBittorrentClient:
    kind = "qbittorrent"

    def __init__(self, config: QBittorrentSettings) -> None:
        self.config = config
        self.api = _RationedApi(
            host=config.url,
            username=config.username or None,
            password=config.password or None,
            REQUESTS_ARGS={"timeout": TIMEOUT},
            DISABLE_LOGGING_DEBUG_OUTPUT=True,
        )
        self.api.ration = LoginRation(
            config.url,
            config.username,
            config.password,
            config.login_attempts,
            config.login_backoff_seconds,
        )

    def identify(self, plan: AcquisitionPlan) -> Download:
        source = plan.source.strip()
        try:
            tid = from_magnet(source) if source.startswith("magnet:") else from_torrent_file(source)
        except NotATorrent as exc:
            raise BadSource(f"plan #{plan.pk}: cannot read {source!r}: {exc}") from exc
        return Download(tid.ref, tid.forms)

    @_speaking_errors
    def own_folder(self, plan: AcquisitionPlan) -> str:
        """A folder nobody has used: `<save path>/umt-plan-<id>-<random>` (qBittorrent's default
        save path when none is configured)."""
        root = self.config.save_path or str(self.api.app_default_save_path())
        while True:
            folder = posixpath.join(root, f"{plan_tag(plan.pk)}-{secrets.token_hex(4)}")
            if not os.path.lexists(folder):  # the workers see the save path (they copy from it)
                return folder

    @_speaking_errors
    def submit(self, plan: AcquisitionPlan, download: Download) -> bool:
        found = self.find(download, plan.pk)
        if found is not None:
            self.add_peers(found.hash)
            return plan_tag(plan.pk) in _tags(found)  # an earlier attempt of this plan added it
        if not plan.download_dir:
            raise DownloadError(f"plan #{plan.pk} has no folder of its own to download into")
        source = plan.source.strip()
        what: dict[str, Any] = (
            {"urls": source}
            if source.startswith("magnet:")
            else {"torrent_files": Path(source).read_bytes()}
        )
        # Explicitly manual, and no separate folder for incomplete files: every file the
        # torrent writes is in the plan's folder, whatever the client's defaults say.
        self.api.torrents_add(
            **what,
            save_path=plan.download_dir,
            use_auto_torrent_management=False,
            use_download_path=False,
            tags=["umt", plan_tag(plan.pk)],
        )
        end = time.monotonic() + APPEAR_SECONDS
        while (found := self.find(download, plan.pk)) is None:  # add returns before it is listed
            if time.monotonic() > end:
                raise DownloadMissing(f"qBittorrent did not list torrent {download.ref} in time")
            time.sleep(0.1)
        self.add_peers(found.hash)
        return True

    def add_peers(self, torrent_id: str) -> None:
        """Point the torrent at the configured peers (trackerless LANs; harmless to repeat)."""
        if self.config.peers:
            self.api.torrents_add_peers(peers=list(self.config.peers), torrent_hashes=torrent_id)

    @_speaking_errors
    def poll(self, plan_id: int, download: Download) -> dict[str, Any] | None:
        info = self.find(download, plan_id)
        if info is None:
            raise DownloadMissing(f"qBittorrent no longer has torrent {download.ref}")
        if not self._settled(info):
            self.add_peers(info.hash)  # a restarted qBittorrent does not reconnect on its own
            return None
        return {"content_path": str(info.content_path), "ref": download.ref, "via": "poll"}

    def _settled(self, info: Any) -> bool:
        """Complete, and its files where content_path says, under their final names."""
        if float(info.progress) < 1 or info.state in UNSETTLED:
            return False
        content = Path(str(info.content_path))
        if str(content).endswith(INCOMPLETE_SUFFIX) or not content.exists():
            return False
        names = [str(f.name) for f in self.api.torrents_files(torrent_hash=info.hash)]
        return not any(n.endswith(INCOMPLETE_SUFFIX) for n in names)

    @_speaking_errors
    def paused(self, plan_id: int, download: Download) -> bool:
        info = self.find(download, plan_id)
        return info is not None and info.state in PAUSED_DOWNLOADING and float(info.progress) < 1

    @_speaking_errors
    def remove(self, download: Download, owners: Mapping[int, str]) -> bool:
        info = self.find(download, None)
        if info is None:
            return False
        tags = _tags(info)
        folders = [f for pk, f in owners.items() if f and plan_tag(pk) in tags]
        folder = next((f for f in folders if self._all_files_in(info, f)), None)
        if folder is None:
            return False  # not added by UMT, or its files are not (all) in UMT's own folder
        self.api.torrents_delete(delete_files=True, torrent_hashes=info.hash)
        _remove_empty_folder(folder)
        return True

    def _all_files_in(self, info: Any, folder: str) -> bool:
        if not _within(str(info.get("save_path") or ""), folder):
            return False
        # Just after an add qBittorrent may list the content path relative (the bare name).
        places = [str(info.get(k) or "") for k in ("content_path", "download_path")]
        if not all(_within(p, folder) for p in places if posixpath.isabs(p)):
            return False
        names = [str(f.name) for f in self.api.torrents_files(torrent_hash=info.hash)]
        return all(not posixpath.isabs(n) and not _escapes(n) for n in names)

    def find(self, download: Download, plan_id: int | None) -> Any:
        """The torrent, by any of its hash forms or (when given) the plan's tag."""
        forms = set(download.hashes)
        tag = plan_tag(plan_id) if plan_id is not None else None
        for info in self.api.torrents_info():
            listed = {str(info.get(k) or "") for k in ("hash", "infohash_v1", "infohash_v2")}
            listed |= {h[:40] for h in listed}
            if listed & forms or (tag is not None and tag in _tags(info)):
                return info
        return None


def _within(path: str, folder: str) -> bool:
    if not posixpath.isabs(path):
        return False
    path, folder = posixpath.normpath(path), posixpath.normpath(folder)
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _escapes(name: str) -> bool:
    return posixpath.normpath(name).split("/")[0] == ".."


def _remove_empty_folder(folder: str) -> None:
    """Once qBittorrent has deleted the files (it does so after answering), remove the plan's
    folder if it is empty; anything still in it stays (only empty directories are removed)."""
    if not os.path.isdir(folder):
        return  # not visible from here, or already gone
    end = time.monotonic() + FILES_GONE_SECONDS
    while _holds_files(folder) and time.monotonic() < end:
        time.sleep(0.1)
    for here, _dirs, _files in os.walk(folder, topdown=False):
        with contextlib.suppress(OSError):  # not empty: something is still in it
            os.rmdir(here)


def _holds_files(folder: str) -> bool:
    return any(files for _here, _dirs, files in os.walk(folder))


def _tags(info: Any) -> set[str]:
    return {t.strip() for t in str(info.get("tags") or "").split(",") if t.strip()}


__all__ = ["QBittorrentClient", "TorrentId", "plan_tag"]
