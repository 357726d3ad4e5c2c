"""Every hash form a torrent may be listed under, from a magnet link or a .torrent file.

qBittorrent names a torrent by its id, libtorrent's "best" hash: the v2 hash truncated to 40
hex digits when it has one (v2 and hybrid torrents: a hybrid is listed, and its `%K` given, by
its truncated v2 hash, not by its v1 hash), else the v1 info hash (hex). Magnets may carry the
v1 hash in base32 (`xt=urn:btih:<32 chars>`) and a hybrid's v2 hash as a multihash
(`xt=urn:btmh:1220...`).
torf reads neither base32 as hex nor two `xt` parameters, so magnets are parsed here.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

HEX40 = re.compile(r"^[0-9a-f]{40}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")
SHA256_MULTIHASH = "1220"


class NotATorrent(ValueError):
    """The source names no torrent (a bad magnet, an unreadable .torrent)."""


@dataclass(frozen=True)
class TorrentId:
    v1: str = ""  # 40 hex digits, or empty (a v2-only torrent)
    v2: str = ""  # 64 hex digits, or empty (a v1-only torrent)

    @property
    def ref(self) -> str:
        """qBittorrent's torrent id (also its `%K`)."""
        return self.v2[:40] or self.v1

    @property
    def forms(self) -> tuple[str, ...]:
        """Every form qBittorrent may list or report it under."""
        return tuple(f for f in (self.v1, self.v2, self.v2[:40]) if f)


def from_magnet(magnet: str) -> TorrentId:
    query = parse_qs(urlsplit(magnet.strip()).query)
    v1 = v2 = ""
    for xt in query.get("xt", []):
        low = xt.lower()
        if low.startswith("urn:btih:"):
            v1 = _btih(xt[len("urn:btih:") :])
        elif low.startswith("urn:btmh:"):
            v2 = _btmh(low[len("urn:btmh:") :])
    if not (v1 or v2):
        raise NotATorrent("the magnet link has no xt=urn:btih or xt=urn:btmh")
    return TorrentId(v1, v2)


def _btih(value: str) -> str:
    if HEX40.match(value.lower()):
        return value.lower()
    if len(value) == 32:
        try:
            return base64.b32decode(value.upper()).hex()
        except binascii.Error:
            pass
    raise NotATorrent(f"xt=urn:btih:{value} is neither 40 hex digits nor 32 base32 characters")


def _btmh(value: str) -> str:
    digest = value.removeprefix(SHA256_MULTIHASH)
    if not (value.startswith(SHA256_MULTIHASH) and HEX64.match(digest)):
        raise NotATorrent(f"xt=urn:btmh:{value} is not a SHA-256 multihash")
    return digest


def from_torrent_file(path: str | Path) -> TorrentId:
    try:
        data = Path(path).read_bytes()
        info = _info_span(data)
    except (OSError, ValueError, IndexError) as exc:
        raise NotATorrent(f"cannot read {str(path)!r}: {exc}") from exc
    raw = data[info[0] : info[1]]
    has_v1 = b"6:pieces" in raw
    has_v2 = b"12:meta versioni2e" in raw
    if not (has_v1 or has_v2):
        raise NotATorrent(f"{str(path)!r} has neither v1 pieces nor a v2 file tree")
    return TorrentId(
        hashlib.sha1(raw).hexdigest() if has_v1 else "",
        hashlib.sha256(raw).hexdigest() if has_v2 else "",
    )


def _info_span(data: bytes) -> tuple[int, int]:
    """Where the top-level dictionary's `info` value starts and ends in bencoded `data`."""
    if data[:1] != b"d":
        raise ValueError("not a bencoded dictionary")
    i = 1
    while data[i : i + 1] != b"e":
        key_end = _skip(data, i)
        key = data[data.index(b":", i) + 1 : key_end]
        value_end = _skip(data, key_end)
        if key == b"info":
            return key_end, value_end
        i = value_end
    raise ValueError("no info dictionary")


def _skip(data: bytes, i: int) -> int:
    """The index just past the bencoded value at `i`."""
    c = data[i : i + 1]
    if c == b"i":
        return data.index(b"e", i) + 1
    if c in (b"l", b"d"):
        i += 1
        while data[i : i + 1] != b"e":
            i = _skip(data, i)
        return i + 1
    if c.isdigit():
        colon = data.index(b":", i)
        return colon + 1 + int(data[i:colon])
    raise ValueError(f"bad bencoding at byte {i}")
