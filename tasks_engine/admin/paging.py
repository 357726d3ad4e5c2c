"""Admin pagination that stays fast on millions of rows.

Django's admin paginator runs `SELECT COUNT(*)` over the whole filtered table on every page
load, and sorts the whole table for "newest first" when no index matches the ordering.

- `CappedPaginator` counts at most `COUNT_CAP + 1` rows (`SELECT COUNT(*) FROM (... LIMIT n)`).
  Past the cap the total shown is the planner's estimate on PostgreSQL (`EXPLAIN`, which reads
  statistics, not rows) and "more than COUNT_CAP" elsewhere; pages stop at the cap: narrow the
  list with filters or search to reach older rows.
- `RunPaginator` also fetches a page of runs ordered by `created_at` through the
  `(status, created_at)` index: one `UNION ALL` branch per status, each an index scan with a
  LIMIT, merged by PostgreSQL's Merge Append. The plain `ORDER BY created_at` would be a sequential
  scan and a top-N sort of the whole table (~200 ms on 1M rows; this is under 1 ms). A list
  filtered by task keeps the plain query: the `(task_name, created_at)` index serves it.
- On partitioned tables (TASKS_ENGINE["PARTITION"]) the list is newest first by id (version 7
  ids are creation-time ordered) and `RunPaginator` reads it in two parts: the period
  partitions, whose id ranges let PostgreSQL read them newest first through their primary keys
  and stop after the page (older partitions are never executed), and the DEFAULT partition
  (rows of a period not made yet, and runs made before migration 0020, whose version 4 ids
  have no time order: they come after the others). Its count reads the same way.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from django.core.paginator import Page, Paginator
from django.db import connections
from django.db.models import Q, QuerySet
from django.db.models.expressions import RawSQL
from django.utils.functional import cached_property

from ..db import partitions
from ..db.partitions import catalog
from ..models import WorkflowRun
from ..states import RunStatus

COUNT_CAP = 10_000

# Columns the runs list never shows; left out of the page query.
LIST_DEFERRED = ("input", "output", "error", "unreached_steps", "input_hash", "parent_step")


def planner_estimate(qs: QuerySet) -> int | None:
    """The planner's row estimate for `qs` on PostgreSQL (no rows are read); None elsewhere."""
    if connections[qs.db].vendor != "postgresql":
        return None
    try:
        plan = json.loads(qs.order_by().explain(format="json"))
    except Exception:  # noqa: BLE001 - an estimate is a nicety; never break the page for it
        return None
    return int(plan[0]["Plan"]["Plan Rows"])


class CappedPaginator(Paginator):
    """Counts up to `COUNT_CAP`; past it, shows an estimate and pages through the first rows."""

    count_cap = COUNT_CAP

    @cached_property
    def capped_count(self) -> int:
        qs = self.object_list
        if not isinstance(qs, QuerySet):
            return len(qs)
        return qs.order_by().values("pk")[: self.count_cap + 1].count()

    @cached_property
    def approximate(self) -> bool:
        return self.capped_count > self.count_cap

    @cached_property
    def count(self) -> int:
        if not self.approximate or not isinstance(self.object_list, QuerySet):
            return self.capped_count
        estimate = planner_estimate(self.object_list)
        return max(estimate or 0, self.count_cap + 1)

    @property
    def count_label(self) -> str:
        """ "1,234", or "about 968,000" / "more than 10,000" past the cap."""
        if not self.approximate:
            return f"{self.count:,}"
        if self.count > self.count_cap + 1:
            return f"about {self.count:,}"
        return f"more than {self.count_cap:,}"

    @cached_property
    def num_pages(self) -> int:
        reachable = min(self.count, self.count_cap)
        if reachable == 0 and not self.allow_empty_first_page:
            return 0
        return max(1, math.ceil(max(1, reachable - self.orphans) / self.per_page))

    def page_bounds(self, number: Any) -> tuple[int, int, int]:
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        top = min(bottom + self.per_page, self.count_cap)
        if top + self.orphans >= self.count:
            top = self.count
        return number, bottom, top

    def page(self, number: Any) -> Page:
        number, bottom, top = self.page_bounds(number)
        return Page(self.object_list[bottom:top], number, self)


def _created_direction(qs: QuerySet) -> str | None:
    """ "-" or "" when `qs` is ordered by created_at (then pk/id), else None."""
    # Django's change list appends the default ordering to the chosen one, so created_at can
    # repeat ("created_at", "-created_at", "-pk"); only its first occurrence counts.
    order = [str(o) for o in qs.query.order_by]
    if not order or qs.query.combinator or qs.query.distinct:
        return None
    first = order[0]
    if first.lstrip("-") != "created_at":
        return None
    rest = [o.lstrip("-") for o in order[1:] if o.lstrip("-") != "created_at"]
    if rest not in ([], ["pk"], ["id"]):
        return None
    return "-" if first.startswith("-") else ""


# The period partitions change every few days (made ahead, dropped by retention): their ranges
# are read from the catalog at most this often. Stale ranges only prune less: a row in a range
# they miss is read through the DEFAULT part's conditions, and one in a range of a dropped
# period through the periods' (both parts always cover every id exactly once).
RANGES_SECONDS = 60.0
_ranges: dict[tuple[str, str], tuple[float, list[tuple[Any, Any]]]] = {}


def period_ranges(alias: str) -> list[tuple[Any, Any]] | None:
    """The id ranges the runs' period partitions cover, read through `alias`; None when the
    tables are not partitioned."""
    if partitions.unit() is None:
        return None
    key = (alias, str(connections[alias].settings_dict["NAME"]))
    now = time.monotonic()
    cached = _ranges.get(key)
    if cached is None or now - cached[0] >= RANGES_SECONDS:
        cached = _ranges[key] = (now, catalog.covered(partitions.RUNS.table, alias))
    return cached[1]


def _newest_by_id(qs: QuerySet) -> bool:
    # The change list may repeat its ordering's field ("-id", "-id").
    order = {str(o) for o in qs.query.order_by}
    return order in ({"-id"}, {"-pk"}) and not qs.query.combinator and not qs.query.distinct


# Version 7 ids first: a version 4 id (before migration 0020) sorts anywhere by its bytes.
_VERSION_7 = RawSQL(f'substr("{WorkflowRun._meta.db_table}"."id"::text, 15, 1) = \'7\'', [])


def default_ranges(ranges: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """The id intervals the period partitions' `ranges` (sorted, disjoint) leave to the DEFAULT
    partition, None for an open end: a condition on either list leaves the other partitions out
    of a plan."""
    gaps, after = [], None
    for lo, hi in ranges:
        gaps.append((after, lo))
        after = hi
    gaps.append((after, None))
    return gaps


def _id_in(intervals: list[tuple[Any, Any]]) -> Q:
    found = Q()
    for lo, hi in intervals:
        found |= Q(
            **({} if lo is None else {"id__gte": lo}), **({} if hi is None else {"id__lt": hi})
        )
    return found


def _period_parts(qs: QuerySet, ranges: list[tuple[Any, Any]]) -> tuple[QuerySet, QuerySet]:
    """`qs`'s runs in the period partitions and those in the DEFAULT partition."""
    return qs.filter(_id_in(ranges)), qs.filter(_id_in(default_ranges(ranges)))


class RunPaginator(CappedPaginator):
    """Pages of runs by creation time through the per-status index, or on partitioned tables by
    id, period partitions first (see the module docstring).

    `statuses` narrows the branches when the list is already filtered by status: a branch that
    cannot match costs nothing to run, but inflates the plan's cost estimate (and can trigger
    PostgreSQL's JIT compilation, ~25 ms). `periods`: the id ranges the period partitions cover
    (db/partitions/catalog.covered), on a partitioned install.
    """

    def __init__(
        self,
        *args: Any,
        statuses: list[str] | None = None,
        merge: bool = True,
        periods: list[tuple[Any, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.statuses = [s for s in (statuses or RunStatus.values) if s in RunStatus.values]
        self.merge = merge  # False when another index already serves the order (task filter)
        self.periods = periods

    def _by_period(self) -> tuple[QuerySet, QuerySet] | None:
        qs = self.object_list
        if not self.periods or not isinstance(qs, QuerySet) or not _newest_by_id(qs):
            return None
        return _period_parts(qs, self.periods)

    @cached_property
    def capped_count(self) -> int:
        parts = self._by_period()
        if parts is None:
            return super().capped_count
        # Newest first, as the page: without an order the partitions are read oldest first.
        in_periods, in_default = parts
        cap = self.count_cap + 1
        newest = in_periods.order_by("-id").values("pk")[:cap]
        return min(newest.union(in_default.order_by().values("pk")[:cap], all=True).count(), cap)

    def page(self, number: Any) -> Page:
        number, bottom, top = self.page_bounds(number)
        qs = self.object_list
        if not isinstance(qs, QuerySet):
            return Page(qs[bottom:top], number, self)
        parts = self._by_period()
        if parts is not None:
            in_periods, in_default = parts
            newest = list(in_periods.order_by("-id").defer(*LIST_DEFERRED)[:top])
            newest += (
                in_default.alias(v7=_VERSION_7).order_by("-v7", "-id").defer(*LIST_DEFERRED)[:top]
            )
            newest.sort(key=lambda r: (r.pk.version == 7, r.pk.bytes), reverse=True)
            return Page(newest[bottom:top], number, self)
        sign = _created_direction(qs)
        compound = connections[qs.db].features.supports_slicing_ordering_in_compound
        if sign is None or not compound or not self.merge:
            return Page(qs.defer(*LIST_DEFERRED)[bottom:top], number, self)
        order = (f"{sign}created_at", f"{sign}id")
        statuses = self.statuses or RunStatus.values
        if len(statuses) == 1:  # the index already serves this order
            rows = qs.filter(status=statuses[0]).defer(*LIST_DEFERRED)[bottom:top]
            return Page(rows, number, self)
        branches = [
            qs.filter(status=status).order_by(*order).defer(*LIST_DEFERRED)[:top]
            for status in statuses
        ]
        merged = branches[0].union(*branches[1:], all=True).order_by(*order)[bottom:top]
        return Page(list(merged), number, self)
