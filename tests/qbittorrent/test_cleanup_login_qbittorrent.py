"""Issue 40, item 4, against a real qbittorrent-nox: the user turns on a Web UI password after
the plan's file was registered. The plan is done (its file is in the library) whatever the
cleanup meets; the cleanup is taken over by a `release-download` run that tries again later;
UMT's failed logins stop short of qBittorrent's ban (5 by default), so the user's own login is
still accepted; and every stored reason says what happened."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import qbittorrentapi
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

import tasks_engine
from tasks_engine.models import WorkflowRun
from tests.helpers import wait_for
from umt.models import AcquisitionPlan, ClientLogin, LibraryItem

from .instance import Instance, Shared, make_torrent, needs_qbittorrent, seed
from .test_acquire_qbittorrent import SIZE, finish, start_plan, umt_worker

pytestmark = [needs_qbittorrent, pytest.mark.process, pytest.mark.django_db(transaction=True)]

PASSWORD = "users-own-pass-40"  # the password the user turns on in qBittorrent


def logged_in(leecher: Instance) -> qbittorrentapi.Client:
    """The user, logging in with the right password: refused once the address is banned."""
    api = qbittorrentapi.Client(
        host=leecher.url,
        username="admin",
        password=PASSWORD,
        REQUESTS_ARGS={"timeout": (2, 10)},
        DISABLE_LOGGING_DEBUG_OUTPUT=True,
    )
    api.auth_log_in()
    return api


@pytest.fixture
def password_off_again(leecher: Instance) -> Iterator[None]:
    yield
    api = leecher.api()
    if not api.is_logged_in:  # the test left the password on: the next test starts without it
        api = logged_in(leecher)
        api.app_set_preferences({"bypass_local_auth": True})
    leftovers = [t.hash for t in api.torrents_info()]  # ... and with an empty client
    if leftovers:
        api.torrents_delete(delete_files=True, torrent_hashes=leftovers)


def turn_on_the_password_once_registered(plan: AcquisitionPlan, leecher: Instance) -> None:
    def registered() -> bool:
        plan.refresh_from_db()
        return plan.status in (AcquisitionPlan.Status.REGISTERED, AcquisitionPlan.Status.DONE)

    wait_for(registered, 60, "the plan's file to be registered")
    assert plan.status == AcquisitionPlan.Status.REGISTERED  # still in its retention
    leecher.api().app_set_preferences({"bypass_local_auth": False, "web_ui_password": PASSWORD})
    assert not leecher.api().is_logged_in  # from now on qBittorrent asks for a login


def plan_page(plan: AcquisitionPlan) -> str:
    admin = User.objects.create_superuser("admin-40", password="pw")
    client = Client()
    client.force_login(admin)
    response = client.get(reverse("admin:umt_acquisitionplan_change", args=[plan.pk]))
    assert response.status_code == 200
    return response.content.decode()


def release_run(plan: AcquisitionPlan) -> WorkflowRun:
    return wait_for(
        lambda: WorkflowRun.objects.filter(task_name="release-download").first(),
        30,
        "the release run",
    )


def release_errors(run: WorkflowRun) -> list[str]:
    view = tasks_engine.get_run(run.pk)
    assert view is not None
    return [s.error["message"] for s in view.steps if s.error]


def assert_done_with_the_source_kept(
    plan: AcquisitionPlan, shared: Shared, leecher: Instance
) -> None:
    assert finish(plan) == "completed"
    assert (plan.status, plan.failure) == (AcquisitionPlan.Status.DONE, "")
    [item] = LibraryItem.objects.filter(plan=plan)
    assert item.registered_at is not None and item.content_hash == shared.content_hash
    assert [t.hash for t in logged_in(leecher).torrents_info()] == [shared.info_hash]
    assert plan.download_dir and Path(plan.download_dir).parent == leecher.downloads
    assert (Path(plan.download_dir) / shared.path.name).exists()  # not cleaned up yet
    assert plan.run_id is not None
    output = tasks_engine.get_run(plan.run_id).output  # type: ignore[union-attr]
    assert output["source_removed"] is False and output["release_run"]


def test_a_password_turned_on_after_registration_leaves_the_plan_done_and_cleanup_retried(
    workers, seeder: Instance, leecher: Instance, tmp_path: Path, password_off_again: None
) -> None:
    """UMT has no credentials: it does not even try to log in (each try would count towards
    the ban); once the user lets localhost in again, the release run removes the download."""
    shared = make_torrent(seeder.downloads / "nopass", "No.Password.mkv", SIZE)
    seed(seeder, shared)
    w = umt_worker(
        workers,
        seeder,
        leecher,
        tmp_path / "library",
        UMT_DOWNLOAD_CHECK_SECONDS="0.5",
        UMT_RETRY_MAX_SECONDS="0.5",
        UMT_CLEANUP_RETRY_SECONDS="1",
        UMT_CLEANUP_RETRY_MAX_SECONDS="1",
    )
    plan = start_plan("No Password", str(shared.torrent), retention_seconds=3)
    turn_on_the_password_once_registered(plan, leecher)
    assert_done_with_the_source_kept(plan, shared, leecher)
    run = release_run(plan)
    wait_for(lambda: len(release_errors(run)) >= 2, 30, "the release run to try again")
    for error in release_errors(run):
        assert "asks for a login and UMT has no username" in error, error
    assert not ClientLogin.objects.filter(failures__gt=0).exists()  # no login was tried
    shown = plan_page(plan)
    assert "Cleanup retried by" in shown and str(run.pk) in shown

    logged_in(leecher).app_set_preferences({"bypass_local_auth": True})  # the user's fix
    wait_for(
        lambda: tasks_engine.get_run(run.pk).status == "completed",  # type: ignore[union-attr]
        30,
        "the release run to complete",
    )
    assert tasks_engine.get_run(run.pk).output == {  # type: ignore[union-attr]
        "plan_id": plan.pk,
        "source_removed": True,
    }
    assert leecher.api().torrents_info() == []
    wait_for(lambda: not (Path(plan.download_dir) / shared.path.name).exists(), 10, "its files")
    plan.refresh_from_db()
    assert (plan.status, plan.failure) == (AcquisitionPlan.Status.DONE, ""), w.log()


def test_wrong_credentials_stop_short_of_the_ban_and_the_users_login_still_works(
    workers, seeder: Instance, leecher: Instance, tmp_path: Path, password_off_again: None
) -> None:
    """UMT's password is wrong: at most 3 failed logins (qBittorrent bans at 5), each failure
    stored with what happened, never an empty 'LoginFailed: '."""
    shared = make_torrent(seeder.downloads / "wrongpass", "Wrong.Password.mkv", SIZE)
    seed(seeder, shared)
    w = umt_worker(
        workers,
        seeder,
        leecher,
        tmp_path / "library",
        UMT_DOWNLOAD_CHECK_SECONDS="0.5",
        UMT_RETRY_MAX_SECONDS="0.5",
        UMT_CLEANUP_RETRY_SECONDS="0.5",
        UMT_CLEANUP_RETRY_MAX_SECONDS="0.5",
        UMT_QBITTORRENT_USERNAME="admin",
        UMT_QBITTORRENT_PASSWORD="not-the-users-password",
        UMT_QBITTORRENT_LOGIN_BACKOFF_SECONDS="0.2",
    )
    plan = start_plan("Wrong Password", str(shared.torrent), retention_seconds=3)
    turn_on_the_password_once_registered(plan, leecher)
    assert_done_with_the_source_kept(plan, shared, leecher)
    run = release_run(plan)
    wait_for(lambda: len(release_errors(run)) >= 6, 60, "the release run to try again")
    [login] = ClientLogin.objects.all()
    assert login.failures == 3  # and no more, however often the cleanup is tried
    errors = release_errors(run)
    assert "UMT stopped trying so that qBittorrent does not ban this address" in errors[-1]
    assert not any(e.strip().endswith(":") or "LoginFailed: " in e for e in errors), errors
    logged_in(leecher)  # the user's own login is accepted: the address is not banned
    assert [t.hash for t in logged_in(leecher).torrents_info()] == [shared.info_hash], w.log()
