"""Copying a finished download into the library, the `copy-file` step's body.

The copy goes to a hidden temporary file in the destination's own folder (resolved through
symlinks, so a title folder on another filesystem gets its temporary file there too), in
chunks (progress reported and cancel checked between chunks), is verified against the source,
fsynced and renamed into place: the library never holds a half file, and on any failure the
temporary file (and the folders this attempt created) are removed.

Speed (bench/copy_speed.py): the source is read once, through a small buffer that stays in
the CPU's cache, hashed there with XXH3-128 and written to the copy; a helper thread hashes the
copy one chunk behind, read back from the library's filesystem (mapped: no memory copy; xxhash
and file I/O release the GIL), and another starts writing each written chunk to the disk, so
the final fsync has little left to do. The bench's floor row (copy and fsync, no hash) is the
least a durable copy costs; on a shared 2-core machine the CPU for reading, writing and
reading back each byte, not the fsync, is what keeps this copy above it.
Memory stays bounded whatever the chunk size: CARRY_BUFFER bytes in flight, and the verifier
maps at most HASH_WINDOW bytes of the copy at once.

What "verified against the source" means: the source's hash is taken from the bytes read from
it, the copy's from the copy as the library's filesystem returns it (its page cache, which the
fsync then writes to the disk), so a short or failed write, a torn resumed partial or a stale
writer is caught; a source written to during the copy is caught by its size and modification
time. A disk that later returns other bytes than it acknowledged is not: reading the copy back
from the platter would need its pages dropped and a second full read of the disk; a
checksumming filesystem (or a later re-hash against the recorded hash) covers that. The hash
recorded in the LibraryItem is the one both files share (`hash_algorithm` names it). The
LibraryItem row is written by the fenced commit of `ctx.with_attempt_token`, so a worker that
lost its lease cannot write it.

After a crash the next attempt is told (`info.resumed`) and reconciles: a file already renamed
into place is verified and kept; a partial copy is continued from its length (and verified as
a whole), any other leftover is removed. Several writers of one partial file write the same
bytes at the same offsets, and nobody truncates it (a bad copy is unlinked and started afresh),
so a stale writer cannot corrupt the copy.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import mmap
import os
import re
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import xxhash
from django.utils import timezone

from tasks_engine import LeaseLostError, NonRetryableError

from .conf import UmtSettings
from .models import AcquisitionPlan, LibraryItem
from .testpoints import stop_here

if TYPE_CHECKING:
    from tasks_engine import OpInfo, TaskContext

HASH_ALGORITHM = "xxh3_128"  # what LibraryItem.hash_algorithm records for a copy made here
HASH_WINDOW = 8 * 1024 * 1024  # the most of the copy the verifier maps at once
# The source's bytes on their way to the copy: small, so cache-hot, and each write small. The
# size of a write sets the size of the page-cache folios the kernel allocates for the copy
# (large folios on ext4): on a VM whose freed memory goes back to the host (virtio-balloon free
# page reporting), 1 MiB writes made the copy 2 to 4x slower than 64 KiB writes (bench/copy_speed.py
# --baseline: 1536 MiB in 2.97 s against 0.75 s for one file, 3.07 s against 0.93 s for a pack).
CARRY_BUFFER = 64 * 1024
PARTIAL_PREFIX = ".umt-"
PARTIAL_SUFFIX = ".part"


class LibraryConflict(NonRetryableError):
    """The library already holds a different file under the name this plan would use."""


class CopyVerificationError(Exception):
    """The copy's size or hash differs from the source (retried from scratch)."""


NAME_MAX = 255  # bytes of one file name component (ext4, xfs, btrfs, tmpfs)


def safe_name(text: str, limit: int = NAME_MAX) -> str:
    """`text` as one file name: unsafe characters replaced, cut to `limit` UTF-8 bytes on a
    character boundary (85 CJK characters are 255 bytes)."""
    name = re.sub(r"[^\w .()\[\]-]+", "_", text).strip(" .")
    return name.encode()[:limit].decode("utf-8", "ignore").rstrip(" .")


def library_path(plan: AcquisitionPlan, source: Path, s: UmtSettings, rel: str = "") -> Path:
    """`<library>/<title>/<title><suffix>` for a single file; for a file of a multi-file
    download, `<library>/<title>/<its path in the download>`."""
    folder = title_folder(plan, s)
    if rel:
        parts = [safe_name(p) or "_" for p in Path(rel).parts]
        return folder.joinpath(*parts)
    suffix = source.suffix if len(source.suffix.encode()) < 32 else ""
    return folder / f"{safe_name(folder.name, NAME_MAX - len(suffix.encode()))}{suffix}"


def title_folder(plan: AcquisitionPlan, s: UmtSettings) -> Path:
    return s.library_dir / (safe_name(plan.title) or f"plan-{plan.pk}")


def library_paths(
    plan: AcquisitionPlan, files: list[tuple[Path, str]], s: UmtSettings
) -> list[Path]:
    """Each file's `library_path`, made unique: files whose names clean up to the same name
    ("Tom & Jerry.mkv", "Tom + Jerry.mkv") keep it in the order of their paths in the download
    (the first keeps it, the next get " (2)", " (3)" before the suffix), so a retry or a
    resumed copy names them alike."""
    single = len(files) == 1
    wanted = {rel: library_path(plan, p, s, "" if single else rel) for p, rel in files}
    taken = set(wanted.values())  # a number never takes another file's own name
    given: dict[str, Path] = {}
    for rel in sorted(wanted):
        dest = wanted[rel]
        if dest in given.values():
            dest = _numbered(dest, taken)
            taken.add(dest)
        given[rel] = dest
    return [given[rel] for _p, rel in files]


def _numbered(dest: Path, taken: set[Path]) -> Path:
    n = 2
    while True:
        mark = f" ({n})"
        stem = dest.stem.encode()[: NAME_MAX - len(mark) - len(dest.suffix.encode())]
        name = stem.decode("utf-8", "ignore").rstrip(" .") + mark + dest.suffix
        if (candidate := dest.with_name(name)) not in taken:
            return candidate
        n += 1


def partial_path(plan: AcquisitionPlan, dest: Path, s: UmtSettings) -> Path:
    """A copy in progress: hidden, in the destination's real folder (the final rename stays on
    one filesystem whatever symlink leads there), a short name of its own whatever the
    destination's length; the same for every attempt, so the next one finds a leftover."""
    key = hashlib.sha256(str(dest).encode()).hexdigest()[:16]
    return dest.parent.resolve() / f"{PARTIAL_PREFIX}{plan.pk}-{key}{PARTIAL_SUFFIX}"


def discard_partials(plan: AcquisitionPlan, s: UmtSettings) -> None:
    """Remove the plan's copies in progress that a killed worker left in its title folder: the
    copy step failed before a copier could continue or remove them (the download vanished)."""
    folder = title_folder(plan, s)
    for leftover in folder.rglob(f"{PARTIAL_PREFIX}{plan.pk}-*{PARTIAL_SUFFIX}"):
        leftover.unlink(missing_ok=True)


def copy_into_library(
    ctx: TaskContext, plan: AcquisitionPlan, files: list[tuple[Path, str]], s: UmtSettings
) -> list[dict[str, Any]]:
    """Copy, verify, rename and commit one LibraryItem per file (each file its own fenced op,
    so a crash between two files redoes neither). Progress runs over the total."""
    grand = sum(p.stat().st_size for p, _ in files)
    single = len(files) == 1
    results, base = [], 0
    for (source, rel), dest in zip(files, library_paths(plan, files, s), strict=True):
        copier = Copier(ctx, source, dest, partial_path(plan, dest, s), s, base, grand)
        key = hashlib.sha256(rel.encode()).hexdigest()[:16]
        op = f"umt:copy:plan:{plan.pk}" if single else f"umt:copy:plan:{plan.pk}:{key}"
        results.append(ctx.with_attempt_token(op, copier.run_op, commit=_committer(plan)))
        base += source.stat().st_size
    AcquisitionPlan.objects.filter(pk=plan.pk).update(
        status=AcquisitionPlan.Status.COPIED, updated_at=timezone.now()
    )
    ctx.progress(grand, grand, f"copied and verified {len(files)} file(s)")
    return results


def recorded_hash(result: dict[str, Any]) -> tuple[str, str]:
    """(algorithm, hex digest) of a copy's result; a result stored before the algorithm was
    recorded holds a SHA-256."""
    if "content_hash" in result:
        return result["hash_algorithm"], result["content_hash"]
    return "sha256", result["sha256"]


def _committer(plan: AcquisitionPlan) -> Any:
    def commit(result: dict[str, Any]) -> None:
        held = LibraryItem.objects.filter(path=result["path"]).first()
        if held is not None and held.plan_id != plan.pk:
            raise LibraryConflict(f"{result['path']} is already plan #{held.plan_id}'s")
        if held is None:
            algorithm, digest = recorded_hash(result)
            LibraryItem.objects.create(
                plan=plan,
                title=plan.title,
                path=result["path"],
                size=result["size"],
                hash_algorithm=algorithm,
                content_hash=digest,
            )

    return commit


@dataclass
class Copier:
    ctx: TaskContext
    source: Path
    dest: Path
    partial: Path
    settings: UmtSettings
    base: int = 0  # bytes of the plan's earlier files (progress runs over the total)
    grand: int = 0
    made_dirs: list[Path] = field(default_factory=list)  # created by this attempt

    def run_op(self, info: OpInfo) -> dict[str, Any]:
        return self.run(resumed=info.resumed)

    def run(self, *, resumed: bool) -> dict[str, Any]:
        total = self.source.stat().st_size
        self._drop_legacy_partial()
        if self.dest.exists():
            return self._adopt(total)
        try:
            offset = self._reconcile_partial(total, resumed=resumed)
            digest = self._copy(offset, total)
            os.replace(self.partial, self.partial.parent / self.dest.name)
        except LeaseLostError:
            raise  # a newer attempt owns the partial file and may be writing it
        except BaseException:
            # Whatever failed (a full disk, no permission, a cancel, a bad copy): the retry
            # copies afresh, and the library keeps nothing of this attempt.
            self.partial.unlink(missing_ok=True)
            self._remove_made_dirs()
            raise
        _fsync_dir(self.partial.parent)
        stop_here("copy-renamed")  # renamed, not committed: the fault tests kill a worker here
        return {
            "path": str(self.dest),
            "size": total,
            "hash_algorithm": HASH_ALGORITHM,
            "content_hash": digest,
            "resumed_from": offset,
        }

    def _reconcile_partial(self, total: int, *, resumed: bool) -> int:
        """The offset to copy from: a resumed attempt continues its predecessor's partial file;
        any other leftover is not ours to continue."""
        self._make_dirs(self.partial.parent)
        if not self.partial.exists():
            return 0
        if resumed and self.partial.stat().st_size <= total:
            return self.partial.stat().st_size
        self.partial.unlink()
        return 0

    def _copy(self, offset: int, total: int) -> str:
        """Copy source[offset:] onto the partial file, hashing the source from the buffer that
        carries it, while the helper thread hashes the copy one chunk behind (read back from
        the library's filesystem) and another starts each written chunk's writeback; fsync,
        compare the two hashes; return the shared hex digest."""
        chunk = max(self.settings.copy_chunk_bytes, 1)
        with (
            self.source.open("rb", buffering=0) as src,
            open(self.partial, "r+b", buffering=0, opener=_create_or_open) as out,
            ThreadPoolExecutor(1, thread_name_prefix="umt-verify") as verifier,
            ThreadPoolExecutor(1, thread_name_prefix="umt-writeback") as writeback,
        ):
            before = _identity(src.fileno())
            check = _PairHash(src.fileno(), out.fileno())
            check.source(0, offset)
            check.copy(0, offset)  # a continued partial file is verified as a whole
            done, started = offset, time.monotonic()
            behind: Future[None] = verifier.submit(_nothing)  # the copy's chunk being hashed
            while done < total:
                self.ctx.raise_if_canceled()
                n = min(chunk, total - done)
                check.carry(done, n)
                stop_here("copy-chunk-written")  # written, not yet verified: a test corrupts it
                behind.result()  # the copy's hash takes the chunks in order
                behind = verifier.submit(check.copy, done, n)
                # To the disk now, so the final fsync has little left (not awaited: the disk
                # may be slower than the copy, and blocks the thread that asks).
                writeback.submit(_start_writeback, out.fileno(), done, n)
                done += n
                at, of = self.base + done, max(self.grand, total, 1)
                self.ctx.progress(at, of, f"copying {at * 100 // of}%")
                self._throttle(done - offset, started)
            self.ctx.progress(self.base + total, max(self.grand, total), "verifying")
            syncing = writeback.submit(os.fsync, out.fileno())
            try:
                behind.result()
            finally:
                syncing.result()
            size = os.fstat(out.fileno()).st_size
            if _identity(src.fileno()) != before:
                raise CopyVerificationError(f"{self.source} changed while it was copied")
        if size != total:
            raise CopyVerificationError(f"the copy holds {size} bytes, the source {total}")
        if check.source_hash.digest() != check.copy_hash.digest():
            raise CopyVerificationError(f"the copy differs from {self.source} ({HASH_ALGORITHM})")
        return check.source_hash.hexdigest()

    def _adopt(self, total: int) -> dict[str, Any]:
        """The destination exists: an earlier attempt renamed it there, or it is not ours."""
        self.partial.unlink(missing_ok=True)  # nothing left to continue
        digest = _hash_file(self.dest, self.ctx)
        if self.dest.stat().st_size != total or digest != _hash_file(self.source, self.ctx):
            raise LibraryConflict(f"the library already holds a different {self.dest}")
        return {
            "path": str(self.dest),
            "size": total,
            "hash_algorithm": HASH_ALGORITHM,
            "content_hash": digest,
            "resumed_from": total,
        }

    def _make_dirs(self, folder: Path) -> None:
        missing = []
        while not folder.exists() and folder != folder.parent:
            missing.append(folder)
            folder = folder.parent
        for d in reversed(missing):
            try:
                d.mkdir()
            except FileExistsError:
                continue  # another plan's copy made it just now: not ours to remove
            self.made_dirs.append(d)

    def _remove_made_dirs(self) -> None:
        for d in reversed(self.made_dirs):
            try:
                d.rmdir()
            except OSError:
                break  # no longer empty: another plan's file arrived meanwhile
        self.made_dirs.clear()

    def _drop_legacy_partial(self) -> None:
        """A copy in progress when UMT kept them in `<library>/.partial/` is started afresh."""
        legacy = self.settings.library_dir / ".partial"
        old = legacy / f"{self.partial.stem.removeprefix(PARTIAL_PREFIX)}.part"
        if old.exists():
            old.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                legacy.rmdir()  # the last one: the folder goes too

    def _throttle(self, copied: int, started: float) -> None:
        rate = self.settings.copy_rate_limit
        if rate > 0:
            ahead = copied / rate - (time.monotonic() - started)
            if ahead > 0:
                self.ctx.abort_signal.wait(ahead)  # a cancel cuts the pause short


class _PairHash:
    """The source's and the copy's running XXH3-128, each fed its file's bytes in order. The
    source is hashed from the small buffer that carries it to the copy (read once, hashed while
    the buffer is in the CPU's cache); the copy, UMT's own hidden file, is read back from its
    filesystem, mapped window by window (no memory copy). The source is never mapped: a mapping
    of a file someone else may truncate would kill the worker with SIGBUS."""

    def __init__(self, source_fd: int, copy_fd: int) -> None:
        self.source_fd, self.copy_fd = source_fd, copy_fd
        self.source_hash, self.copy_hash = xxhash.xxh3_128(), xxhash.xxh3_128()
        self.buffer = bytearray(CARRY_BUFFER)

    def source(self, start: int, length: int) -> None:
        """Hash source[start:start+length] without copying it (a continued partial file)."""
        view, end = memoryview(self.buffer), start + length
        while start < end:
            got = _read(self.source_fd, view[: min(len(view), end - start)], start, end)
            self.source_hash.update(view[:got])
            start += got

    def carry(self, start: int, length: int) -> None:
        """source[start:start+length] onto the copy at the same offset, hashed on the way."""
        view, end = memoryview(self.buffer), start + length
        while start < end:
            got = _read(self.source_fd, view[: min(len(view), end - start)], start, end)
            self.source_hash.update(view[:got])
            written = 0
            while written < got:
                written += os.pwrite(self.copy_fd, view[written:got], start + written)
            start += got

    def copy(self, start: int, length: int) -> None:
        _hash_mapped(self.copy_fd, self.copy_hash, start, length)


def _nothing() -> None:
    pass


def _create_or_open(path: str, _flags: int) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # never O_TRUNC


def _read(fd: int, view: memoryview, start: int, end: int) -> int:
    got = os.preadv(fd, [view], start)
    if got == 0:
        raise CopyVerificationError(f"the source shrank to {start} of {end} bytes while copied")
    return got


def _identity(fd: int) -> tuple[int, int]:
    """What a write to the file or a truncation changes (a rename or a new link does not)."""
    st = os.fstat(fd)
    return st.st_size, st.st_mtime_ns


def _hash_mapped(fd: int, h: Any, start: int, length: int) -> None:
    end = start + length
    while start < end:
        aligned = start - start % mmap.ALLOCATIONGRANULARITY
        size = min(HASH_WINDOW, end - aligned)
        with (
            mmap.mmap(fd, size, prot=mmap.PROT_READ, offset=aligned) as window,
            memoryview(window) as view,
        ):
            h.update(view[start - aligned :])
        start = aligned + size


def _load_sync_file_range() -> Any:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.sync_file_range
    except (OSError, AttributeError):
        return None  # not Linux: the final fsync writes everything
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return call


_SYNC_FILE_RANGE = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2  # start writing the dirty pages out, do not wait


def _start_writeback(fd: int, start: int, length: int) -> None:
    if _SYNC_FILE_RANGE is not None and length > 0:
        _SYNC_FILE_RANGE(fd, start, length, _SYNC_FILE_RANGE_WRITE)  # a hint: errors ignored


def _hash_file(path: Path, ctx: TaskContext) -> str:
    h, buffer = xxhash.xxh3_128(), bytearray(HASH_WINDOW)
    with path.open("rb", buffering=0) as f:
        while got := f.readinto(buffer):
            ctx.raise_if_canceled()
            h.update(memoryview(buffer)[:got])
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
