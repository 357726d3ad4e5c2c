"""Unfinished runs grouped by what serves them, (task, version, queue), at a bounded cost.

The runs list's banners and `tasks health` ask which groups no live worker serves. A plain
`GROUP BY` reads every unfinished row: ~600 ms per page load with 1,000,000 due runs on
PostgreSQL. Here each status is read through its own index in the order its runs are served,
at most `SAMPLE` rows per index; past that the counts are lower bounds (`at_least`). A
group no worker serves is never claimed, so its due runs stay at the front of the claim
order, where the first rows read are: only a backlog of more than `SAMPLE` runs that rank
before every one of its runs hides it, and then the backlog is the news.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connections

from ..db.alias import engine_alias
from ..db.sql import db_now_sql
from ..models import WorkflowRun

SAMPLE = 10_000  # rows read per index

RUN = WorkflowRun._meta.db_table

# (status and key condition, order): each the condition and order of one partial index, so
# the scan stops after SAMPLE rows. Disjoint, so no run is counted twice.
_PENDING = (
    (
        "status = 'pending' AND concurrency_key IS NULL AND rate_key IS NULL",
        "priority DESC, available_at",
    ),
    (
        "status = 'pending' AND concurrency_key IS NULL AND rate_key IS NOT NULL",
        "priority DESC, available_at",
    ),
    ("status = 'pending' AND concurrency_key IS NOT NULL", "priority DESC, available_at"),
)
_OTHERS = (
    ("status = 'running'", "available_at"),
    ("status = 'waiting'", "created_at DESC"),
)


@dataclass(frozen=True)
class RunGroup:
    task: str
    version: int
    queue: str
    runs: int
    at_least: bool  # an index had more than SAMPLE rows: `runs` is a lower bound

    @property
    def count_label(self) -> str:
        return f"at least {self.runs}" if self.at_least else str(self.runs)


def due_pending_groups(using: str | None = None) -> list[RunGroup]:
    """Pending runs that are due now (available), by group."""
    return _groups(_PENDING, due_only=True, using=using)


def unfinished_groups(using: str | None = None) -> list[RunGroup]:
    """Pending, running and waiting runs, by group."""
    return _groups(_PENDING + _OTHERS, due_only=False, using=using)


def _groups(
    sources: tuple[tuple[str, str], ...], *, due_only: bool, using: str | None
) -> list[RunGroup]:
    alias = using or engine_alias()
    now_sql, now_params = db_now_sql()
    parts: list[str] = []
    params: list[Any] = []
    for i, (where, order) in enumerate(sources):
        # The LIMIT before the due test: the rows read stay bounded when few are due.
        parts.append(
            f"SELECT {i}, task_name, version, queue, COUNT(*),"
            f" SUM(CASE WHEN available_at IS NULL OR available_at <= {now_sql} THEN 1 ELSE 0 END)"
            f" FROM (SELECT task_name, version, queue, available_at FROM {RUN}"
            f" WHERE {where} ORDER BY {order} LIMIT %s) AS s{i}"
            " GROUP BY task_name, version, queue"
        )
        params += [*now_params, SAMPLE]
    with connections[alias].cursor() as cur:
        cur.execute(" UNION ALL ".join(parts), params)
        rows = cur.fetchall()
    read = [0] * len(sources)
    for source, *_group, seen, _due in rows:
        read[source] += seen
    full = {i for i, n in enumerate(read) if n >= SAMPLE}
    counts: dict[tuple[str, int, str], tuple[int, bool]] = {}
    for source, task, version, queue, seen, due in rows:
        n, at_least = counts.get((task, version, queue), (0, False))
        counts[task, version, queue] = (
            n + (int(due) if due_only else seen),
            at_least or source in full,
        )
    return [
        RunGroup(task, version, queue, n, at_least)
        for (task, version, queue), (n, at_least) in sorted(counts.items())
        if n
    ]
