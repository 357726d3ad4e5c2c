"""A NUL character in a changelist's query string, on every list of the engine's, the outbox's
and UMT's admin: a filter parameter holding one is an invalid lookup, answered as Django's
admin answers any invalid lookup (a redirect to the bare list with ?e=1, and a message); the
search box keeps Django's own answer (the list, unfiltered, with "Null characters are not
allowed."). Before, a filter parameter with a NUL was a 500 on PostgreSQL, which refuses NUL
in text."""

from __future__ import annotations

import pytest
from django.test import Client

from outbox import publish
from tasks_engine.models import Fact
from tests.browser.rundata import add_step, make_run

pytestmark = pytest.mark.django_db

LISTS = {
    "tasks_engine/workflowrun": [
        "status__exact",
        "task",
        "version",
        "queue",
        "worker_id",
        "status__in",
        "idempotency_key",
    ],
    "tasks_engine/stepattempt": ["status__exact", "kind__exact", "name"],
    "tasks_engine/fact": ["name"],
    "tasks_engine/opledger": ["status__exact", "op_key"],
    "tasks_engine/worker": ["host"],
    "tasks_engine/schedule": ["name"],
    "outbox/outboxevent": ["status__exact", "type__exact", "type"],
    "umt/acquisitionplan": ["status__exact", "client__exact", "title"],
    "umt/libraryitem": ["title", "path"],
}
FILTERS = [(model, param) for model, params in LISTS.items() for param in params]


@pytest.fixture(autouse=True)
def rows() -> None:
    run = make_run("failed", worker_id="w1")
    add_step(run, "first", run.created_at, 1.0)
    Fact.objects.create(run=run, name="done", payload={}, created_at=run.created_at)
    publish("test.record", {"key": "k"})


@pytest.mark.parametrize(("model", "param"), FILTERS)
def test_a_nul_in_a_filter_parameter_is_an_invalid_lookup(
    admin_client: Client, model: str, param: str
) -> None:
    url = f"/admin/{model}/"
    response = admin_client.get(url, {param: "a\x00b"})
    assert (response.status_code, response["Location"]) == (302, f"{url}?e=1")
    page = admin_client.get(response["Location"])
    assert page.status_code == 200
    assert b"Null characters are not allowed" in page.content


@pytest.mark.parametrize("model", list(LISTS))
def test_a_nul_beside_a_valid_filter_is_refused_too(admin_client: Client, model: str) -> None:
    response = admin_client.get(f"/admin/{model}/", {"o": "1", LISTS[model][0]: "\x00"})
    assert response.status_code == 302 and response["Location"].endswith("?e=1")


@pytest.mark.parametrize("model", list(LISTS))
def test_a_nul_in_the_search_box_is_django_s_own_answer(admin_client: Client, model: str) -> None:
    page = admin_client.get(f"/admin/{model}/", {"q": "a\x00b"})
    assert page.status_code == 200
    assert b"Null characters are not allowed." in page.content
