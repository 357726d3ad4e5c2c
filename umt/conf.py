"""UMT settings (`settings.UMT`, filled from `UMT_*` environment variables) with typed defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings


@dataclass(frozen=True)
class QBittorrentSettings:
    url: str = "http://127.0.0.1:8080"  # the Web UI / Web API address
    username: str = ""  # empty: no login (qBittorrent's "bypass authentication for localhost")
    password: str = field(default="", repr=False)  # never printed
    save_path: str = ""  # where qBittorrent saves downloads; empty: its own default
    peers: tuple[str, ...] = ()  # "host:port" peers added to every torrent (LAN seeders, tests)
    # qBittorrent bans an address after 5 failed logins (WebUI\MaxAuthenticationFailCount):
    # UMT stops after this many in a row with the same credentials, waiting longer after each.
    login_attempts: int = 3
    login_backoff_seconds: float = 60.0  # after the first failed login; x4 after each next


@dataclass(frozen=True)
class UmtSettings:
    library_dir: Path = Path("media/library")  # the media library: only complete files land here
    downloads_dir: Path = Path("media/downloads")  # the folder client's download folder
    retention_seconds: float = 7 * 24 * 3600  # keep (and seed) the source this long after copying
    download_timeout_seconds: float = 14 * 24 * 3600  # give up waiting for a download
    download_check_seconds: float = 600  # also ask the client this often (0: hook only)
    copy_chunk_bytes: int = 8 * 1024 * 1024  # progress and cancel are checked once a chunk
    copy_rate_limit: float = 0  # bytes per second, 0: as fast as the disks go
    presence_check_seconds: float = 600  # hook-only mode still asks whether the torrent is there
    retry_initial_seconds: float = 1.0  # network and file steps' first retry delay
    retry_max_seconds: float = 60.0  # ... growing 4x per attempt up to this
    # A cleanup that cannot reach the client is retried by a run of its own (release-download):
    cleanup_retry_seconds: float = 60.0  # first retry delay, doubling ...
    cleanup_retry_max_seconds: float = 6 * 3600  # ... up to this
    cleanup_attempts: int = 60  # then that run fails (the plan stays done); about 14 days
    qbittorrent: QBittorrentSettings = field(default_factory=QBittorrentSettings)


def umt_settings() -> UmtSettings:
    raw: dict[str, Any] = getattr(settings, "UMT", {}) or {}
    qbt: dict[str, Any] = raw.get("QBITTORRENT", {}) or {}
    d = UmtSettings()
    return UmtSettings(
        library_dir=Path(raw.get("LIBRARY_DIR", d.library_dir)),
        downloads_dir=Path(raw.get("DOWNLOADS_DIR", d.downloads_dir)),
        retention_seconds=float(raw.get("RETENTION_SECONDS", d.retention_seconds)),
        download_timeout_seconds=float(
            raw.get("DOWNLOAD_TIMEOUT_SECONDS", d.download_timeout_seconds)
        ),
        download_check_seconds=float(raw.get("DOWNLOAD_CHECK_SECONDS", d.download_check_seconds)),
        copy_chunk_bytes=int(raw.get("COPY_CHUNK_BYTES", d.copy_chunk_bytes)),
        copy_rate_limit=float(raw.get("COPY_RATE_LIMIT", d.copy_rate_limit)),
        presence_check_seconds=float(raw.get("PRESENCE_CHECK_SECONDS", 600)),
        retry_initial_seconds=float(raw.get("RETRY_INITIAL_SECONDS", 1.0)),
        retry_max_seconds=float(raw.get("RETRY_MAX_SECONDS", 60.0)),
        cleanup_retry_seconds=float(raw.get("CLEANUP_RETRY_SECONDS", d.cleanup_retry_seconds)),
        cleanup_retry_max_seconds=float(
            raw.get("CLEANUP_RETRY_MAX_SECONDS", d.cleanup_retry_max_seconds)
        ),
        cleanup_attempts=int(raw.get("CLEANUP_ATTEMPTS", d.cleanup_attempts)),
        qbittorrent=QBittorrentSettings(
            url=str(qbt.get("URL", d.qbittorrent.url)),
            username=str(qbt.get("USERNAME", "")),
            password=str(qbt.get("PASSWORD", "")),
            save_path=str(qbt.get("SAVE_PATH", "")),
            peers=tuple(p for p in qbt.get("PEERS", ()) if p),
            login_attempts=int(qbt.get("LOGIN_ATTEMPTS", d.qbittorrent.login_attempts)),
            login_backoff_seconds=float(
                qbt.get("LOGIN_BACKOFF_SECONDS", d.qbittorrent.login_backoff_seconds)
            ),
        ),
    )
