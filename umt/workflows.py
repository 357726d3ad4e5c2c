"""UMT's acquisition workflow: submit a download, wait for it, copy it into the library,
register it, keep the source for the retention period, clean up.

    submit-download   fenced op `submit:<plan>`: the plan records a folder of its own (one that
                      did not exist) and the download's hashes, then the client adds it into
                      that folder, or adopts it when it already has it; the ledger keeps which
                      (only what UMT added is ever removed). An adopted download that is
                      already complete ends the wait at once
    download-done     a fact: the client's completion hook (`manage.py umt_download_done`)
                      signals every plan waiting on the torrent; the client is also asked every
                      DOWNLOAD_CHECK_SECONDS. A download the client lost is submitted again;
                      one the user paused shows the plan `paused` until it is resumed
    copy-file         chunked, verified copy of each wanted file; one LibraryItem per file
    register          atomic step: the items are registered with the step's checkpoint
    retention         durable sleep: no worker is held while the source is kept (seeding)
    cleanup           the client forgets the download and deletes it, if UMT added it into a
                      plan's own folder and no other plan still needs it
    fail-plan,        when the run fails: the plan shows `failed` and why, and what UMT added
    compensate        is removed (no orphan in the client), unless it is worth keeping: a
                      complete download whose copy or registration failed (the library's
                      fault: a retry of the plan copies it) or a download the user paused
                      (the timeout fails the plan, the paused download stays)
    cleanup-later     a cleanup or compensation that cannot reach the client (an outage, a login
                      it refuses) never fails the plan: a `release-download` run of its own
                      tries again later, for days, waiting longer after each attempt
"""

from __future__ import annotations

from dataclasses import dataclass
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
    enqueue,
    workflow,
)
from tasks_engine.models import OpLedger
from tasks_engine.values.secrets import redact_text

from .acquisition import DOWNLOAD_DONE
from .conf import umt_settings
from .downloads import (
    BadSource,
    Download,
    DownloadClient,
    DownloadError,
    DownloadMissing,
    client_for,
    wanted_files,
)
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


@dataclass
class Stage:
    """Where the run is, for its compensation (set as the workflow replays, so always true)."""

    in_library: bool = False  # the download is complete; copying or registering it


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
    stage = Stage()
    try:
        return _acquire(ctx, plan_id, stage)
    except (LeaseLostError, TaskCanceledError, NonDeterminismError):
        raise
    except Exception as exc:
        reason = redact_text(describe(exc))
        # The download's own fault (no content, no wanted file) is not the library's.
        library_side = stage.in_library and not isinstance(exc, DownloadError)
        ctx.step.run("fail-plan", lambda: fail_plan(plan_id, reason), atomic=True)
        _release_or_later(ctx, "compensate", plan_id, failed=True, library_side=library_side)
        ctx.progress(0, None, f"failed: {reason}"[:300])
        raise


def _acquire(ctx: TaskContext, plan_id: int, stage: Stage) -> dict[str, Any]:
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
    stage.in_library = True
    items = ctx.step.run("copy-file", lambda: copy_files(ctx, plan_id, done), retry=file_retry())
    ctx.step.run("register", lambda: register(plan_id), atomic=True)
    stage.in_library = False
    ctx.step.sleep("retention", timedelta(seconds=sub["retention_seconds"]))
    cleaned = _release_or_later(ctx, "cleanup", plan_id, failed=False)
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


def describe(exc: BaseException) -> str:
    """`Type: message`, and never an empty message (some client errors carry none)."""
    said = str(exc).strip()
    if not said:
        doc = (type(exc).__doc__ or "").strip().splitlines()
        said = doc[0] if doc else "no details given"
    return f"{type(exc).__name__}: {said}"


def _release_or_later(
    ctx: TaskContext, step: str, plan_id: int, *, failed: bool, library_side: bool = False
) -> Any:
    """The cleanup (or compensation) step; when it cannot reach the client after its retries,
    a `release-download` run takes it over and this run goes on as if it had not failed."""
    try:
        if failed:
            return ctx.step.run(
                step,
                lambda: compensate(plan_id, library_side=library_side),
                retry=network_retry(),
            )
        return ctx.step.run(step, lambda: cleanup(plan_id), retry=network_retry())
    except (LeaseLostError, TaskCanceledError, NonDeterminismError):
        raise
    except Exception as exc:  # noqa: BLE001 - whatever stops it, the plan's outcome stands
        reason = redact_text(describe(exc))
        return ctx.step.run(
            f"{step}-later", lambda: release_later(plan_id, failed, reason), atomic=True
        )


def release_later(plan_id: int, failed: bool, reason: str) -> dict[str, Any]:
    """Runs in the step's transaction: the release run is started exactly once."""
    retries = AcquisitionPlan.objects.values_list("retries", flat=True).get(pk=plan_id)
    what = "compensate" if failed else "cleanup"
    run = enqueue(
        release_download,
        {"plan_id": plan_id, "failed": failed, "retries": retries},
        idempotency_key=f"release:{plan_id}:r{retries}:{what}",
    )
    return {"source_removed": False, "release_run": str(run.run_id), "release_error": reason}


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
    _record_own_folder(plan, client)

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


def _record_own_folder(plan: AcquisitionPlan, client: DownloadClient) -> None:
    """The plan's own download folder, chosen once (the first attempt that records it wins) and
    kept for every later submission and pass: cleanup deletes files only in it."""
    if plan.download_dir:
        return
    folder = client.own_folder(plan)
    if folder:
        AcquisitionPlan.objects.filter(pk=plan.pk, download_dir="").update(download_dir=folder)
        plan.refresh_from_db(fields=["download_dir"])


def submit_op(plan: AcquisitionPlan, n: int) -> str:
    """The fenced op of a plan's n-th submission: `submit:<plan>[:<n>]`, and for a retried
    plan `submit:<plan>:r<retries>[:<n>]`, a new op (the failed pass's compensation may have
    removed what the old one added, so the retry must submit again; a kept download is found,
    still tagged as the plan's own)."""
    op = f"submit:{plan.pk}" + (f":r{plan.retries}" if plan.retries else "")
    return op if n == 1 else f"{op}:{n}"


def _poller(ctx: TaskContext, plan_id: int, sub: dict[str, Any]) -> Any:
    """The wait's `check`: is the download complete (when polling is on), is it still there?"""

    def check() -> dict[str, Any] | None:
        plan = AcquisitionPlan.objects.get(pk=plan_id)
        client = client_for(sub["client"])
        try:
            done = client.poll(plan_id, _download(plan))
            if done is None:
                _show_paused(plan_id, client.paused(plan_id, _download(plan)))
        except DownloadMissing:
            return {"missing": True}
        except Exception as exc:  # noqa: BLE001 - an unreachable client must not fail the run
            ctx.logger.warning("download client check failed", error=redact_text(str(exc)))
            return None
        return done if sub["check_seconds"] > 0 else None

    return check


def _show_paused(plan_id: int, paused: bool) -> None:
    """The plan says `paused` while the client holds its unfinished download paused."""
    was, now = (
        (Status.DOWNLOADING, Status.PAUSED) if paused else (Status.PAUSED, Status.DOWNLOADING)
    )
    AcquisitionPlan.objects.filter(pk=plan_id, status=was).update(
        status=now, updated_at=timezone.now()
    )


def copy_files(ctx: TaskContext, plan_id: int, done: Any) -> list[dict[str, Any]]:
    content_path = done.get("content_path") if isinstance(done, dict) else None
    if not content_path:
        raise BadSource(f"the download-done fact carries no content_path: {done!r}")
    plan = AcquisitionPlan.objects.get(pk=plan_id)
    try:
        files = wanted_files(content_path, plan.files)
        AcquisitionPlan.objects.filter(
            pk=plan_id, status__in=(Status.DOWNLOADING, Status.PAUSED)
        ).update(status=Status.COPYING, updated_at=timezone.now())
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


def compensate(plan_id: int, *, library_side: bool) -> dict[str, Any]:
    """After a failure: remove what UMT added, unless the download is worth keeping (then the
    plan's failure says so and why)."""
    plan = AcquisitionPlan.objects.get(pk=plan_id)
    kept = _worth_keeping(plan, library_side)
    if not kept:
        return {"source_removed": release(plan_id, failed=True)}
    note = f"; the download is kept: {kept}"
    if note not in plan.failure:  # the step may run again
        AcquisitionPlan.objects.filter(pk=plan_id).update(
            failure=plan.failure + note, updated_at=timezone.now()
        )
    return {"source_removed": False, "kept": kept}


def _worth_keeping(plan: AcquisitionPlan, library_side: bool) -> str:
    """Why the failed plan's download stays ('' when it goes): complete, with the library at
    fault (read-only, full, no permission, a name taken), so a retry copies it without
    downloading it again; or paused by the user, who decides what becomes of it."""
    if not plan.download_ref:
        return ""
    if library_side:
        return "it is complete and the library side failed; retrying the plan copies it"
    if client_for(plan.client).paused(plan.pk, _download(plan)):
        return "it is paused in the download client; resume it, then retry the plan"
    return ""


def release(plan_id: int, *, failed: bool = False) -> bool:
    """Remove the plan's download from its client, if UMT added it into a plan's own folder and
    no other plan still needs it. The caller has already committed this plan's own end (done or
    failed), so of two plans releasing one download at the same time at least one sees the
    other finished."""
    plan = AcquisitionPlan.objects.get(pk=plan_id)
    if not plan.download_ref:
        return False  # never submitted
    if failed and plan.client == AcquisitionPlan.Client.FOLDER:
        return False  # the folder's file is the only copy something else wrote: keep it
    sharing = AcquisitionPlan.objects.filter(download_ref=plan.download_ref, client=plan.client)
    if sharing.exclude(pk=plan_id).filter(status__in=ACTIVE_STATUSES).exists():
        return False  # another plan still needs the files
    owners = {pk: folder for pk, folder in sharing.values_list("pk", "download_dir") if _added(pk)}
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


class ReleaseInput(BaseModel):
    plan_id: int
    failed: bool  # a failed plan's compensation (else a done plan's cleanup)
    retries: int  # the plan's pass it belongs to: a plan retried since keeps its download


@workflow(name="release-download", version=1, input=ReleaseInput, queue="io")
def release_download(ctx: TaskContext) -> dict[str, Any]:
    """A plan's cleanup (or compensation) that could not reach the client, tried again for
    days; the plan's own run has ended and the plan keeps its status whatever happens here."""
    inp = ctx.input
    s = umt_settings()
    retry = RetryPolicy(
        max_attempts=s.cleanup_attempts,
        initial_interval=s.cleanup_retry_seconds,
        backoff_coefficient=2.0,
        max_interval=s.cleanup_retry_max_seconds,
    )
    removed = ctx.step.run("release", lambda: _release_if_still_due(inp), retry=retry)
    return {"plan_id": inp.plan_id, **removed}


def _release_if_still_due(inp: ReleaseInput) -> dict[str, Any]:
    plan = AcquisitionPlan.objects.get(pk=inp.plan_id)
    due = Status.FAILED if inp.failed else Status.DONE
    if plan.status != due or plan.retries != inp.retries:
        return {"source_removed": False, "skipped": f"the plan is {plan.status} again"}
    if inp.failed:  # a download the user paused meanwhile is kept, as at the plan's end
        return compensate(inp.plan_id, library_side=False)
    return {"source_removed": release(inp.plan_id)}
