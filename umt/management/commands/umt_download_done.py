"""manage.py umt_download_done REF CONTENT_PATH: a download client's completion hook.

qBittorrent (Options > Downloads > "Run external program on torrent finished"):

    /srv/umt/.venv/bin/python /srv/umt/manage.py umt_download_done "%K" "%F" --name "%N"

(see docs/QBITTORRENT-HOOK.md for the environment it needs).

`%K` is qBittorrent's torrent id (a hybrid's is its truncated v2 hash), which the `acquire`
workflow stored on the plan, with every other hash form, before it added the torrent; `%I` (the
v1 hash) and `%J` (the v2 hash) find the plan too. The command finds the plan and signals
`download-done` to its run. Other
downloaders pass `plan:<id>` instead of an info hash.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from tasks_engine.management.cli import OneLineErrors
from umt.acquisition import UnknownDownload, report_download_done


class Command(OneLineErrors, BaseCommand):
    help = "Tell the acquire workflow that a download finished (the download client's hook)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "ref",
            help="the torrent's id or info hash (qBittorrent's %%K, %%I or %%J), or plan:<id>",
        )
        parser.add_argument("content_path", help="the finished content (qBittorrent's %%F)")
        parser.add_argument("--name", default="", help="the torrent's name (qBittorrent's %%N)")
        parser.add_argument("--json", action="store_true", help="print JSON")
        parser.add_argument(
            "--log",
            type=Path,
            default=None,
            help="also append the outcome to this file (qBittorrent discards the hook's output)",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        extra = {"name": opts["name"]} if opts["name"] else {}
        try:
            reported = report_download_done(opts["ref"], opts["content_path"], **extra)
        except UnknownDownload as exc:
            self._log(opts["log"], f"{opts['ref']}: refused: {exc}")
            raise CommandError(str(exc)) from exc
        lines, data = [], []
        for r in reported:
            what = "delivered" if r.signaled.delivered else "not delivered"
            lines.append(
                f"plan #{r.plan.pk}: download-done {what} "
                f"(run {r.plan.run_id} is {r.signaled.status})"
            )
            data.append(
                {
                    "plan_id": r.plan.pk,
                    "run_id": str(r.plan.run_id),
                    "delivered": r.signaled.delivered,
                    "status": r.signaled.status,
                }
            )
        for line in lines:
            self._log(opts["log"], f"{opts['ref']}: {line}")
        if opts["json"]:
            self.stdout.write(json.dumps(data[0] if len(data) == 1 else data))
        else:
            self.stdout.write("\n".join(lines))

    @staticmethod
    def _log(path: Path | None, line: str) -> None:
        if path is not None:
            with path.open("a") as f:
                f.write(f"{timezone.now().isoformat()} {line}\n")
