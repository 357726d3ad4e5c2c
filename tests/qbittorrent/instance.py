"""A real `qbittorrent-nox` on loopback: one profile folder, free ports, start, stop, and
helpers to make a small torrent. Recipe: docs/qbittorrent-loopback.md; config:
fixtures/qbittorrent/."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import qbittorrentapi
import torf
import xxhash

from tests.helpers import ROOT, wait_for

BINARY = shutil.which("qbittorrent-nox")
# Skipped on a developer's machine without it; in CI (`CI` set) a missing client is a failure.
IN_CI = bool(os.environ.get("CI"))
if BINARY is None and IN_CI:
    raise RuntimeError("CI: qbittorrent-nox is not installed (scripts/install-system-deps)")
needs_qbittorrent = pytest.mark.skipif(BINARY is None, reason="qbittorrent-nox is not installed")
CONF_TEMPLATE = ROOT / "fixtures" / "qbittorrent" / "qBittorrent.conf"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Instance:
    root: Path
    name: str
    bt_port: int = field(default_factory=free_port)
    webui_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.webui_port}"

    @property
    def peer(self) -> str:
        return f"127.0.0.1:{self.bt_port}"

    @property
    def downloads(self) -> Path:
        return self.root / self.name / "downloads"

    @property
    def log_path(self) -> Path:
        return self.root / self.name / "qbittorrent-nox.log"

    def start(self) -> Instance:
        assert BINARY is not None
        profile = self.root / self.name / "profile"
        conf = profile / "qBittorrent" / "config" / "qBittorrent.conf"
        conf.parent.mkdir(parents=True, exist_ok=True)
        self.downloads.mkdir(parents=True, exist_ok=True)
        conf.write_text(
            CONF_TEMPLATE.read_text().format(
                bt_port=self.bt_port, webui_port=self.webui_port, save_path=self.downloads
            )
        )
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [BINARY, f"--profile={profile}"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        end = time.monotonic() + 20
        while True:
            try:
                self.api().app_version()
                return self
            except qbittorrentapi.APIConnectionError:
                if self.proc.poll() is not None or time.monotonic() > end:
                    raise RuntimeError(f"{self.name} did not start: {self.log()}") from None
                time.sleep(0.1)

    def api(self) -> qbittorrentapi.Client:
        return qbittorrentapi.Client(
            host=self.url, REQUESTS_ARGS={"timeout": (2, 10)}, DISABLE_LOGGING_DEBUG_OUTPUT=True
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)

    def kill(self) -> None:
        """SIGKILL: no resume data saved since the last periodic save."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def restart(self) -> Instance:
        """Stop cleanly (SIGTERM: resume data saved) and start again on the same ports."""
        self.stop()
        return self.start()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_complete(self, info_hash: str, timeout: float = 90.0, peer: str | None = None) -> None:
        """A test's own download (its setup, not what it checks): on a loaded machine the
        first peer connection can be lost (CI once waited 30 s for nothing), so `peer` is
        offered again every 5 s."""
        end = time.monotonic() + timeout
        offer = time.monotonic() + 5
        while time.monotonic() < end:
            found = self.api().torrents_info(torrent_hashes=info_hash)
            if found and float(found[0].progress) >= 1:
                return
            if peer is not None and time.monotonic() >= offer:
                self.api().torrents_add_peers(peers=peer, torrent_hashes=info_hash)
                offer = time.monotonic() + 5
            time.sleep(0.1)
        raise AssertionError(f"{self.name}: torrent {info_hash} not complete after {timeout}s")


@dataclass(frozen=True)
class Shared:
    """A file the seeder seeds, and its torrent."""

    path: Path
    torrent: Path
    info_hash: str
    content_hash: str  # XXH3-128, what the library copy records
    size: int


def make_torrent(folder: Path, name: str, size: int, salt: str = "") -> Shared:
    """A file of `size` pseudo-random bytes in `folder` and a trackerless .torrent for it (a
    different `salt`: other bytes under the same name)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    data = pseudo_random(f"{salt}{name}", size)
    path.write_bytes(data)
    t = torf.Torrent(path=path, trackers=[], private=False, piece_size=256 * 1024)
    t.generate()
    torrent = folder.parent / f"{name}.torrent"
    t.write(torrent, overwrite=True)
    return Shared(path, torrent, str(t.infohash).lower(), xxhash.xxh3_128_hexdigest(data), size)


def pseudo_random(key: str, size: int) -> bytes:
    block = b"".join(hashlib.sha256(f"{key}:{i}".encode()).digest() for i in range(2048))
    return (block * (size // len(block) + 1))[:size]


def seed(seeder: Instance, shared: Shared) -> None:
    seeder.api().torrents_add(
        torrent_files=shared.torrent.read_bytes(), save_path=str(shared.path.parent)
    )
    seeder.wait_complete(shared.info_hash)  # rechecked: it has every piece and seeds


def users_own_torrent(seeder: Instance, leecher: Instance, shared: Shared) -> Shared:
    """`shared` as the user's own torrent: seeded, added to the client UMT drives with the
    user's tag (`mine`) into its plain save path, and complete there."""
    seed(seeder, shared)
    api = leecher.api()
    api.torrents_add(
        torrent_files=shared.torrent.read_bytes(), save_path=str(leecher.downloads), tags="mine"
    )
    wait_for(lambda: api.torrents_info(torrent_hashes=shared.info_hash), 10, "the user's add")
    api.torrents_add_peers(peers=seeder.peer, torrent_hashes=shared.info_hash)
    leecher.wait_complete(shared.info_hash, peer=seeder.peer)
    return shared


def only_the_users_torrent_left(leecher: Instance, own: Shared) -> None:
    """Every torrent but the user's removed (what earlier tests left), downloads unthrottled."""
    api = leecher.api()
    api.app_set_preferences({"dl_limit": 0, "autorun_enabled": False})
    others = [t.hash for t in api.torrents_info() if t.hash != own.info_hash]
    if others:
        api.torrents_delete(delete_files=True, torrent_hashes=others)
        wait_for(lambda: len(api.torrents_info()) == 1, 10, "the leftover torrents to go")
