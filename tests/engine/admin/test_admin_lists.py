"""The runs list and the run page: what they show, and that their query count does not grow
with the number of runs, steps, facts or ledger entries."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import tasks_engine
from tasks_engine import clock
from tasks_engine.admin import paging as admin_paging
from tasks_engine.admin import stats as admin_stats
from tasks_engine.admin.paging import CappedPaginator, RunPaginator
from tasks_engine.db import partitions
from tasks_engine.models import Fact, OpLedger, WorkflowRun
from tests.browser.rundata import add_step, make_many, make_run, make_showcase

pytestmark = pytest.mark.django_db

LIST = reverse("admin:tasks_engine_workflowrun_changelist")


def run_url(run: WorkflowRun) -> str:
    return reverse("admin:tasks_engine_workflowrun_change", args=[run.pk])


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    cache.clear()


def count_queries(client: Client, path: str) -> tuple[int, bytes]:
    # Every request from cold caches (the throughput chart's, the period ranges'), so that two
    # counts compare what a page costs, not which cache expired between them.
    cache.clear()
    admin_paging._ranges.clear()
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(path)
    assert response.status_code == 200
    return len(ctx.captured_queries), response.content


def by_id() -> int:
    """1 on partitioned tables (TASKS_PARTITION), whose runs list is newest first by id and
    reads the DEFAULT partition apart (admin/paging.py); else 0."""
    return int(partitions.unit() is not None)


def shown_ids(content: bytes) -> list[str]:
    return re.findall(r'<span class="te-mono" title="([0-9a-f-]{36})">', content.decode())


# -- query counts -----------------------------------------------------------------------------


def test_list_query_count_does_not_grow_with_rows(admin_client: Client) -> None:
    make_many(20, steps_per_run=2)
    small, _ = count_queries(admin_client, LIST)
    make_many(400, steps_per_run=2)
    large, content = count_queries(admin_client, LIST)
    assert len(shown_ids(content)) == 50
    print(f"runs list: {small} queries with 20 runs, {large} with 420")
    # Partitioned, a full page also reads the DEFAULT partition's part (admin/paging.py): one
    # statement more, then no more however many runs.
    assert small <= large <= small + by_id()
    # session, user, count, page, status strip, throughput (+ savepoints); partitioned, the
    # period ranges from the catalog (cold here) and the page's DEFAULT partition part
    assert large <= 9 + 2 * by_id()


@pytest.mark.parametrize(
    "query", ["?status__exact=running", "?task=noop&queue=default", "?q=noop", "?p=3"]
)
def test_filtered_list_query_count_is_bounded(admin_client: Client, query: str) -> None:
    make_many(200)
    n, _ = count_queries(admin_client, LIST + query)
    print(f"runs list {query}: {n} queries")
    assert n <= 9 + 2 * by_id()


def test_run_page_query_count_does_not_grow_with_steps(admin_client: Client) -> None:
    small = make_run("running", progress={"done": 1, "total": 4})
    add_step(small, "a", small.created_at, 1.0)
    big = make_run("running", progress={"done": 1, "total": 4})
    for i in range(300):
        add_step(big, f"s{i}", big.created_at + timedelta(seconds=i), 0.5)
    for i in range(50):
        Fact.objects.create(run=big, name=f"f{i}", payload={"i": i}, created_at=big.created_at)
        OpLedger.objects.create(
            op_key=f"op{i}",
            run=big,
            attempt_token=uuid.uuid4(),
            status="done",
            created_at=big.created_at,
            updated_at=big.created_at,
        )
        make_run("completed", parent_run=big)
    n_small, _ = count_queries(admin_client, run_url(small))
    n_big, content = count_queries(admin_client, run_url(big))
    print(f"run page: {n_small} queries with 1 step, {n_big} with 300 steps/50 facts/ops/children")
    assert n_big == n_small <= 8
    assert content.count(b'class="te-step"') == 300


# -- the list ---------------------------------------------------------------------------------


def test_list_shows_badges_waits_and_the_status_strip(admin_client: Client) -> None:
    runs = make_showcase()
    content = admin_client.get(LIST).content.decode()
    assert 'class="te-badge te-running"' in content
    assert "fact:download-done" in content and "sleep:retention" in content
    assert "wakes in" in content
    strip = re.findall(r'data-status="(\w+)"[^>]*>\s*<span class="te-n">([^<]+)<', content)
    counts = dict(strip)
    assert counts["running"] == "1" and counts["waiting"] == "2" and counts["canceled"] == "1"
    assert 'aria-label="Runs by status"' in content  # the SVG charts
    assert 'aria-label="Finished runs per minute over the last hour"' in content
    assert content.count('class="te-fill-completed"') >= 2
    assert str(runs["acquire"].pk) in content


def test_filters(admin_client: Client) -> None:
    runs = make_showcase()

    def ids(query: str) -> set[str]:
        return set(shown_ids(admin_client.get(LIST + query).content))

    assert ids("?status__exact=waiting") == {str(runs["waiting"].pk), str(runs["sleeping"].pk)}
    assert str(runs["acquire"].pk) in ids("?task=acquire&queue=io")
    assert all(WorkflowRun.objects.get(pk=i).task_name == "noop" for i in ids("?task=noop"))
    assert ids("?version=2") == set()
    old = make_run("completed", created_at=clock.now() - timedelta(days=40))
    assert str(old.pk) in ids("")
    week_ago = (clock.now() - timedelta(days=7)).isoformat().replace("+", "%2B")
    assert str(old.pk) not in ids(f"?created_at__gte={week_ago}")


def test_registry_filters_list_registered_workflows(admin_client: Client) -> None:
    content = admin_client.get(LIST).content.decode()
    assert "?task=three_steps" in content and "?version=2" in content


def test_search_by_id_prefix_key_and_trace(admin_client: Client) -> None:
    runs = make_showcase()
    acquire = runs["acquire"]

    def ids(term: str) -> list[str]:
        return shown_ids(admin_client.get(LIST, {"q": term}).content)

    assert ids(str(acquire.pk)) == [str(acquire.pk)]
    assert str(acquire.pk) in ids(str(acquire.pk)[:8])  # its first characters: with its window's
    assert ids(str(acquire.pk)[-8:]) == [str(acquire.pk)]  # its last ones, as listed
    assert ids("plan:4711") == [str(acquire.pk)]
    assert ids(acquire.trace_id) == [str(acquire.pk)]
    assert ids("no-such-thing") == []


def shown_short_ids(content: bytes) -> dict[str, str]:
    """{full id: the characters the list shows of it}."""
    cells = re.findall(
        r'<span class="te-mono" title="([0-9a-f-]{36})">([^<]*)</span>', content.decode()
    )
    return dict(cells)


def test_typing_the_short_id_the_list_shows_finds_exactly_that_run(admin_client: Client) -> None:
    """Run ids are time-ordered (version 7): runs created together share their first digits,
    so the list shows each id's last 8, random, digits, and searching those finds that run
    alone. The first characters of an id still find it, with the runs of its time window."""
    runs = [make_run("completed") for _ in range(20)]
    by_start: dict[str, int] = {}
    for run in runs:
        by_start[str(run.pk)[:8]] = by_start.get(str(run.pk)[:8], 0) + 1
    assert max(by_start.values()) > 1  # created together: first 8 digits in common

    def ids(term: str) -> list[str]:
        return shown_ids(admin_client.get(LIST, {"q": term}).content)

    shown = shown_short_ids(admin_client.get(LIST).content)
    assert set(shown) == {str(run.pk) for run in runs}
    for full, short in shown.items():
        assert len(short) == 8 and full.endswith(short)
        assert ids(short) == [full]
        assert ids(short.upper()) == [full]
        assert full in ids(full[:8])
        assert ids(full[:-8]) == [full]  # a long prefix: one run
    page = admin_client.get(run_url(runs[0])).content.decode()
    assert str(runs[0].pk)[-8:] in page


def test_search_by_a_run_s_own_trace_id_finds_the_runs_that_joined_it(
    admin_client: Client,
) -> None:
    """A run enqueued with no span current has its own id as its trace id (nothing stored);
    its children store it: searching the run's id lists them all."""
    parent = make_run("waiting", trace_id="")
    child = make_run("running", trace_id=parent.pk.hex, parent_run=parent)
    other = make_run("running", trace_id="")
    found = set(shown_ids(admin_client.get(LIST, {"q": parent.pk.hex}).content))
    assert found == {str(parent.pk), str(child.pk)}
    assert shown_ids(admin_client.get(LIST, {"q": str(other.pk)}).content) == [str(other.pk)]
    page = admin_client.get(run_url(parent)).content.decode()
    assert f'<dd class="te-mono">{parent.pk.hex}</dd>' in page  # its trace id, shown


def test_stored_trace_ids_are_searched_on_their_partial_index() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the plan of PostgreSQL's search")
    from tasks_engine.admin.filters import search_runs

    make_run("completed", trace_id="deploy-42")
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")  # a tiny table: make the choice visible
    plan = search_runs(WorkflowRun.objects.all(), "deploy-42").explain()
    # partitioned (TASKS_PARTITION): each partition's own index of run_trace_id, named by it
    assert re.search(r"run_trace_id|workflowrun_\w+_trace_id_idx", plan), plan


def test_list_order_is_newest_first_on_every_page(admin_client: Client) -> None:
    make_many(130)
    newest = ("-id",) if by_id() else ("-created_at", "-id")
    expected = [
        str(pk) for pk in WorkflowRun.objects.order_by(*newest).values_list("pk", flat=True)
    ]
    by_created = [
        str(pk)
        for pk in WorkflowRun.objects.order_by("-created_at", "-id").values_list("pk", flat=True)
    ]
    seen = []
    for page in (1, 2, 3):
        seen += shown_ids(admin_client.get(LIST, {"p": page}).content)
    assert seen == expected
    oldest_first = shown_ids(admin_client.get(LIST, {"o": "8"}).content)  # created ascending
    assert oldest_first == list(reversed(by_created))[:50]


def test_newest_first_reads_through_the_status_index(
    admin_client: Client, is_postgres: bool
) -> None:
    """On PostgreSQL the page is a UNION ALL of per-status index scans (see admin_paging);
    a task filter keeps the plain query, which the (task_name, created_at) index serves."""
    if not is_postgres:
        pytest.skip("the merged page query needs PostgreSQL")
    if by_id():
        pytest.skip("partitioned: the default page reads by id (test_partition_admin.py)")
    make_many(120)

    def merged(query: str) -> bool:
        with CaptureQueriesContext(connection) as ctx:
            admin_client.get(LIST + query)
        return any("UNION ALL (SELECT" in q["sql"] for q in ctx.captured_queries)

    assert merged("") and merged("?p=2") and merged("?queue=default") and merged("?o=8")
    assert not merged("?task=noop")


def test_run_paginator_matches_the_plain_query() -> None:
    make_many(90)
    qs = WorkflowRun.objects.order_by("-created_at", "-pk")
    for statuses in (None, ["completed"], ["waiting", "running"]):
        base = qs if statuses is None else qs.filter(status__in=statuses)
        paginator = RunPaginator(base, 20, statuses=statuses)
        for number in range(1, paginator.num_pages + 1):
            got = [r.pk for r in paginator.page(number).object_list]
            assert got == list(base.values_list("pk", flat=True)[(number - 1) * 20 : number * 20])


def test_counts_are_capped(admin_client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CappedPaginator, "count_cap", 60)
    monkeypatch.setattr(admin_stats, "STATUS_COUNT_CAP", 30)
    make_many(200)
    paginator = CappedPaginator(WorkflowRun.objects.order_by("-created_at"), 50)
    assert paginator.approximate and paginator.num_pages == 2  # pages stop at the cap
    content = admin_client.get(LIST).content.decode()
    assert "more than 60" in content or "about " in content
    counts = {c.status: c for c in admin_stats.status_counts()}
    assert counts["completed"].approximate  # 75 rows > 30
    assert counts["completed"].label == "30+" or counts["completed"].label.startswith("≈")
    assert (counts["running"].count, counts["running"].approximate) == (25, False)
    assert counts["running"].label == "25"


def test_planner_estimate_only_on_postgresql(is_postgres: bool) -> None:
    make_many(10)
    estimate = admin_paging.planner_estimate(WorkflowRun.objects.all())
    assert (estimate is not None) == is_postgres


def test_throughput_buckets_finished_runs_per_minute() -> None:
    now = clock.now()
    for minutes_ago, status in [
        (0, "completed"),
        (0, "completed"),
        (5, "failed"),
        (59, "canceled"),
        (90, "completed"),
    ]:
        make_run(status, finished_at=now - timedelta(minutes=minutes_ago))
    chart = admin_stats.throughput(now)
    assert chart["totals"] == {"completed": 2, "failed": 1, "canceled": 1}
    assert chart["peak"] == 2
    bars = chart["bars"]
    assert isinstance(bars, list)
    assert sorted((bar.status, bar.height > 0) for bar in bars) == [
        ("canceled", True),
        ("completed", True),
        ("failed", True),
    ]


def test_compact_numbers() -> None:
    assert [admin_stats.compact(n) for n in (999, 1234, 968_000, 2_500_000)] == [
        "999",
        "1.2k",
        "968k",
        "2.5M",
    ]


# -- the run page -----------------------------------------------------------------------------


def test_run_page_shows_everything(admin_client: Client) -> None:
    runs = make_showcase()
    content = admin_client.get(run_url(runs["acquire"])).content.decode()
    assert 'role="progressbar"' in content and 'aria-valuenow="62.5"' in content
    assert "copying Heat (1995).mkv" in content
    assert content.count('class="te-step"') == 5
    assert "abandoned" in content and "No space left on device" in content
    assert "&quot;plan_id&quot;: 4711" in content  # input as formatted JSON
    assert "download-done" in content and "qbt:add:plan-4711" in content  # fact, ledger
    assert str(runs["child"].pk)[-8:] in content  # child link
    assert "window.location.reload" in content  # live while active
    child_page = admin_client.get(run_url(runs["child"])).content.decode()
    assert 'id="parent-link"' in child_page and run_url(runs["acquire"]) in child_page
    assert "window.location.reload" not in child_page  # finished: static


def test_run_page_shows_the_flow_control_keys_only_when_set(admin_client: Client) -> None:
    keyed = tasks_engine.enqueue("flow-scan", {"disk": "a"}, concurrency_key="disk:a").run_id
    page = admin_client.get(run_url(WorkflowRun.objects.get(pk=keyed))).content.decode()
    assert re.search(r'id="concurrency-key">disk:a</span> <span[^>]*>at most 1 running', page)
    assert 'id="queueing-key">scan:a<' in page
    plain = tasks_engine.enqueue("b").run_id
    page = admin_client.get(run_url(WorkflowRun.objects.get(pk=plain))).content.decode()
    assert "concurrency-key" not in page and "queueing-key" not in page
    debounced = tasks_engine.enqueue("flow-debounce", {"disk": "a"}).run_id
    page = admin_client.get(run_url(WorkflowRun.objects.get(pk=debounced))).content.decode()
    assert 'id="debounce-key">d:a<' in page and "rate-key" not in page
    rated = tasks_engine.enqueue("flow-key-rate", {"disk": "a"}).run_id
    page = admin_client.get(run_url(WorkflowRun.objects.get(pk=rated))).content.decode()
    assert 'id="rate-key">a (2/s)<' in page and "debounce-key" not in page


def test_run_page_shows_error_with_traceback(admin_client: Client) -> None:
    runs = make_showcase()
    content = admin_client.get(run_url(runs["failed"])).content.decode()
    assert 'id="run-error"' in content and "OSError" in content
    assert 'id="traceback"' in content and "shutil.copy2" in content


def test_run_page_shows_what_a_waiting_run_waits_on(admin_client: Client) -> None:
    runs = make_showcase()
    content = admin_client.get(run_url(runs["waiting"])).content.decode()
    assert 'id="waits-on"' in content and "fact:download-done" in content


def test_unknown_run_redirects_to_the_list(admin_client: Client) -> None:
    response = admin_client.get(
        reverse("admin:tasks_engine_workflowrun_change", args=[uuid.uuid4()])
    )
    assert response.status_code == 302
