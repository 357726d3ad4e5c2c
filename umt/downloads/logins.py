"""UMT's logins at a download client, rationed across every worker (`ClientLogin` rows).

qBittorrent bans an address after a few failed logins in a row (5 by default, and only a
successful login or a restart forgets them), and a banned address includes the user's own
browser on the same host. So a login is tried only when the client asked for one (it answered
403), and a failed one is counted before it is sent: after the n-th failure in a row the next
attempt waits `login_backoff_seconds * 4**(n-1)`, and after `login_attempts` failures none is
tried until UMT's credentials change. A successful login starts the count afresh.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.utils import timezone
from django.utils.crypto import salted_hmac

from ..models import ClientLogin
from . import DownloadError


class LoginRefused(DownloadError):
    """UMT could not log in to the download client, or did not try (see the message)."""


@dataclass(frozen=True)
class LoginRation:
    client_url: str
    username: str
    password: str
    attempts: int  # failed logins in a row before UMT stops trying
    backoff_seconds: float

    @property
    def fingerprint(self) -> str:
        text = f"{self.client_url}\n{self.username}\n{self.password}"
        return salted_hmac("umt.downloads.logins", text, algorithm="sha256").hexdigest()

    def reserve(self) -> None:
        """Count the login about to be sent as failed (undone by `succeeded`), or raise
        LoginRefused when UMT must not try now."""
        if not self.username:
            raise LoginRefused(
                f"qBittorrent at {self.client_url} asks for a login and UMT has no username "
                "(set UMT_QBITTORRENT_USERNAME and UMT_QBITTORRENT_PASSWORD, or let qBittorrent "
                "bypass authentication for localhost)"
            )
        now = timezone.now()
        with transaction.atomic():
            row = self._row()
            if row.failures >= self.attempts:
                raise LoginRefused(
                    f"qBittorrent at {self.client_url} refused UMT's login as "
                    f"{self.username!r} {row.failures} times in a row; UMT stopped trying so "
                    "that qBittorrent does not ban this address: correct "
                    "UMT_QBITTORRENT_USERNAME/PASSWORD and restart the workers"
                )
            if row.next_attempt_at is not None and now < row.next_attempt_at:
                wait = (row.next_attempt_at - now).total_seconds()
                raise LoginRefused(
                    f"qBittorrent at {self.client_url} refused UMT's login as "
                    f"{self.username!r} ({row.failures} failed in a row); the next attempt "
                    f"waits {wait:.0f} s more"
                )
            row.failures += 1
            row.next_attempt_at = now + timedelta(
                seconds=self.backoff_seconds * 4 ** (row.failures - 1)
            )
            row.save()

    def failed(self, why: str) -> str:
        """Record why the reserved login failed; return the message to raise."""
        with transaction.atomic():
            row = self._row()
            left = max(self.attempts - row.failures, 0)
            row.last_error = why
            row.save()
        more = (
            f"UMT tries {left} more time(s), the next in {self._next_wait(row):.0f} s"
            if left
            else "UMT stops trying until its credentials change"
        )
        return (
            f"qBittorrent at {self.client_url} refused UMT's login as {self.username!r}: {why} "
            f"(failed login {row.failures} of at most {self.attempts}; {more})"
        )

    def not_answered(self) -> None:
        """The reserved login got no answer: qBittorrent counted nothing, nor does UMT."""
        with transaction.atomic():
            row = self._row()
            row.failures = max(row.failures - 1, 0)
            row.save()

    def succeeded(self) -> None:
        ClientLogin.objects.filter(client_url=self.client_url).update(
            credentials=self.fingerprint, failures=0, next_attempt_at=None, last_error=""
        )

    def _row(self) -> ClientLogin:
        row, _ = ClientLogin.objects.select_for_update().get_or_create(
            client_url=self.client_url, defaults={"credentials": self.fingerprint}
        )
        if row.credentials != self.fingerprint:  # new credentials: a fresh count
            row.credentials, row.failures, row.next_attempt_at = self.fingerprint, 0, None
            row.last_error = ""
        return row

    @staticmethod
    def _next_wait(row: ClientLogin) -> float:
        if row.next_attempt_at is None:
            return 0.0
        return max((row.next_attempt_at - timezone.now()).total_seconds(), 0.0)
