"""Outbox admin: a read-only event list, and `retry_selected` behind outbox.retry_outboxevent."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from outbox import publish
from outbox.models import OutboxEvent
from outbox.relay import relay_once
from tests.helpers import FakeClock
from tests.testapp.models import Marker

pytestmark = pytest.mark.django_db

LIST = "/admin/outbox/outboxevent/"


def dead_event(key: str = "d", max_attempts: int | None = 1) -> OutboxEvent:
    event = publish(
        "test.needs_marker", {"key": key}, idempotency_key=f"idem-{key}", max_attempts=max_attempts
    )
    relay_once(10)
    event.refresh_from_db()
    assert event.status == "dead"
    return event


def staff_client(*perms: str) -> Client:
    user = User.objects.create_user("staff", password="pw", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


def retry(client: Client, *events: OutboxEvent) -> int:
    """POST the retry action for `events`; return the status code."""
    response = client.post(
        LIST, {"action": "retry_selected", "index": 0, "_selected_action": [e.pk for e in events]}
    )
    return response.status_code


def test_changelist_filters_and_search(admin_client: Client) -> None:
    dead = dead_event("x")
    ok = publish("test.record", {"key": "fine"}, idempotency_key="idem-fine")
    relay_once(10)
    page = admin_client.get(LIST)
    assert page.status_code == 200
    text = page.content.decode()
    assert "test.needs_marker" in text and "test.record" in text
    assert "RouteBroken: marker" in text  # the error summary column
    assert "Retry selected dead events" in text
    by_status = admin_client.get(LIST, {"status__exact": "dead"})
    assert list(by_status.context["cl"].result_list) == [dead]
    by_type = admin_client.get(LIST, {"type": "test.record"})
    assert list(by_type.context["cl"].result_list) == [ok]
    by_key = admin_client.get(LIST, {"q": "idem-x"})
    assert list(by_key.context["cl"].result_list) == [dead]
    by_id = admin_client.get(LIST, {"q": str(ok.pk)})
    assert list(by_id.context["cl"].result_list) == [ok]
    assert admin_client.get(LIST, {"q": "not-an-id"}).status_code == 200


def test_event_page_shows_payload_and_last_error_read_only(admin_client: Client) -> None:
    event = dead_event("shown")
    url = f"{LIST}{event.pk}/change/"
    page = admin_client.get(url)
    assert page.status_code == 200
    text = page.content.decode()
    assert "&quot;key&quot;: &quot;shown&quot;" in text
    assert "RouteBroken: marker &#x27;shown&#x27; is missing" in text
    assert 'name="_save"' not in text
    assert admin_client.post(url, {"type": "changed"}).status_code == 403
    assert admin_client.get(f"{LIST}add/").status_code == 403
    assert admin_client.post(f"{LIST}{event.pk}/delete/").status_code == 403
    event.refresh_from_db()
    assert event.type == "test.needs_marker"


def test_event_page_masks_secrets_in_payload(admin_client: Client) -> None:
    """What operators see never shows a secret: the event's payload is masked on its page (the
    route still gets the real values)."""
    event = publish(
        "test.needs_marker",
        {"key": "s", "dsn": "postgres://app:hunter2@db/x", "api_key": "sk-live-123"},
    )
    page = admin_client.get(f"{LIST}{event.pk}/change/").content.decode()
    assert "hunter2" not in page and "sk-live-123" not in page
    assert "postgres://app:" in page  # the rest of the value is shown
    event.refresh_from_db()
    assert event.payload["api_key"] == "sk-live-123"


def test_superuser_retry_revives_a_dead_event(admin_client: Client, fake_clock: FakeClock) -> None:
    event = publish("test.needs_marker", {"key": "late"})
    for _ in range(10):  # MAX_ATTEMPTS
        relay_once(10)
        fake_clock.advance(600)
    event.refresh_from_db()
    assert (event.status, event.attempts) == ("dead", 10)
    assert "marker 'late' is missing" in event.last_error
    done = publish("test.record", {"key": "done"})
    relay_once(10)
    assert retry(admin_client, event, done) == 302
    done.refresh_from_db()
    assert (done.status, done.attempts) == ("dispatched", 1)  # only dead events are revived
    event.refresh_from_db()
    assert (event.status, event.attempts, event.next_attempt_at) == ("pending", 0, fake_clock.now())
    Marker.objects.create(key="late")
    relay_once(10)
    event.refresh_from_db()
    assert (event.status, event.attempts) == ("dispatched", 1)


def test_staff_without_the_permission_gets_403_and_nothing_changes() -> None:
    event = dead_event()
    client = staff_client("view_outboxevent")
    page = client.get(LIST)
    assert page.status_code == 200
    assert "Retry selected dead events" not in page.content.decode()
    assert retry(client, event) == 403
    event.refresh_from_db()
    assert (event.status, event.attempts) == ("dead", 1)


def test_staff_with_the_permission_can_retry() -> None:
    event = dead_event()
    client = staff_client("view_outboxevent", "retry_outboxevent")
    assert retry(client, event) == 302
    event.refresh_from_db()
    assert (event.status, event.attempts) == ("pending", 0)
