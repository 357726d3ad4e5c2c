"""Entry points of an acquisition: plan one (row + outbox event, one transaction) and report a
finished download to its run (what the download client's completion hook calls)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from outbox import publish
from tasks_engine import Signaled, signal

from .models import AcquisitionPlan

PLANNED = "acquisition.planned"  # outbox event type; umt/outbox_routes.py starts `acquire`
DOWNLOAD_DONE = "download-done"  # the fact the workflow waits for
INFO_HASH = re.compile(r"^[0-9a-fA-F]{40}$")


class UnknownDownload(LookupError):
    """No plan matches the finished download (not one of UMT's, or not submitted yet)."""


def plan_acquisition(
    *,
    title: str,
    source: str,
    client: str = AcquisitionPlan.Client.FOLDER,
    retention_seconds: float | None = None,
) -> AcquisitionPlan:
    """Create a plan and publish `acquisition.planned`: both commit, or neither does."""
    with transaction.atomic():
        plan = AcquisitionPlan.objects.create(
            title=title, source=source, client=client, retention_seconds=retention_seconds
        )
        announce(plan)
    return plan


def announce(plan: AcquisitionPlan) -> None:
    """Publish the event that starts the plan's workflow (call inside the plan's transaction)."""
    publish(PLANNED, {"plan_id": plan.pk}, idempotency_key=f"plan:{plan.pk}")


@dataclass(frozen=True)
class Reported:
    plan: AcquisitionPlan
    signaled: Signaled


def find_plan(ref: str) -> AcquisitionPlan:
    """The plan a download reference names: `plan:<id>`, or a torrent's v1 info hash."""
    if ref.startswith("plan:"):
        plan = AcquisitionPlan.objects.filter(pk=int(ref.removeprefix("plan:"))).first()
    elif INFO_HASH.match(ref):
        plan = AcquisitionPlan.objects.filter(info_hash=ref.lower()).order_by("-pk").first()
    else:
        raise UnknownDownload(f"{ref!r} is neither plan:<id> nor a 40-hex-digit info hash")
    if plan is None:
        raise UnknownDownload(f"no acquisition plan for {ref}")
    if plan.run_id is None:
        raise UnknownDownload(f"plan #{plan.pk} has no workflow run yet")
    return plan


def report_download_done(ref: str, content_path: str, **extra: Any) -> Reported:
    """Signal `download-done` to the run of the plan that `ref` names."""
    plan = find_plan(ref)
    assert plan.run_id is not None  # find_plan refuses plans without a run
    payload = {"content_path": content_path, "ref": ref, **extra}
    return Reported(plan, signal(plan.run_id, DOWNLOAD_DONE, payload))
