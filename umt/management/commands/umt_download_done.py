"""manage.py umt_download_done REF CONTENT_PATH: a download client's completion hook.

qBittorrent (Options > Downloads > "Run external program on torrent finished"):

    /srv/umt/.venv/bin/python /srv/umt/manage.py umt_download_done "%I" "%F" --name "%N"

`%I` is the torrent's v1 info hash, which the `acquire` workflow stored on the plan before it
added the torrent; the command finds the plan and signals `download-done` to its run. Other
downloaders pass `plan:<id>` instead of an info hash.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tasks_engine.management.commands._args import OneLineErrors
from umt.acquisition import UnknownDownload, report_download_done


class Command(OneLineErrors, BaseCommand):
    help = "Tell the acquire workflow that a download finished (the download client's hook)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "ref", help="the torrent's v1 info hash (qBittorrent's %%I), or plan:<id>"
        )
        parser.add_argument("content_path", help="the finished content (qBittorrent's %%F)")
        parser.add_argument("--name", default="", help="the torrent's name (qBittorrent's %%N)")
        parser.add_argument("--json", action="store_true", help="print JSON")

    def handle(self, *args: Any, **opts: Any) -> None:
        extra = {"name": opts["name"]} if opts["name"] else {}
        try:
            reported = report_download_done(opts["ref"], opts["content_path"], **extra)
        except UnknownDownload as exc:
            raise CommandError(str(exc)) from exc
        plan, res = reported.plan, reported.signaled
        if opts["json"]:
            data = {
                "plan_id": plan.pk,
                "run_id": str(plan.run_id),
                "delivered": res.delivered,
                "status": res.status,
            }
            self.stdout.write(json.dumps(data))
        else:
            what = "delivered" if res.delivered else "not delivered"
            self.stdout.write(
                f"plan #{plan.pk}: download-done {what} (run {plan.run_id} is {res.status})"
            )
