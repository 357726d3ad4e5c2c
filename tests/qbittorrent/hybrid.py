"""A hybrid (v1 + v2) single-file .torrent, built by hand: torf writes only v1 metainfo.

The info dictionary carries both descriptions of the same file (BEP 52, "upgrade path"):
- v2: `meta version` 2 and a `file tree` whose one file has its `pieces root`, the root of a
  SHA-256 merkle tree over the file's 16 KiB blocks; the torrent's top level carries `piece
  layers`, that tree's layer at piece granularity (one hash per piece).
- v1: `length` and `pieces` (SHA-1 per piece), as in any single-file torrent.

BEP 47 pads every file to a piece boundary in a hybrid so v1 pieces never span two files. A
single file has no following file, and libtorrent (qBittorrent's engine) pads a single-file
torrent on neither side: its hybrid check (files_compatible) requires the same file count in
both descriptions. So this single-file hybrid has no pad file and a v1 `length`, not `files`.

The v1 info hash is the SHA-1 of the bencoded info dictionary, the v2 hash its SHA-256.
qBittorrent 4.5 (libtorrent 2.0) names a hybrid by its v2 hash truncated to 40 hex digits,
not by its v1 hash: that is `Shared.info_hash` here, as for any torrent the seeder seeds.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from .instance import Shared, make_torrent

BLOCK = 16 * 1024  # BEP 52: merkle leaves are hashes of 16 KiB blocks
PIECE = 256 * 1024  # a power of two, at least BLOCK
ZERO = bytes(32)  # the leaf hash of the padding past the end of a file


def bencode(value: object) -> bytes:
    """Bencoding of ints, bytes, str, lists and dicts (keys sorted as raw bytes, as required)."""
    if isinstance(value, int):
        return b"i%de" % value
    if isinstance(value, str):
        value = value.encode()
    if isinstance(value, bytes):
        return b"%d:%s" % (len(value), value)
    if isinstance(value, list):
        return b"l" + b"".join(bencode(v) for v in value) + b"e"
    if isinstance(value, dict):
        items = sorted((k.encode() if isinstance(k, str) else k, v) for k, v in value.items())
        return b"d" + b"".join(bencode(k) + bencode(v) for k, v in items) + b"e"
    raise TypeError(f"cannot bencode {type(value).__name__}")


def merkle_layers(data: bytes) -> list[list[bytes]]:
    """Every layer of the file's v2 merkle tree, leaves first, root last. The leaves are the
    SHA-256 of each 16 KiB block (the last one short, hashed as it is), padded with zero hashes
    to a power of two, and never fewer than one piece's worth, so the layer at piece height
    exists and its last piece's hash covers zero leaves past the end of the file."""
    leaves = [hashlib.sha256(data[i : i + BLOCK]).digest() for i in range(0, len(data), BLOCK)]
    width = max(PIECE // BLOCK, 1 << (len(leaves) - 1).bit_length())
    layers = [leaves + [ZERO] * (width - len(leaves))]
    while len(layers[-1]) > 1:
        below = layers[-1]
        layers.append(
            [hashlib.sha256(below[i] + below[i + 1]).digest() for i in range(0, len(below), 2)]
        )
    return layers


@dataclass(frozen=True)
class Hybrid:
    shared: Shared  # the file, its hybrid .torrent, info_hash = qBittorrent's id (v2[:40])
    v1: str  # the v1 info hash (40 hex digits)
    v2: str  # the v2 info hash (64 hex digits)


def make_hybrid_torrent(folder: Path, name: str, size: int) -> Hybrid:
    """A file of `size` bytes (more than one piece) in `folder` and a hybrid .torrent for it."""
    assert size > PIECE, "a file of one piece has no piece layer: keep the helper to one shape"
    plain = make_torrent(folder, name, size)  # the data file (its v1-only .torrent is replaced)
    data = plain.path.read_bytes()
    layers = merkle_layers(data)
    root = layers[-1][0]
    pieces = -(-size // PIECE)
    # The layer where each node covers one piece: PIECE // BLOCK leaves below it. Only the
    # file's own pieces are listed; the padding nodes above zero leaves are left out.
    piece_layer = layers[(PIECE // BLOCK).bit_length() - 1][:pieces]
    info = {
        "name": name,
        "piece length": PIECE,
        # v2
        "meta version": 2,
        "file tree": {name: {"": {"length": size, "pieces root": root}}},
        # v1
        "length": size,
        "pieces": b"".join(
            hashlib.sha1(data[i : i + PIECE]).digest() for i in range(0, size, PIECE)
        ),
    }
    raw_info = bencode(info)
    plain.torrent.write_bytes(
        bencode({"info": info, "piece layers": {root: b"".join(piece_layer)}})
    )
    v1, v2 = hashlib.sha1(raw_info).hexdigest(), hashlib.sha256(raw_info).hexdigest()
    return Hybrid(Shared(plain.path, plain.torrent, v2[:40], plain.content_hash, size), v1, v2)
