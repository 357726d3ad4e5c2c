"""Copying a finished download into the library, the `copy-file` step's body.

The copy goes to `<library>/.partial/<plan>-<name>.part` in chunks (progress reported and cancel
checked between chunks), is read back and compared with the source, and is then
renamed into place: the library never holds a half file. The source is hashed in a helper
thread while the chunk is written (hashlib releases the GIL), and the copy is verified by
comparing it byte for byte with the source (during its fsync), which is at least as strong as
hashing it again and costs a memcmp instead of a second SHA-256 pass (bench/copy_speed.py). The
LibraryItem row is written by the fenced commit of `ctx.with_attempt_token`, so a worker that
lost its lease cannot write it.

After a crash the next attempt is told (`info.resumed`) and reconciles: a file already renamed
into place is verified and kept; a partial copy is continued from its length. Several writers
of one partial file write the same bytes at the same offsets, and nobody truncates it (a bad
copy is unlinked and started afresh), so a stale writer cannot corrupt the copy.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from django.utils import timezone

from tasks_engine import DeadlineExceededError, NonRetryableError, TaskCanceledError

from .conf import UmtSettings
from .models import AcquisitionPlan, LibraryItem
from .testpoints import stop_here

if TYPE_CHECKING:
    from tasks_engine import TaskContext
    from tasks_engine.fencing import OpInfo

READ_BYTES = 1024 * 1024
VERIFY_BYTES = 8 * READ_BYTES


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
    title = safe_name(plan.title) or f"plan-{plan.pk}"
    if rel:
        parts = [safe_name(p) or "_" for p in Path(rel).parts]
        return s.library_dir.joinpath(title, *parts)
    suffix = source.suffix if len(source.suffix.encode()) < 32 else ""
    return s.library_dir / title / f"{safe_name(title, NAME_MAX - len(suffix.encode()))}{suffix}"


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
    """A copy in progress: a short name of its own, whatever the destination's length."""
    key = hashlib.sha256(str(dest).encode()).hexdigest()[:16]
    return s.partial_dir / f"{plan.pk}-{key}.part"


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


def _committer(plan: AcquisitionPlan) -> Any:
    def commit(result: dict[str, Any]) -> None:
        held = LibraryItem.objects.filter(path=result["path"]).first()
        if held is not None and held.plan_id != plan.pk:
            raise LibraryConflict(f"{result['path']} is already plan #{held.plan_id}'s")
        if held is None:
            LibraryItem.objects.create(
                plan=plan,
                title=plan.title,
                path=result["path"],
                size=result["size"],
                sha256=result["sha256"],
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

    def run_op(self, info: OpInfo) -> dict[str, Any]:
        return self.run(resumed=info.resumed)

    def run(self, *, resumed: bool) -> dict[str, Any]:
        total = self.source.stat().st_size
        if self.dest.exists():
            return self._adopt(total)
        offset = 0
        if self.partial.exists():
            if resumed and self.partial.stat().st_size <= total:
                offset = self.partial.stat().st_size  # continue an interrupted copy
            else:
                self.partial.unlink()  # not ours to continue: start afresh
        self.partial.parent.mkdir(parents=True, exist_ok=True)
        try:
            digest = self._copy(offset, total)
            self.dest.parent.mkdir(parents=True, exist_ok=True)
        except (TaskCanceledError, DeadlineExceededError, CopyVerificationError, OSError):
            # The run ends or starts over (a full disk: the retry copies afresh): drop the copy.
            self.partial.unlink(missing_ok=True)
            raise
        os.replace(self.partial, self.dest)  # atomic: same filesystem
        _fsync_dir(self.dest.parent)
        stop_here("copy-renamed")  # renamed, not committed: the fault tests kill a worker here
        return {"path": str(self.dest), "size": total, "sha256": digest, "resumed_from": offset}

    def _copy(self, offset: int, total: int) -> str:
        """Copy source[offset:] onto the partial file, verify it, fsync it; return the source's
        full SHA-256."""
        h = hashlib.sha256()
        chunk = max(self.settings.copy_chunk_bytes, 1)
        fd = os.open(self.partial, os.O_WRONLY | os.O_CREAT, 0o644)  # never O_TRUNC
        with (
            self.source.open("rb", buffering=0) as src,
            os.fdopen(fd, "wb", buffering=0) as out,
            ThreadPoolExecutor(1, thread_name_prefix="umt-hash") as hasher,
        ):
            _hash_prefix(src, h, offset)
            out.seek(offset)
            done, started = offset, time.monotonic()
            hashing: Future[None] | None = None
            while done < total:
                self.ctx.raise_if_canceled()
                data = src.read(min(chunk, total - done))
                if not data:
                    raise CopyVerificationError(f"{self.source} shrank to {done} bytes")
                if hashing is not None:
                    hashing.result()  # the hash takes the chunks in order
                hashing = hasher.submit(h.update, data)  # the bytes written are those hashed
                _write_all(out.fileno(), data)
                done += len(data)
                at, of = self.base + done, max(self.grand, total, 1)
                self.ctx.progress(at, of, f"copying {at * 100 // of}%")
                self._throttle(done - offset, started)
            if hashing is not None:
                hashing.result()
            syncing = hasher.submit(os.fsync, out.fileno())  # to disk while it is compared
            self._verify(total)
            syncing.result()
        return h.hexdigest()

    def _verify(self, total: int) -> None:
        """The copy, read back, equals the source byte for byte (what it reads is what the fsync
        running beside it writes to disk). As the source's hash was taken from the very bytes
        that were written, the copy's SHA-256 is the one recorded."""
        self.ctx.progress(self.base + total, max(self.grand, total), "verifying")
        size = self.partial.stat().st_size
        if size != total:
            raise CopyVerificationError(f"copy holds {size} bytes, the source {total}")
        at = 0
        with (
            self.partial.open("rb", buffering=0) as copy,
            self.source.open("rb", buffering=0) as src,
        ):
            while data := copy.read(VERIFY_BYTES):
                self.ctx.raise_if_canceled()
                if src.read(len(data)) != data:
                    raise CopyVerificationError(
                        f"the copy differs from {self.source} within bytes {at}-{at + len(data)}"
                    )
                at += len(data)

    def _adopt(self, total: int) -> dict[str, Any]:
        """The destination exists: an earlier attempt renamed it there, or it is not ours."""
        digest = _sha256(self.dest, self.ctx)
        if self.dest.stat().st_size != total or digest != _sha256(self.source, self.ctx):
            raise LibraryConflict(f"the library already holds a different {self.dest}")
        self.partial.unlink(missing_ok=True)
        return {"path": str(self.dest), "size": total, "sha256": digest, "resumed_from": total}

    def _throttle(self, copied: int, started: float) -> None:
        rate = self.settings.copy_rate_limit
        if rate > 0:
            ahead = copied / rate - (time.monotonic() - started)
            if ahead > 0:
                self.ctx.abort_signal.wait(ahead)  # a cancel cuts the pause short


def _hash_prefix(src: IO[bytes], h: Any, length: int) -> None:
    left = length
    while left > 0:
        data = src.read(min(READ_BYTES, left))
        if not data:
            break
        h.update(data)
        left -= len(data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _sha256(path: Path, ctx: TaskContext) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while data := f.read(READ_BYTES * 8):
            ctx.raise_if_canceled()
            h.update(data)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
