"""Two qbittorrent-nox instances per test module: a seeder, and the leecher that UMT drives.
Test modules skip themselves when qbittorrent-nox is not installed (`needs_qbittorrent`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .instance import Instance


@pytest.fixture(scope="module")
def qbt_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("qbt")


@pytest.fixture(scope="module")
def seeder(qbt_root: Path) -> Iterator[Instance]:
    inst = Instance(qbt_root, "seeder").start()
    yield inst
    inst.stop()


@pytest.fixture(scope="module")
def leecher(qbt_root: Path) -> Iterator[Instance]:
    inst = Instance(qbt_root, "leecher").start()
    yield inst
    inst.stop()
