"""Entry points of an acquisition: plan one (row + outbox event, one transaction) and report a
finished download to its run (what the download client's completion hook calls)."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from outbox import publish
from tasks_engine import Signaled, UnknownStepError, retry_run, signal

from .models import ACTIVE_STATUSES, MAX_RETENTION_SECONDS, AcquisitionPlan

PLANNED = "acquisition.planned"  # outbox event type; umt/outbox_routes.py starts `acquire`
DOWNLOAD_DONE = "download-done"  # the fact the workflow waits for
INFO_HASH = re.compile(r"^[0-9a-fA-F]{40}$")
V2_HASH = re.compile(r"^[0-9a-fA-F]{64}$")


class UnknownDownload(LookupError):
    """No plan matches the finished download (not one of UMT's, or not submitted yet)."""


def plan_acquisition(
    *,
    title: str,
    source: str,
    client: str = AcquisitionPlan.Client.FOLDER,
    retention_seconds: float | None = None,
    files: str = "",
) -> AcquisitionPlan:
    """Create a plan and publish `acquisition.planned`: both commit, or neither does.
    A retention that is negative, not finite or over MAX_RETENTION_SECONDS is refused."""
    if retention_seconds is not None and not (
        math.isfinite(retention_seconds) and 0 <= retention_seconds <= MAX_RETENTION_SECONDS
    ):
        raise ValueError(
            f"retention_seconds must be between 0 and {MAX_RETENTION_SECONDS}, "
            f"not {retention_seconds!r}"
        )
    with transaction.atomic():
        plan = AcquisitionPlan.objects.create(
            title=title,
            source=source,
            client=client,
            retention_seconds=retention_seconds,
            files=files,
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


def find_plans(ref: str) -> list[AcquisitionPlan]:
    """The plans a download reference names: `plan:<id>`, or a torrent's hash (qBittorrent's
    `%I` or `%K`: 40 hex digits; `%J`: the 64-digit v2 hash). Every unfinished plan of a torrent
    gets its completion: two plans of one torrent share its download."""
    ref = ref.strip()
    if ref.startswith("plan:"):
        number = ref.removeprefix("plan:")
        if not number.isdigit():
            raise UnknownDownload(f"{ref!r}: plan:<id> needs a number")
        plans = list(AcquisitionPlan.objects.filter(pk=int(number)))
    elif INFO_HASH.match(ref) or V2_HASH.match(ref):
        # The plan stores the torrent id (a hybrid's is its truncated v2 hash) and every form:
        # a hybrid's `%I` (its v1 hash) is one of the forms, not the id.
        h = ref.lower()
        plans = [
            p
            for p in AcquisitionPlan.objects.filter(
                Q(info_hash=h[:40]) | Q(download_hashes__contains=h), status__in=ACTIVE_STATUSES
            )
            .exclude(run_id=None)
            .order_by("pk")
            if p.info_hash == h[:40] or h in p.download_hashes.split(",")
        ]
    else:
        raise UnknownDownload(f"{ref!r} is neither plan:<id> nor a 40-hex-digit info hash")
    if not plans:
        raise UnknownDownload(f"no acquisition plan for {ref}")
    if plans[0].run_id is None:
        raise UnknownDownload(f"plan #{plans[0].pk} has no workflow run yet")
    return plans


def report_download_done(ref: str, content_path: str, **extra: Any) -> list[Reported]:
    """Signal `download-done` to the run of every plan that `ref` names. A content path that
    does not exist is refused (nothing is signaled): the run would only fail on it."""
    plans = find_plans(ref)
    if not os.path.exists(content_path):
        raise UnknownDownload(f"the content path {content_path!r} does not exist")
    payload = {"content_path": content_path, "ref": ref, **extra}
    out = []
    for plan in plans:
        assert plan.run_id is not None  # find_plans refuses plans without a run
        # Which pass of the plan this answers: a retried plan ignores what earlier ones got.
        fact = {**payload, "plan_retries": plan.retries}
        out.append(Reported(plan, signal(plan.run_id, DOWNLOAD_DONE, fact)))
    return out


class _NotRetried(Exception):
    pass


def retry_plan(plan_id: int, *, reason: str = "", by: str = "") -> bool:
    """Retry a failed plan: its run gets a fresh pass (`retry_run`) from `submit-download`,
    so the download is submitted again (the failed pass's compensation removed what UMT
    added), or found where a failure on the library side kept it; a copy that was verified
    and committed is not redone. False, and nothing changes,
    unless the plan is `failed` and its run can be retried."""
    try:
        with transaction.atomic():
            plan = AcquisitionPlan.objects.select_for_update().filter(pk=plan_id).first()
            if plan is None or plan.status != AcquisitionPlan.Status.FAILED or not plan.run_id:
                raise _NotRetried
            AcquisitionPlan.objects.filter(pk=plan_id).update(
                status=AcquisitionPlan.Status.PLANNED,
                failure="",
                retries=plan.retries + 1,
                updated_at=timezone.now(),
            )
            why = reason or f"plan #{plan_id} retried"
            try:
                retried = retry_run(plan.run_id, from_step="submit-download", reason=why, by=by)
            except UnknownStepError:  # the run failed before it submitted anything
                retried = retry_run(plan.run_id, reason=why, by=by)
            if not retried:
                raise _NotRetried
    except _NotRetried:
        return False
    return True
