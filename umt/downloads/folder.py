"""The folder client: something else (a person, a script, the demo) writes the file into the
downloads folder and reports it with `manage.py umt_download_done plan:<id> <path>`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import BadSource, Download, DownloadError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..models import AcquisitionPlan


class FolderClient:
    kind = "folder"

    def __init__(self, downloads_dir: Path) -> None:
        self.root = Path(downloads_dir)

    def identify(self, plan: AcquisitionPlan) -> Download:
        name = Path(plan.source).name
        if not name or name in {".", ".."}:
            raise BadSource(f"plan #{plan.pk}: {plan.source!r} is not a file name")
        return Download(str(self.root / name), ())

    def own_folder(self, plan: AcquisitionPlan) -> str:
        return ""  # the file is written by something else, into the downloads folder

    def submit(self, plan: AcquisitionPlan, download: Download) -> bool:
        self.root.mkdir(parents=True, exist_ok=True)
        return True  # the downloads folder is UMT's own drop box

    def poll(self, plan_id: int, download: Download) -> dict[str, Any] | None:
        return None  # a file that exists may still be being written: only its writer knows

    def paused(self, plan_id: int, download: Download) -> bool:
        return False

    def remove(self, download: Download, owners: Mapping[int, str]) -> bool:
        path = Path(download.ref)
        if path.resolve().parent != self.root.resolve():
            raise DownloadError(f"refusing to delete {download.ref!r}: not in {self.root}")
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True
