"""The acquire workflow with real worker and relay processes (folder client): the happy path,
a cancel in the middle of the copy (on PostgreSQL and SQLite), and a worker SIGKILLed mid-copy."""

from __future__ import annotations

import hashlib
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import xxhash

import tasks_engine
from outbox.relay import relay_once
from tasks_engine.models import StepAttempt, WorkflowRun
from tests.helpers import WorkerProcess, wait_for
from umt.acquisition import plan_acquisition, report_download_done
from umt.models import AcquisitionPlan, LibraryItem

pytestmark = [
    pytest.mark.process,
    pytest.mark.django_db(transaction=True),
    pytest.mark.one_db("the workflow's path through the processes, not the database's"),
]

SIZE = 4 * 1024 * 1024
SLOW_COPY = {"UMT_COPY_CHUNK_BYTES": str(128 * 1024), "UMT_COPY_RATE_LIMIT": str(1024 * 1024)}


@pytest.fixture
def media(tmp_path: Path) -> dict[str, str]:
    return {
        "UMT_LIBRARY_DIR": str(tmp_path / "library"),
        "UMT_DOWNLOADS_DIR": str(tmp_path / "downloads"),
    }


@pytest.fixture
def relay(tmp_path: Path, transactional_db: None) -> Iterator[Any]:
    procs: list[WorkerProcess] = []

    def start() -> WorkerProcess:
        p = WorkerProcess(["runrelay", "--poll-interval", "0.2"], tmp_path, "relay", {})
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.stop()


def download(media: dict[str, str], name: str, size: int = SIZE) -> tuple[Path, str]:
    path = Path(media["UMT_DOWNLOADS_DIR"]) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    data = hashlib.sha256(name.encode()).digest() * (size // 32)
    path.write_bytes(data)
    return path, xxhash.xxh3_128_hexdigest(data)


def rid(plan: AcquisitionPlan) -> uuid.UUID:
    assert plan.run_id is not None, f"plan #{plan.pk} has no run"
    return plan.run_id


def library_files(media: dict[str, str]) -> list[Path]:
    return sorted(p for p in Path(media["UMT_LIBRARY_DIR"]).rglob("*") if p.is_file())


def status(plan: AcquisitionPlan) -> str:
    return WorkflowRun.objects.get(pk=rid(plan)).status


def copying(plan: AcquisitionPlan, media: dict[str, str]) -> bool:
    return any(p.stat().st_size > 0 for p in partials(media))


def partials(media: dict[str, str]) -> list[Path]:
    """Copies in progress: hidden files next to their destination."""
    return list(Path(media["UMT_LIBRARY_DIR"]).rglob(".umt-*.part"))


def progress(plan: AcquisitionPlan) -> str:
    value = WorkflowRun.objects.get(pk=rid(plan)).progress
    return str(value.get("message") or "") if value else ""


def started_plan(title: str, *, retention: float = 0.5) -> AcquisitionPlan:
    plan = plan_acquisition(title=title, source=f"{title}.mkv", retention_seconds=retention)
    relay_once()
    plan.refresh_from_db()
    return plan


def test_happy_path_through_relay_and_worker(workers, relay, media) -> None:
    relay()
    w = workers("--poll-interval", "0.2", env=media)
    plan = plan_acquisition(title="Big Buck Bunny", source="bbb.mkv", retention_seconds=0.5)
    wait_for(lambda: AcquisitionPlan.objects.get(pk=plan.pk).run_id, 15, "the relay")
    plan.refresh_from_db()
    wait_for(lambda: status(plan) == "waiting", 15, "the run to wait for the download")
    source, digest = download(media, "bbb.mkv", 1024 * 1024)
    assert report_download_done(f"plan:{plan.pk}", str(source))[0].signaled.delivered
    wait_for(lambda: status(plan) in {"completed", "failed"}, 30, "the run to finish")
    run = tasks_engine.get_run(rid(plan))
    assert run is not None and run.status == "completed", w.log()
    item = LibraryItem.objects.get(plan=plan)
    assert (item.size, item.content_hash) == (1024 * 1024, digest)
    assert item.registered_at is not None
    assert [p.name for p in library_files(media)] == ["Big Buck Bunny.mkv"]
    assert not source.exists()


@pytest.mark.both_dbs  # NOTIFY or the heartbeat
def test_cancel_during_the_copy_leaves_no_item_and_no_half_file(
    workers, media, is_postgres: bool
) -> None:
    plan = started_plan("Elephants Dream")
    # The cancel reaches the copy by NOTIFY on PostgreSQL, by the next heartbeat on SQLite: a
    # short lease there (a heartbeat every second), or the 4 s copy would finish first.
    lease = () if is_postgres else ("--lease-seconds", "3")
    w = workers("--poll-interval", "0.2", *lease, env={**media, **SLOW_COPY})
    wait_for(lambda: status(plan) == "waiting", 15, "the run to wait for the download")
    source, _ = download(media, "Elephants Dream.mkv")
    report_download_done(f"plan:{plan.pk}", str(source))
    wait_for(lambda: copying(plan, media), 15, "the copy to start")
    wait_for(lambda: progress(plan).startswith("copying"), 5, "the copy's progress")
    assert tasks_engine.cancel(rid(plan), "changed my mind") is True
    wait_for(lambda: status(plan) == "canceled", 10, "the run to end canceled")
    assert not LibraryItem.objects.exists(), w.log()
    assert library_files(media) == []
    copy = StepAttempt.objects.get(run_id=plan.run_id, name="copy-file")
    assert copy.status == "abandoned"
    assert source.exists()  # the download is left alone


def test_a_worker_killed_mid_copy_resumes_into_one_correct_file(workers, media) -> None:
    plan = started_plan("Cosmos Laundromat")
    env = {**media, **SLOW_COPY}
    doomed = workers("--lease-seconds", "2", "--poll-interval", "0.2", env=env, tag="doomed")
    wait_for(lambda: status(plan) == "waiting", 15, "the run to wait for the download")
    source, digest = download(media, "Cosmos Laundromat.mkv")
    report_download_done(f"plan:{plan.pk}", str(source))
    wait_for(
        lambda: copying(plan, media) and partials(media)[0].stat().st_size > SIZE // 4,
        15,
        "a quarter of the copy",
    )
    doomed.send(signal.SIGKILL)
    doomed.wait(10)
    rescuer = workers("--lease-seconds", "2", "--poll-interval", "0.2", env=env, tag="rescuer")
    wait_for(lambda: status(plan) in {"completed", "failed"}, 30, "the run to finish")
    run = tasks_engine.get_run(rid(plan))
    assert run is not None and run.status == "completed", rescuer.log()
    attempts = [(s.attempt, s.status) for s in run.steps if s.name == "copy-file"]
    assert attempts == [(1, "abandoned"), (2, "completed")]
    [copied] = [s for s in run.steps if s.name == "copy-file" and s.status == "completed"]
    resumed_from = copied.output[0]["resumed_from"]  # one entry per file
    assert SIZE // 4 <= resumed_from < SIZE
    [item] = LibraryItem.objects.all()
    [path] = library_files(media)
    assert (item.path, item.size, item.content_hash) == (str(path), SIZE, digest)
    assert xxhash.xxh3_128_hexdigest(path.read_bytes()) == digest
