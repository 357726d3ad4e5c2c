"""UMT's acquisition workflow: submit a download, wait for it, copy it into the library,
register it, keep the source for the retention period, clean up.

    submit-download   the plan records the download's reference, then the client gets it
    download-done     a fact: the client's completion hook (`manage.py umt_download_done`)
                      signals it; the client is also asked every DOWNLOAD_CHECK_SECONDS
    copy-file         chunked, verified copy; the LibraryItem commits fenced (umt/library.py)
    register          atomic step: the item is registered with the step's checkpoint
    retention         durable sleep: no worker is held while the source is kept (seeding)
    cleanup           the client forgets the download and deletes the source
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from django.utils import timezone
from pydantic import BaseModel

from tasks_engine import RetryPolicy, TaskContext, workflow

from .acquisition import DOWNLOAD_DONE
from .conf import umt_settings
from .downloads import BadSource, DownloadError, client_for, main_file
from .library import copy_into_library
from .models import AcquisitionPlan, LibraryItem

Status = AcquisitionPlan.Status


class AcquireInput(BaseModel):
    plan_id: int


@workflow(
    name="acquire",
    version=1,
    input=AcquireInput,
    queue="io",
    step_retry=RetryPolicy(
        max_attempts=5, initial_interval=1.0, backoff_coefficient=2.0, max_interval=60.0
    ),
)
def acquire(ctx: TaskContext) -> dict[str, Any]:
    plan_id = ctx.input.plan_id
    sub = ctx.step.run("submit-download", lambda: submit_download(plan_id))
    done = ctx.step.wait_for_fact(
        DOWNLOAD_DONE,
        timeout=timedelta(seconds=sub["timeout_seconds"]),
        check=_poller(ctx, sub) if sub["check_seconds"] > 0 else None,
        check_interval=sub["check_seconds"] or 30,
    )
    item = ctx.step.run("copy-file", lambda: copy_file(ctx, plan_id, done))
    ctx.step.run("register", lambda: register(plan_id), atomic=True)
    ctx.step.sleep("retention", timedelta(seconds=sub["retention_seconds"]))
    cleaned = ctx.step.run("cleanup", lambda: cleanup(plan_id, sub["client"], sub["ref"]))
    return {"plan_id": plan_id, "path": item["path"], "sha256": item["sha256"], **cleaned}


def submit_download(plan_id: int) -> dict[str, Any]:
    """Record the reference first (the completion hook finds the plan by it), then hand over."""
    s = umt_settings()
    plan = AcquisitionPlan.objects.get(pk=plan_id)
    client = client_for(plan.client)
    ref = client.identify(plan)
    info_hash = ref if client.kind == "qbittorrent" else ""
    AcquisitionPlan.objects.filter(pk=plan_id).update(
        download_ref=ref, info_hash=info_hash, status=Status.DOWNLOADING, updated_at=timezone.now()
    )
    client.add(plan, ref)
    retention = plan.retention_seconds
    return {
        "client": client.kind,
        "ref": ref,
        "retention_seconds": s.retention_seconds if retention is None else retention,
        "timeout_seconds": s.download_timeout_seconds,
        "check_seconds": s.download_check_seconds if client.kind == "qbittorrent" else 0,
    }


def _poller(ctx: TaskContext, sub: dict[str, Any]) -> Any:
    """The wait's `check`: ask the client, in case its completion hook never ran."""

    def check() -> dict[str, Any] | None:
        try:
            return client_for(sub["client"]).poll(sub["ref"])
        except Exception as exc:  # noqa: BLE001 - an unreachable client must not fail the run
            ctx.logger.warning("download client check failed", error=str(exc))
            return None

    return check


def copy_file(ctx: TaskContext, plan_id: int, done: Any) -> dict[str, Any]:
    content_path = done.get("content_path") if isinstance(done, dict) else None
    if not content_path:
        raise BadSource(f"the download-done fact carries no content_path: {done!r}")
    plan = AcquisitionPlan.objects.get(pk=plan_id)
    source = main_file(content_path)
    if not source.is_file():
        raise DownloadError(f"{source} is not a file")
    AcquisitionPlan.objects.filter(pk=plan_id, status=Status.DOWNLOADING).update(
        status=Status.COPYING, updated_at=timezone.now()
    )
    return copy_into_library(ctx, plan, Path(source), umt_settings())


def register(plan_id: int) -> dict[str, Any]:
    """Runs in the step's transaction: the registration and the checkpoint commit together."""
    item = LibraryItem.objects.select_for_update().get(plan_id=plan_id)
    if item.registered_at is None:
        item.registered_at = timezone.now()
        item.save(update_fields=["registered_at"])
    AcquisitionPlan.objects.filter(pk=plan_id).update(
        status=Status.REGISTERED, updated_at=timezone.now()
    )
    return {"item_id": item.pk, "registered_at": item.registered_at.isoformat()}


def cleanup(plan_id: int, client: str, ref: str) -> dict[str, Any]:
    removed = client_for(client).remove(ref)
    AcquisitionPlan.objects.filter(pk=plan_id).update(status=Status.DONE, updated_at=timezone.now())
    return {"source_removed": removed}
