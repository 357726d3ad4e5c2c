"""UMT's verified copy (umt/library.py: copy, SHA-256 of the source, fsync, read back and
compare, rename) against `cp` of the same file on the same disk, in one run.

    python bench/copy_speed.py [--size-mib 2048] [--repeats 3] [--dir /tmp]

One source file of --size-mib pseudo-random MiB in a fresh folder under --dir; one untimed
warm-up copy of each kind; then --repeats rounds, each timing, one after the other: `cp`
alone, `cp` followed by an fsync of the copy (what a copy that survives a power cut costs),
and UMT's copy. The page cache cannot be dropped here (no write access to
/proc/sys/vm/drop_caches in this container): the source is cached for every copy, and
alternating the three gives each the same cache state. Prints a table (median seconds, MiB/s,
ratio to `cp`) and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from common import ROOT  # noqa: F401 - puts the repository on sys.path, sets Django settings

BLOCK = 64 * 1024 * 1024


class _Ctx:
    """What the copier asks of a TaskContext, and nothing else."""

    abort_signal = threading.Event()

    def progress(self, done: float, total: float | None = None, message: str | None = None):
        pass

    def raise_if_canceled(self) -> None:
        pass


def make_source(path: Path, size: int) -> None:
    block = os.urandom(BLOCK)
    with path.open("wb") as f:
        left = size
        while left > 0:
            left -= f.write(block[: min(BLOCK, left)])
        f.flush()
        os.fsync(f.fileno())


def time_cp(src: Path, dst: Path, *, fsync: bool) -> float:
    started = time.perf_counter()
    subprocess.run(["cp", str(src), str(dst)], check=True)
    if fsync:
        fd = os.open(dst, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    took = time.perf_counter() - started
    dst.unlink()
    return took


def time_umt(src: Path, library: Path) -> float:
    from umt.conf import UmtSettings
    from umt.library import Copier

    s = UmtSettings(library_dir=library)
    dest = library / "Film" / "Film.mkv"
    partial = s.partial_dir / "bench.part"
    copier = Copier(_Ctx(), src, dest, partial, s)  # type: ignore[arg-type]
    started = time.perf_counter()
    copier.run(resumed=False)
    took = time.perf_counter() - started
    dest.unlink()
    return took


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mib", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default=tempfile.gettempdir())
    args = p.parse_args()
    # This file's name is the standard library's `copy`: put its folder behind the library's.
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [*(p for p in sys.path if p != here), here]
    import django

    django.setup()
    size = args.size_mib * 1024 * 1024
    work = Path(tempfile.mkdtemp(prefix="umt-copy-bench-", dir=args.dir))
    try:
        src = work / "source.mkv"
        make_source(src, size)
        times: dict[str, list[float]] = {"cp": [], "cp + fsync": [], "umt verified copy": []}
        time_cp(src, work / "cp.mkv", fsync=True)  # untimed warm-up: caches, first allocation
        time_umt(src, work / "library")
        for _ in range(args.repeats):
            times["cp"].append(time_cp(src, work / "cp.mkv", fsync=False))
            times["cp + fsync"].append(time_cp(src, work / "cp.mkv", fsync=True))
            times["umt verified copy"].append(time_umt(src, work / "library"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cp = statistics.median(times["cp"])
    rows: list[dict[str, Any]] = []
    print(f"{args.size_mib} MiB, {args.repeats} alternated repetitions, medians, page cache warm")
    print(f"{'':<20} {'seconds':>8} {'MiB/s':>8} {'vs cp':>6}")
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append({"name": name, "seconds": ts, "median": med, "vs_cp": cp / med})
        print(f"{name:<20} {med:>8.2f} {args.size_mib / med:>8.0f} {cp / med:>5.2f}x")
    print(json.dumps({"bench": "copy", "size_mib": args.size_mib, "rows": rows}))


if __name__ == "__main__":
    main()
