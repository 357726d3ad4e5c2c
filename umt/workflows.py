"""UMT's acquisition workflow: submit a download, wait for it, copy it into the library,
register it, keep the source for the retention period, clean up.

    submit-download   fenced op `submit:<plan>`: the plan records the download's hashes, then
                      the client adds it, or adopts it when it already has it; the ledger keeps
                      which (only what UMT added is ever removed). An adopted download that is
                      already complete ends the wait at once
    download-done     a fact: the client's completion hook (`manage.py umt_download_done`)
                      signals every plan waiting on the torrent; the client is also asked every
                      DOWNLOAD_CHECK_SECONDS. A download the client lost is submitted again
    copy-file         chunked, verified copy of each wanted file; one LibraryItem per file
    register          atomic step: the items are registered with the step's checkpoint
    retention         durable sleep: no worker is held while the source is kept (seeding)
    cleanup           the client forgets the download and deletes it, if UMT added it and no
                      other plan still needs it
    fail-plan,        when the run fails: the plan shows `failed` and why, and what UMT added
    compensate        is removed (no orphan in the client)
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone
from pydantic import BaseModel

from tasks_engine import (
    LeaseLostError,
    NonDeterminismError,
    RetryPolicy,
    TaskCanceledError,
    TaskContext,
    workflow,
)
from tasks_engine.logs import redact_text
from tasks_engine.models import OpLedger

from .acquisition import DOWNLOAD_DONE
from .conf import umt_settings
from .downloads import BadSource, Download, DownloadError, DownloadMissing, client_for, wanted_files
from .library import copy_into_library, discard_partials, recorded_hash
from .models import ACTIVE_STATUSES, AcquisitionPlan, LibraryItem

Status = AcquisitionPlan.Status
MAX_SUBMITS = 10  # a download lost this many times fails the run


class AcquireInput(BaseModel):
    plan_id: int


def network_retry() -> RetryPolicy:
    """Steps that talk to the download client: 5 attempts, 1 s growing to 60 s (about 80 s)."""
    s = umt_settings()
    return RetryPolicy(
        max_attempts=5,
        initial_interval=s.retry_initial_seconds,
        backoff_coefficient=4.0,
        max_interval=s.retry_max_seconds,
    )


def file_retry() -> RetryPolicy:
    s = umt_settings()
    return RetryPolicy(
        max_attempts=3,
        initial_interval=s.retry_initial_seconds,
        backoff_coefficient=4.0,
        max_interval=s.retry_max_seconds,
    )


@workflow(
    name="acquire",
    version=1,
    input=AcquireInput,
    queue="io",
    step_retry=RetryPolicy(
        max_attempts=5, initial_interval=1.0, backoff_coefficient=4.0, max_interval=60.0
    ),
)
def acquire(ctx: TaskContext) -> dict[str, Any]:
    plan_id = ctx.input.plan_id
    try:
        return _acquire(ctx, plan_id)
    except (LeaseLostError, TaskCanceledError, NonDeterminismError):
        raise
    except Exception as exc:
        reason = redact_text(f"{type(exc).__name__}: {exc}")
        ctx.step.run("fail-plan", lambda: fail_plan(plan_id, reason), atomic=True)
        ctx.step.run("compensate", lambda: release(plan_id, failed=True), retry=network_retry())
        ctx.progress(0, None, f"failed: {reason}"[:300])
        raise


def _acquire(ctx: TaskContext, plan_id: int) -> dict[str, Any]:
    net = network_retry()
    sub = ctx.step.run("submit-download", lambda: submit_download(ctx, plan_id, 1), retry=net)
    deadline = datetime.fromisoformat(sub["deadline"])
    done = sub.get("done")
    retries = sub.get("retries", 0)
    submits = 1
    while done is None:
        left = max((deadline - timezone.now()).total_seconds(), 0.0)
        done = ctx.step.wait_for_fact(
            DOWNLOAD_DONE,
            timeout=timedelta(seconds=left),
            check=_poller(ctx, plan_id, sub) if sub["client"] == "qbittorrent" else None,
            check_interval=sub["check_seconds"] or sub["presence_seconds"],
        )
        if _stale(done, retries):
            done = None  # an earlier pass's report (a retried plan): its files are gone
        elif isinstance(done, dict) and done.get("missing"):
            submits += 1
            if submits > MAX_SUBMITS:
                raise DownloadError(f"the client lost the download {submits - 1} times")
            again = ctx.step.run(
                "submit-download",
                lambda n=submits: submit_download(ctx, plan_id, n),  # type: ignore[misc]
                retry=net,
            )
            done = again.get("done")
    items = ctx.step.run("copy-file", lambda: copy_files(ctx, plan_id, done), retry=file_retry())
    ctx.step.run("register", lambda: register(plan_id), atomic=True)
    ctx.step.sleep("retention", timedelta(seconds=sub["retention_seconds"]))
    cleaned = ctx.step.run("cleanup", lambda: cleanup(plan_id), retry=net)
    size = sum(i["size"] for i in items)
    ctx.progress(size, size, f"done: {len(items)} file(s) in the library")
    first = items[0]
    algorithm, digest = recorded_hash(first)  # a copy made before the upgrade: SHA-256
    return {
        "plan_id": plan_id,
        "path": first["path"],
        "hash_algorithm": algorithm,
        "content_hash": digest,
        **cleaned,
    }


def _stale(done: Any, retries: int) -> bool:
    """A completion reported to an earlier pass of a retried plan (retry_run hands a retried
    wait the facts of the pass it supersedes again): that pass's download was removed."""
    reported = done.get("plan_retries") if isinstance(done, dict) else None
    return isinstance(reported, int) and reported < retries


def _download(plan: AcquisitionPlan) -> Download:
    hashes = tuple(h for h in plan.download_hashes.split(",") if h)
    return Download(plan.download_ref, hashes)


def submit_download(ctx: TaskContext, plan_id: int, n: int) -> dict[str, Any]:
    """Fenced op `submit_op(plan, n)`: its ledger result says whether UMT added the download
    or adopted one the client already had."""
    s = umt_settings()
    plan = AcquisitionPlan.objects.get(pk=plan_id)
    client = client_for(plan.client)
    download = client.identify(plan)

    def hand_over(_info: Any) -> dict[str, Any]:
        # Recorded first: the completion hook finds the plan by its hash.
        AcquisitionPlan.objects.filter(pk=plan_id).update(
            download_ref=download.ref,
            info_hash=download.ref if client.kind == "qbittorrent" else "",
            download_hashes=",".join(download.hashes),
            status=Status.DOWNLOADING,
            updated_at=timezone.now(),
        )
        added = client.submit(plan, download)
        return {"added": added, "ref": download.ref}

    op = submit_op(plan, n)
    owned = ctx.with_attempt_token(op, hand_over)
    try:  # adopted and complete, or finished before this attempt: no completion will come
        done = client.poll(plan_id, download)
    except DownloadMissing:
        done = None  # just added: the wait's check finds it missing and submits again
    retention = plan.retention_seconds
    return {
        "client": client.kind,
        "ref": download.ref,
        "added": owned["added"],
        "done": done,
        "retries": plan.retries,
        "deadline": (timezone.now() + timedelta(seconds=s.download_timeout_seconds)).isoformat(),
        "retention_seconds": s.retention_seconds if retention is None else retention,
        "check_seconds": s.download_check_seconds if client.kind == "qbittorrent" else 0,
        "presence_seconds": s.presence_check_seconds,
    }


def submit_op(plan: AcquisitionPlan, n: int) -> str:
    """The fenced op of a plan's n-th submission: `submit:<plan>[:<n>]`, and for a retried
    plan `submit:<plan>:r<retries>[:<n>]`, a new op (the failed pass's compensation removed
    what the old one added, so the retry must submit again)."""
    op = f"submit:{plan.pk}" + (f":r{plan.retries}" if plan.retries else "")
    return op if n == 1 else f"{op}:{n}"


def _poller(ctx: TaskContext, plan_id: int, sub: dict[str, Any]) -> Any:
    """The wait's `check`: is the download complete (when polling is on), is it still there?"""

    def check() -> dict[str, Any] | None:
        plan = AcquisitionPlan.objects.get(pk=plan_id)
        try:
            done = client_for(sub["client"]).poll(plan_id, _download(plan))
        except DownloadMissing:
            return {"missing": True}
        except Exception as exc:  # noqa: BLE001 - an unreachable client must not fail the run
            ctx.logger.warning("download client check failed", error=redact_text(str(exc)))
            return None
        return done if sub["check_seconds"] > 0 else None

    return check


def copy_files(ctx: TaskContext, plan_id: int, done: Any) -> list[dict[str, Any]]:
    content_path = done.get("content_path") if isinstance(done, dict) else None
    if not content_path:
        raise BadSource(f"the download-done fact carries no content_path: {done!r}")
    plan = AcquisitionPlan.objects.get(pk=plan_id)
    try:
        files = wanted_files(content_path, plan.files)
        AcquisitionPlan.objects.filter(pk=plan_id, status=Status.DOWNLOADING).update(
            status=Status.COPYING, updated_at=timezone.now()
        )
        return copy_into_library(ctx, plan, files, umt_settings())
    except LeaseLostError:
        raise  # a newer attempt may be continuing a partial copy
    except Exception:
        discard_partials(plan, umt_settings())  # the library keeps nothing of a failed copy
        raise


def register(plan_id: int) -> dict[str, Any]:
    """Runs in the step's transaction: the registration and the checkpoint commit together."""
    now = timezone.now()
    items = list(LibraryItem.objects.select_for_update().filter(plan_id=plan_id).order_by("pk"))
    LibraryItem.objects.filter(plan_id=plan_id, registered_at__isnull=True).update(
        registered_at=now
    )
    AcquisitionPlan.objects.filter(pk=plan_id).update(status=Status.REGISTERED, updated_at=now)
    return {"item_ids": [i.pk for i in items]}


def cleanup(plan_id: int) -> dict[str, Any]:
    AcquisitionPlan.objects.filter(pk=plan_id).update(status=Status.DONE, updated_at=timezone.now())
    return {"source_removed": release(plan_id)}


def fail_plan(plan_id: int, reason: str) -> dict[str, Any]:
    AcquisitionPlan.objects.filter(pk=plan_id).update(
        status=Status.FAILED, failure=reason, updated_at=timezone.now()
    )
    return {"failure": reason}


def release(plan_id: int, *, failed: bool = False) -> bool:
    """Remove the plan's download from its client, if UMT added it and no other plan still
    needs it. The caller has already committed this plan's own end (done or failed), so of two
    plans releasing one download at the same time at least one sees the other finished."""
    plan = AcquisitionPlan.objects.get(pk=plan_id)
    if not plan.download_ref:
        return False  # never submitted
    if failed and plan.client == AcquisitionPlan.Client.FOLDER:
        return False  # the folder's file is the only copy something else wrote: keep it
    sharing = AcquisitionPlan.objects.filter(download_ref=plan.download_ref, client=plan.client)
    if sharing.exclude(pk=plan_id).filter(status__in=ACTIVE_STATUSES).exists():
        return False  # another plan still needs the files
    owners = [pk for pk in sharing.values_list("pk", flat=True) if _added(pk)]
    if not owners:
        return False  # adopted: the user's own download stays
    return client_for(plan.client).remove(_download(plan), owners)


def _added(plan_id: int) -> bool:
    """Whether the op ledger says this plan's submit (or a resubmission) added the download."""
    entries = OpLedger.objects.filter(
        Q(op_key=f"submit:{plan_id}") | Q(op_key__startswith=f"submit:{plan_id}:"),
        status=OpLedger.Status.DONE,
    )
    return any(isinstance(e.result, dict) and e.result.get("added") for e in entries)
