"""UMT's verified copy (umt/library.py: read, XXH3-128 of the source, write, XXH3-128 of the
copy read back, writeback, fsync, compare, rename) against `cp` of the same data on the same
disk, in one run, for a single file and for a season pack.

    python bench/copy_speed.py [--size-mib 2048] [--pack-files 8] [--repeats 3] [--dir /tmp]
                               [--baseline REV]

One source file of --size-mib pseudo-random MiB, and a season pack of --pack-files files of the
same total size, in a fresh folder under --dir; one untimed warm-up copy of each kind; then
--repeats rounds, each timing, one after the other: `cp` alone, `cp` followed by an fsync of
the copies (what a copy that survives a power cut costs), the floor of any durable copy on
this disk (the bytes moved as `cp` moves them, each chunk's writeback started at once, an fsync
per file: no hash, no verification), UMT's copy (file by file, as the workflow does), and UMT's
copy with its fsync and writeback turned off (not durable: a row
that shows what hashing and verifying cost apart from the disk's writes); with --baseline REV,
also the copier of umt/library.py as commit REV has it, in the same rounds. Every row starts
after an `os.sync()` (untimed), so no row's writes queue behind dirty pages the row before it
left. The page cache
cannot be dropped here (no write access to /proc/sys/vm/drop_caches in this container): the
source is cached for every copy, and alternating the kinds gives each the same cache state.
Also reports the peak memory of UMT's copies above what the process held before each (Linux:
VmHWM, reset through /proc/self/clear_refs). Prints a table per layout (median seconds, MiB/s,
ratio to `cp`) and one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common import ROOT  # puts the repository on sys.path, sets Django settings

BLOCK = 64 * 1024 * 1024
FLOOR_CHUNK = 8 * 1024 * 1024
STATUS = Path("/proc/self/status")


class _Ctx:
    """What the copier asks of a TaskContext, and nothing else."""

    abort_signal = threading.Event()

    def progress(self, done: float, total: float | None = None, message: str | None = None):
        pass

    def raise_if_canceled(self) -> None:
        pass


def make_sources(folder: Path, size: int, parts: int) -> list[Path]:
    """`parts` files of `size` bytes in all, pseudo-random."""
    folder.mkdir(parents=True)
    block = os.urandom(BLOCK)
    paths = []
    for i in range(parts):
        path = folder / f"S01E{i + 1:02d}.mkv"
        left = size // parts + (size % parts if i == 0 else 0)
        with path.open("wb") as f:
            while left > 0:
                left -= f.write(block[: min(BLOCK, left)])
            f.flush()
            os.fsync(f.fileno())
        paths.append(path)
    return paths


def time_cp(sources: list[Path], out: Path, *, fsync: bool) -> float:
    out.mkdir()
    started = time.perf_counter()
    subprocess.run(["cp", *map(str, sources), str(out)], check=True)
    if fsync:
        for copy in out.iterdir():
            fd = os.open(copy, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
    took = time.perf_counter() - started
    shutil.rmtree(out)
    return took


def time_floor(sources: list[Path], out: Path) -> float:
    """The least any durable copy costs on this disk: the bytes moved inside the kernel
    (copy_file_range, as `cp` does), each chunk's writeback started at once, an fsync per file;
    no hash, no verification."""
    from umt.library import _start_writeback

    out.mkdir()
    started = time.perf_counter()
    for src in sources:
        with src.open("rb") as s, (out / src.name).open("wb") as d:
            size, done = os.fstat(s.fileno()).st_size, 0
            while done < size:
                n = min(FLOOR_CHUNK, size - done)
                end = done + n
                while done < end:
                    done += os.copy_file_range(s.fileno(), d.fileno(), end - done, done, done)
                _start_writeback(d.fileno(), end - n, n)
            os.fsync(d.fileno())
    took = time.perf_counter() - started
    shutil.rmtree(out)
    return took


def _kib(field: str) -> int:
    found = re.search(rf"{field}:\s+(\d+) kB", STATUS.read_text()) if STATUS.exists() else None
    return int(found[1]) if found else 0


def _reset_peak() -> None:
    with contextlib.suppress(OSError):  # not Linux: the peak is not measured
        Path("/proc/self/clear_refs").write_text("5")


def time_umt(
    sources: list[Path], library: Path, peaks: list[int], copier_class: Any = None
) -> float:
    from umt.conf import UmtSettings
    from umt.library import Copier

    make = copier_class or Copier  # the baseline's class, when measured
    s = UmtSettings(library_dir=library)
    took = 0.0
    for i, src in enumerate(sources):
        dest = library / "Show" / src.name
        partial = dest.parent / f".umt-bench-{i}.part"  # where the workflow puts it, too
        copier = make(_Ctx(), src, dest, partial, s)  # type: ignore[arg-type]
        _reset_peak()
        baseline = _kib("VmRSS")
        started = time.perf_counter()
        copier.run(resumed=False)
        took += time.perf_counter() - started
        peaks.append(_kib("VmHWM") - baseline)
    shutil.rmtree(library)
    return took


@contextlib.contextmanager
def no_fsync() -> Iterator[None]:
    """UMT's copy without its durability (fsync and writeback are no-ops): not a mode UMT
    has, a row that shows what the hashing and verifying cost apart from the disk's writes."""
    import umt.library

    saved = os.fsync, umt.library._start_writeback
    os.fsync, umt.library._start_writeback = (lambda fd: None), (lambda *args: None)
    try:
        yield
    finally:
        os.fsync, umt.library._start_writeback = saved


def baseline_copier(rev: str) -> Any:
    """The Copier of umt/library.py as commit `rev` has it, loaded beside this tree's (its
    relative imports resolve to this tree's umt package), to be measured in the same run."""
    import importlib.util

    text = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:umt/library.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    with tempfile.TemporaryDirectory(prefix="umt-copy-baseline-") as folder:
        path = Path(folder) / "library.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location("umt._baseline_library", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return module.Copier


def _settled() -> None:
    """Every row starts from the same state: no dirty pages left by the row before (a copy
    deleted before its writeback finished, another process's writes) for this row's writes
    to queue behind."""
    os.sync()


def measure(
    work: Path, sources: list[Path], repeats: int, baseline: Any = None
) -> tuple[dict[str, list[float]], int]:
    rows: dict[str, Any] = {
        "cp": lambda: time_cp(sources, work / "cp", fsync=False),
        "cp + fsync": lambda: time_cp(sources, work / "cp", fsync=True),
        "floor (copy+fsync)": lambda: time_floor(sources, work / "floor"),
        "umt verified copy": lambda: time_umt(sources, work / "library", peaks),
    }
    if baseline is not None:
        rows["umt (baseline)"] = lambda: time_umt(sources, work / "library", [], baseline)
    rows["(umt without fsync)"] = lambda: _without_fsync(sources, work / "library")
    times: dict[str, list[float]] = {name: [] for name in rows}
    peaks: list[int] = []
    time_cp(sources, work / "cp", fsync=True)  # untimed warm-up: caches, first allocation
    time_umt(sources, work / "library", [])
    for _ in range(repeats):
        for name, row in rows.items():
            _settled()
            times[name].append(row())
    return times, max(peaks)


def _without_fsync(sources: list[Path], library: Path) -> float:
    with no_fsync():
        return time_umt(sources, library, [])


def report(label: str, size_mib: int, times: dict[str, list[float]]) -> list[dict[str, Any]]:
    cp = statistics.median(times["cp"])
    rows: list[dict[str, Any]] = []
    print(f"\n{label}")
    print(f"{'':<20} {'seconds':>8} {'MiB/s':>8} {'vs cp':>6}")
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append({"name": name, "seconds": ts, "median": med, "vs_cp": cp / med})
        print(f"{name:<20} {med:>8.2f} {size_mib / med:>8.0f} {cp / med:>5.2f}x")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mib", type=int, default=2048)
    p.add_argument("--pack-files", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default=tempfile.gettempdir())
    p.add_argument(
        "--baseline",
        metavar="REV",
        help="also measure umt/library.py as of this commit, alternated in the same rounds",
    )
    args = p.parse_args()
    # This file's name is the standard library's `copy`: put its folder behind the library's.
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [*(p for p in sys.path if p != here), here]
    import django

    django.setup()
    size = args.size_mib * 1024 * 1024
    try:
        baseline = baseline_copier(args.baseline) if args.baseline else None
    except subprocess.CalledProcessError:
        p.error(f"--baseline: no umt/library.py at {args.baseline!r} in this repository")
    work = Path(tempfile.mkdtemp(prefix="umt-copy-bench-", dir=args.dir))
    layouts = {"single file": 1, f"season pack of {args.pack_files} files": args.pack_files}
    results: dict[str, Any] = {}
    try:
        for label, parts in layouts.items():
            sources = make_sources(work / f"src-{parts}", size, parts)
            times, peak_kib = measure(work, sources, args.repeats, baseline)
            shutil.rmtree(sources[0].parent)
            head = f"{label}: {args.size_mib} MiB, {args.repeats} alternated rounds, medians, warm"
            rows = report(head, args.size_mib, times)
            print(f"umt copy peak memory above its baseline: {peak_kib / 1024:.1f} MiB")
            results[label] = {"rows": rows, "peak_mib": peak_kib / 1024}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"bench": "copy", "size_mib": args.size_mib, "layouts": results}))


if __name__ == "__main__":
    main()
