"""UMT's logins at qBittorrent are rationed in the database (umt.downloads.logins): counted
before they are sent, backed off after each failure, stopped short of qBittorrent's ban, and
started afresh by new credentials. The real client's side: tests/qbittorrent/
test_cleanup_login_qbittorrent.py."""

from __future__ import annotations

import pytest
import qbittorrentapi
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from umt.downloads.logins import LoginRation, LoginRefused
from umt.models import ClientLogin
from umt.workflows import describe

pytestmark = pytest.mark.django_db

URL = "http://127.0.0.1:18080"


def ration(password: str = "wrong", *, backoff: float = 0.0) -> LoginRation:
    return LoginRation(URL, "admin", password, attempts=3, backoff_seconds=backoff)


def test_no_username_is_refused_without_a_login() -> None:
    with pytest.raises(LoginRefused, match="asks for a login and UMT has no username"):
        LoginRation(URL, "", "", attempts=3, backoff_seconds=0).reserve()
    assert not ClientLogin.objects.exists()


def test_logins_stop_after_the_limit_until_the_credentials_change() -> None:
    r = ration()
    for n in (1, 2, 3):
        r.reserve()
        message = r.failed("wrong username or password")
        assert f"failed login {n} of at most 3" in message
        assert "refused UMT's login as 'admin': wrong username or password" in message
    assert "UMT stops trying until its credentials change" in message
    with pytest.raises(LoginRefused, match="UMT stopped trying so that qBittorrent does not ban"):
        r.reserve()
    assert ClientLogin.objects.get().failures == 3
    ration("corrected").reserve()  # new credentials: a fresh count
    assert ClientLogin.objects.get().failures == 1
    assert "corrected" not in ClientLogin.objects.get().credentials  # a keyed hash only


def test_a_failed_login_backs_off_and_a_success_starts_afresh() -> None:
    r = ration(backoff=3600)
    r.reserve()
    r.failed("wrong username or password")
    with pytest.raises(LoginRefused, match=r"1 failed in a row\); the next attempt waits 3\d{3} s"):
        r.reserve()
    assert ClientLogin.objects.get().failures == 1  # a refused reservation counts nothing
    r.succeeded()
    row = ClientLogin.objects.get()
    assert (row.failures, row.next_attempt_at, row.last_error) == (0, None, "")
    r.reserve()


def test_a_client_error_without_a_message_is_still_described() -> None:
    assert describe(qbittorrentapi.LoginFailed()) not in ("LoginFailed: ", "LoginFailed:")
    assert describe(ValueError("bad")) == "ValueError: bad"
    assert describe(ValueError()).startswith("ValueError: ") and len(describe(ValueError())) > 12


def test_a_login_that_got_no_answer_is_not_counted() -> None:
    r = ration()
    r.reserve()
    r.not_answered()  # qBittorrent restarting: it counted nothing either
    assert ClientLogin.objects.get().failures == 0


def test_an_operator_deletes_the_count_on_the_admin_to_let_umt_log_in_again() -> None:
    r = ration()
    for _ in range(3):
        r.reserve()
        r.failed("wrong username or password")
    row = ClientLogin.objects.get()
    admin = User.objects.create_superuser("operator", password="pw")
    client = Client()
    client.force_login(admin)
    listed = client.get(reverse("admin:umt_clientlogin_changelist")).content.decode()
    assert URL in listed and "wrong username or password" in listed
    page = client.get(reverse("admin:umt_clientlogin_change", args=[row.pk])).content.decode()
    assert row.credentials not in page
    response = client.post(reverse("admin:umt_clientlogin_delete", args=[row.pk]), {"post": "yes"})
    assert response.status_code == 302 and not ClientLogin.objects.exists()
    r.reserve()  # tried again
