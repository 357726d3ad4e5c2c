"""The admin on partitioned tables (TASKS_ENGINE["PARTITION"]): the runs list's default page and
its count read the newest period and stop there (older partitions never executed; the DEFAULT
partition may be read), newest first by id, and its status strip reads no row of an old period
(a status with more than the cap in newer ones stops there; the others' index probes of each
period find nothing); a run page reads its own period only (the run by its id, its steps,
facts and ledger rows by its run id). EXPLAIN ANALYZE of the statements
the pages really run, on rows in three old periods and the current one."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connections
from django.test import Client
from django.test.utils import CaptureQueriesContext

from tasks_engine.admin import stats as admin_stats
from tasks_engine.admin.paging import CappedPaginator
from tasks_engine.db.alias import atomic
from tasks_engine.models import Fact, OpLedger, StepAttempt, WorkflowRun
from tests.factories import FactFactory, OpLedgerFactory, StepAttemptFactory, WorkflowRunFactory
from tests.partitions import ALIAS, engine_database, finished_runs, make_periods, v7_at

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only("partitions")]

RUN = WorkflowRun._meta.db_table
TABLES = (RUN, *(m._meta.db_table for m in (StepAttempt, Fact, OpLedger)))
LIST = "/admin/tasks_engine/workflowrun/"
JAN, FEB, MAR = (datetime(2025, m, 10, tzinfo=UTC) for m in (1, 2, 3))
OLD = ("p20250101", "p20250201", "p20250301")
PER_PERIOD = 200
NOW = 120  # runs of the current period: more than a page (50), more than the count's cap
CAP = 100


@pytest.fixture
def history(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    with engine_database("month"):
        make_periods(JAN, FEB, MAR)
        rows = [r for m in (JAN, FEB, MAR) for r in finished_runs(m, PER_PERIOD)]
        now = datetime.now(UTC) - timedelta(minutes=5)
        rows += finished_runs(now, NOW)
        legacy = finished_runs(now, 3)  # before migration 0020: version 4 ids, DEFAULT partition
        for r in legacy:
            r.id = uuid.uuid4()
        WorkflowRun.objects.bulk_create(rows + legacy)
        feb: Any = WorkflowRunFactory(id=v7_at(FEB + timedelta(days=1)), status="completed")
        StepAttemptFactory(run=feb, name="copy")
        FactFactory(run=feb)
        OpLedgerFactory(run=feb)
        with connections[ALIAS].cursor() as cur:
            for table in TABLES:
                cur.execute(f"ANALYZE {table}")
        monkeypatch.setattr(CappedPaginator, "count_cap", CAP)
        monkeypatch.setattr(admin_stats, "STATUS_COUNT_CAP", CAP)
        yield {"feb": feb, "legacy": {r.id for r in legacy}}


def _statements(client: Client, url: str) -> tuple[Any, list[str]]:
    """The page, and the statements it ran on the engine's tables (not the catalog's)."""
    with CaptureQueriesContext(connections[ALIAS]) as captured:
        response = client.get(url)
    assert response.status_code == 200
    sqls = [q["sql"] for q in captured.captured_queries]
    mentions = re.compile("|".join(re.escape(t) for t in TABLES))
    return response, [s for s in sqls if s.startswith("SELECT") and mentions.search(s)]


def _executed(sql: str, tag: str) -> list[str]:
    """The lines of EXPLAIN ANALYZE of `sql` (rolled back) that read partition `tag`."""
    with atomic(), connections[ALIAS].cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, COSTS OFF) " + sql)
        plan = [row[0] for row in cur.fetchall()]
        from django.db import transaction

        transaction.set_rollback(True, using=ALIAS)
    return [line for line in plan if f"_{tag}" in line and "never executed" not in line]


def _shown(content: bytes) -> list[str]:
    return re.findall(r'<span class="te-mono" title="([0-9a-f-]{36})">', content.decode())


def test_the_default_page_and_its_count_read_the_newest_period_only(
    history: dict[str, Any], admin_client: Client
) -> None:
    response, sqls = _statements(admin_client, LIST)
    newest = [str(i) for i in WorkflowRun.objects.order_by("-id").values_list("id", flat=True)]
    v7 = [i for i in newest if uuid.UUID(i) not in history["legacy"]]
    assert _shown(response.content) == v7[:50], sqls  # newest first; version 4 ids after the rest
    assert f"more than {CAP}" in response.content.decode() or "about " in response.content.decode()
    reads = [s for s in sqls if "ORDER BY" in s and '"id" DESC' in s]
    assert len(reads) >= 2, sqls  # the count and the page, each newest first
    for sql in reads:
        for tag in OLD:
            assert _executed(sql, tag) == [], sql
    [strip] = [s for s in sqls if s.startswith("SELECT 'pending', COUNT(*)")]
    for tag in OLD:
        assert [line for line in _executed(strip, tag) if " rows=0 " not in line] == [], strip
    # the last page reaches back into the periods and ends with the legacy runs
    last = (CAP + 1) // 50 + 1
    tail = _shown(admin_client.get(LIST, {"p": last}).content)
    assert (
        tail
        == [i for i in v7 + [str(x) for x in newest if uuid.UUID(x) in history["legacy"]]][
            (last - 1) * 50 : CAP
        ]
    )


def test_a_run_page_reads_its_own_period(history: dict[str, Any], admin_client: Client) -> None:
    feb = history["feb"]
    response, sqls = _statements(admin_client, f"{LIST}{feb.pk}/change/")
    assert b"copy" in response.content
    keyed = [s for s in sqls if str(feb.pk) in s or feb.pk.hex in s]
    by_table = {t: [s for s in keyed if f'FROM "{t}"' in s] for t in TABLES}
    assert all(by_table.values()), sqls  # the run, its steps, facts and ledger rows
    for table, found in by_table.items():
        for sql in found:
            if table == RUN and "parent_run_id" in sql:
                continue  # its children: in any period
            for tag in ("p20250101", "p20250301", "default"):
                assert _executed(sql, tag) == [], sql
            assert _executed(sql, "p20250201") != [], sql
