"""Copying a finished download into the library, the `copy-file` step's body.

The copy goes to `<library>/.partial/<plan>-<name>.part` in chunks (progress reported and cancel
checked between chunks), is read back and compared with the source's SHA-256, and is then
renamed into place: the library never holds a half file. The LibraryItem row is written by the
fenced commit of `ctx.with_attempt_token`, so a worker that lost its lease cannot write it.

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
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from django.utils import timezone

from tasks_engine import DeadlineExceededError, NonRetryableError, TaskCanceledError

from .conf import UmtSettings
from .models import AcquisitionPlan, LibraryItem

if TYPE_CHECKING:
    from tasks_engine import TaskContext

READ_BYTES = 1024 * 1024


class LibraryConflict(NonRetryableError):
    """The library already holds a different file under the name this plan would use."""


class CopyVerificationError(Exception):
    """The copy's size or hash differs from the source (retried from scratch)."""


def library_path(plan: AcquisitionPlan, source: Path, s: UmtSettings) -> Path:
    """`<library>/<title>/<title><source suffix>`."""
    title = re.sub(r"[^\w .()\[\]-]+", "_", plan.title).strip(" .") or f"plan-{plan.pk}"
    return s.library_dir / title / f"{title}{source.suffix}"


def copy_into_library(
    ctx: TaskContext, plan: AcquisitionPlan, source: Path, s: UmtSettings
) -> dict[str, Any]:
    """Copy, verify, rename, and commit the LibraryItem. Returns what the commit stored."""
    dest = library_path(plan, source, s)
    copier = Copier(ctx, source, dest, s.partial_dir / f"{plan.pk}-{dest.name}.part", s)

    def commit(result: dict[str, Any]) -> None:
        LibraryItem.objects.create(
            plan=plan,
            title=plan.title,
            path=result["path"],
            size=result["size"],
            sha256=result["sha256"],
        )
        AcquisitionPlan.objects.filter(pk=plan.pk).update(
            status=AcquisitionPlan.Status.COPIED, updated_at=timezone.now()
        )

    result: dict[str, Any] = ctx.with_attempt_token(
        f"umt:copy:plan:{plan.pk}", lambda info: copier.run(resumed=info.resumed), commit=commit
    )
    return result


@dataclass
class Copier:
    ctx: TaskContext
    source: Path
    dest: Path
    partial: Path
    settings: UmtSettings

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
            self._verify(total, digest)
        except (TaskCanceledError, DeadlineExceededError, CopyVerificationError):
            self.partial.unlink(missing_ok=True)  # the run ends (or starts over): drop the copy
            raise
        self.dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.partial, self.dest)  # atomic: same filesystem
        _fsync_dir(self.dest.parent)
        self.ctx.progress(total, total, "copied and verified")
        return {"path": str(self.dest), "size": total, "sha256": digest, "resumed_from": offset}

    def _copy(self, offset: int, total: int) -> str:
        """Copy source[offset:] onto the partial file; return the source's full SHA-256."""
        h = hashlib.sha256()
        chunk = max(self.settings.copy_chunk_bytes, 1)
        fd = os.open(self.partial, os.O_WRONLY | os.O_CREAT, 0o644)  # never O_TRUNC
        with self.source.open("rb") as src, os.fdopen(fd, "wb") as out:
            _hash_prefix(src, h, offset)
            out.seek(offset)
            done, started = offset, time.monotonic()
            while done < total:
                self.ctx.raise_if_canceled()
                data = src.read(min(chunk, total - done))
                if not data:
                    raise CopyVerificationError(f"{self.source} shrank to {done} bytes")
                out.write(data)
                h.update(data)
                done += len(data)
                self.ctx.progress(done, total, f"copying {done * 100 // max(total, 1)}%")
                self._throttle(done - offset, started)
            out.flush()
            os.fsync(out.fileno())
        return h.hexdigest()

    def _verify(self, total: int, source_digest: str) -> None:
        self.ctx.progress(total, total, "verifying")
        size = self.partial.stat().st_size
        if size != total:
            raise CopyVerificationError(f"copy holds {size} bytes, the source {total}")
        copied = _sha256(self.partial, self.ctx)
        if copied != source_digest:
            raise CopyVerificationError(f"copy hash {copied} != source hash {source_digest}")

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
