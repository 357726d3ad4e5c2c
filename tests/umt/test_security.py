"""A self-hosted UMT that is safe to expose: no well-known secret key, a production profile that
`check --deploy` passes, admin logins throttled, operator actions in the admin log."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.admin.models import LogEntry
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.models import User
from django.core import signing
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test import Client, override_settings
from django.utils.crypto import salted_hmac

from tests.outbox.test_outbox_admin import dead_event, retry
from umt import secret_key

ROOT = Path(__file__).resolve().parents[2]
OLD_CONSTANT = "umt-dev-only-not-secret"
SIGNED_COOKIES = "django.contrib.sessions.backends.signed_cookies"


# -- the secret key ---------------------------------------------------------------------------


def test_the_running_key_is_no_published_constant() -> None:
    assert settings.SECRET_KEY not in secret_key.WELL_KNOWN
    assert len(settings.SECRET_KEY) >= secret_key.MIN_LENGTH


@pytest.mark.parametrize("value", [OLD_CONSTANT, "short-key"])
def test_a_published_or_short_key_in_the_environment_is_refused(value: str, tmp_path: Path) -> None:
    with pytest.raises(ImproperlyConfigured):
        secret_key.load(value, tmp_path / "key")
    assert not (tmp_path / "key").exists()


def test_manage_py_refuses_to_start_with_the_old_constant(tmp_path: Path) -> None:
    env = {**os.environ, "SECRET_KEY": OLD_CONSTANT, "DJANGO_SETTINGS_MODULE": "umt.settings"}
    proc = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert "published in UMT's repository" in proc.stderr


def test_a_generated_key_is_private_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "state" / ".umt_secret_key"
    first = secret_key.load("", path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert secret_key.load("", path) == first
    assert secret_key.load("", tmp_path / "other") != first


def test_processes_starting_together_agree_on_one_key(tmp_path: Path) -> None:
    path = tmp_path / ".umt_secret_key"
    code = (
        "from pathlib import Path; from umt import secret_key;"
        f" print(secret_key.load('', Path({str(path)!r})))"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        for _ in range(6)
    ]
    keys = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert len(keys) == 1 and keys == {path.read_text().strip()}
    assert [p.name for p in tmp_path.iterdir()] == [".umt_secret_key"]  # no temporary left


def test_a_key_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / ".umt_secret_key"
    secret_key.load("", path)
    path.chmod(0o644)
    with pytest.raises(ImproperlyConfigured, match="chmod 600"):
        secret_key.load("", path)


def _forged_session_cookie(user: User, key: str) -> str:
    """What an attacker who knows `key` makes: a signed-cookie session logging in as `user`."""
    auth_hash = salted_hmac(
        "django.contrib.auth.models.AbstractBaseUser.get_session_auth_hash",
        user.password,
        secret=key,
        algorithm="sha256",
    ).hexdigest()
    session = {
        SESSION_KEY: str(user.pk),
        BACKEND_SESSION_KEY: "django.contrib.auth.backends.ModelBackend",
        HASH_SESSION_KEY: auth_hash,
    }
    return signing.dumps(
        session,
        key=key,
        salt="django.contrib.sessions.backends.signed_cookies",
        serializer=signing.JSONSerializer,
        compress=True,
    )


@pytest.mark.django_db
@override_settings(SESSION_ENGINE=SIGNED_COOKIES)
def test_a_session_cookie_signed_with_the_old_constant_is_refused() -> None:
    admin = User.objects.create_superuser("admin", password="right-password")
    client = Client()
    client.cookies[settings.SESSION_COOKIE_NAME] = _forged_session_cookie(admin, OLD_CONSTANT)
    response = client.get("/admin/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    # The same forgery with the deployment's own key would get in: the refusal above is the key.
    client.cookies[settings.SESSION_COOKIE_NAME] = _forged_session_cookie(
        admin, settings.SECRET_KEY
    )
    assert client.get("/admin/").status_code == 200


# -- the production profile -------------------------------------------------------------------


def _profile() -> dict[str, str]:
    lines = (ROOT / "docs" / "production.env").read_text().splitlines()
    pairs = (line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def _deploy_check(extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "umt.settings", **extra}
    env.pop("SECRET_KEY", None)
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "DEBUG"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )


def test_check_deploy_reports_nothing_with_the_documented_production_profile() -> None:
    proc = _deploy_check(_profile())
    assert proc.returncode == 0, proc.stderr
    assert "no issues" in proc.stdout


def test_check_deploy_without_the_profile_says_what_is_missing() -> None:
    proc = _deploy_check({"DEBUG": "false"})
    assert proc.returncode != 0
    for check in ("W004", "W008", "W012", "W016"):
        assert f"security.{check}" in proc.stderr
    assert "security.W009" not in proc.stderr  # the generated key is a proper secret


# -- login throttling -------------------------------------------------------------------------


def _login(client: Client, password: str) -> int:
    response = client.post(
        "/admin/login/?next=/admin/", {"username": "admin", "password": password}
    )
    return response.status_code


@pytest.mark.django_db
def test_repeated_failed_logins_lock_the_user_out_of_that_address_until_unlocked() -> None:
    User.objects.create_superuser("admin", password="right-password")
    client = Client(REMOTE_ADDR="203.0.113.7")
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert _login(client, "guess") == 200  # the form again, with an error
    assert _login(client, "guess") == 429  # the limit: locked
    assert _login(client, "right-password") == 429  # locked even with the right password
    assert "_auth_user_id" not in client.session
    # The owner at another address is not locked out by a stranger's guesses.
    owner = Client(REMOTE_ADDR="198.51.100.2")
    assert _login(owner, "right-password") == 302
    call_command("axes_reset_username", "admin")
    assert _login(client, "right-password") == 302  # unlocked: logged in
    assert client.get("/admin/").status_code == 200


# -- operator actions in the admin log ---------------------------------------------------------


@pytest.mark.django_db
def test_an_outbox_retry_from_the_admin_is_in_the_events_history(admin_client: Client) -> None:
    event = dead_event("audited")
    assert retry(admin_client, event) == 302
    entry = LogEntry.objects.get(object_id=str(event.pk))
    assert entry.user.username == "admin"
    assert entry.get_change_message().startswith("Retried")
    history = admin_client.get(f"/admin/outbox/outboxevent/{event.pk}/history/")
    assert "Retried: dead event put back to pending" in history.content.decode()
