"""The folder client: something else (a person, a script, the demo) writes the file into the
downloads folder and reports it with `manage.py umt_download_done plan:<id> <path>`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import BadSource, DownloadError

if TYPE_CHECKING:
    from ..models import AcquisitionPlan


class FolderClient:
    kind = "folder"

    def __init__(self, downloads_dir: Path) -> None:
        self.root = Path(downloads_dir)

    def identify(self, plan: AcquisitionPlan) -> str:
        name = Path(plan.source).name
        if not name or name in {".", ".."}:
            raise BadSource(f"plan #{plan.pk}: {plan.source!r} is not a file name")
        return str(self.root / name)

    def add(self, plan: AcquisitionPlan, ref: str) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def poll(self, ref: str) -> dict[str, Any] | None:
        return None  # a file that exists may still be being written: only its writer knows

    def remove(self, ref: str) -> bool:
        path = Path(ref)
        if path.resolve().parent != self.root.resolve():
            raise DownloadError(f"refusing to delete {ref!r}: not in {self.root}")
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True
