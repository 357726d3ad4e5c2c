"""Runs list filters and search that read no table to build themselves.

Django's default filter on a plain column runs `SELECT DISTINCT` over the whole table on every
page load; these list the registered workflows instead (a run of an unregistered task can still
be reached with `?task=name`). Search is exact, so that each term hits an index where one exists.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from django.contrib import admin
from django.db.models import CharField, Q, QuerySet, Value
from django.db.models.functions import Cast, Replace

from ..definitions import registry
from ..values import tags as run_tags

HEX = re.compile(r"^[0-9a-f]{4,32}$")
TASK_AT_VERSION = re.compile(r"^(?P<task>[^@]+)@(?P<version>[0-9]{1,9})$")
SHORT_ID = 8  # the hex digits of a run id the lists show: its last ones (short_run_id)
TAIL_MATCHES = 1000  # at most this many runs found by the last characters of their ids


def short_run_id(run_id: object) -> str:
    """What the admin's lists show of a run id: its last 8 hex digits. A run id is a version 7
    UUID (clock.new_run_id) whose first digits are its creation time (the first 8 are a
    65-second window that every run created in it shares) and whose last 8 are random."""
    return str(run_id)[-SHORT_ID:]


def registered() -> list[tuple[str, int]]:
    """(name, version) of every registered workflow."""
    return list(registry.pairs())


class _RegistryFilter(admin.SimpleListFilter):
    field = ""

    def choices_from_registry(self) -> list[tuple[str, str]]:
        raise NotImplementedError

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        found = self.choices_from_registry()
        current = self.value()
        if current and current not in {value for value, _ in found}:
            found.append((current, current))
        return found

    def queryset(self, request: Any, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if not value:
            return queryset
        return queryset.filter(**{self.field: value})


class TaskFilter(_RegistryFilter):
    title = "task"
    parameter_name = "task"
    field = "task_name"

    def choices_from_registry(self) -> list[tuple[str, str]]:
        return [(name, name) for name in sorted({name for name, _ in registered()})]


class VersionFilter(_RegistryFilter):
    title = "version"
    parameter_name = "version"
    field = "version"

    def choices_from_registry(self) -> list[tuple[str, str]]:
        versions = sorted({version for _, version in registered()})
        return [(str(v), f"v{v}") for v in versions]

    def queryset(self, request: Any, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if not value or not value.isdigit():
            return queryset
        return queryset.filter(version=int(value))


class QueueFilter(_RegistryFilter):
    title = "queue"
    parameter_name = "queue"
    field = "queue"

    def choices_from_registry(self) -> list[tuple[str, str]]:
        queues = {"default"}
        for key in registered():
            wf = registry.find(*key)
            if wf is not None:
                queues.add(wf.queue)
        return [(q, q) for q in sorted(queues)]


def search_runs(queryset: QuerySet, term: str, *, postgres: bool = False) -> QuerySet:
    """Exact search: a run id (full, or its last hex digits as the list shows them, or its
    first ones), a task name (or `name@version`, as the list shows it), an idempotency key,
    or a trace id; or tags, `tag:K=V` (several, space-separated: every pair must match;
    ValueError for one the tag rule refuses).

    An id match is looked up first, through the primary key index; only when none is found
    are task names, idempotency keys and stored trace ids compared (task names on the
    `(task_name, created_at)` index, the others each on its partial index). A full run
    id is also a trace id (a run's own, tracing.run_trace_id): the runs that joined its trace
    (its children) come with it.
    """
    term = term.strip()
    if not term:
        return queryset
    words = term.split()
    if all(word.startswith("tag:") for word in words):
        pairs = run_tags.parse_pairs([word.removeprefix("tag:") for word in words])
        return run_tags.with_tags(queryset, pairs, postgres=postgres)
    by_id = _id_match(queryset, term)
    if by_id is not None:
        found = queryset.filter(by_id)
        if found.exists():
            return found
    return queryset.filter(Q(idempotency_key=term) | _stored_trace(term) | _task_match(term))


def _task_match(term: str) -> Q:
    named = TASK_AT_VERSION.match(term)
    if named:  # "acquire@2", as the list shows a run's task
        return Q(task_name=term) | Q(task_name=named["task"], version=int(named["version"]))
    return Q(task_name=term)


def _stored_trace(term: str) -> Q:
    # Spelled with the index's condition, so that the planner may use it (run_trace_id).
    return Q(trace_id=term) & ~Q(trace_id="")


def _id_match(queryset: QuerySet, term: str) -> Q | None:
    compact = term.lower().replace("-", "")
    if not HEX.match(compact):
        return None
    if len(compact) == 32:  # with the runs that joined its trace (its own trace id)
        return Q(pk=uuid.UUID(compact)) | _stored_trace(compact)
    # Its first characters: a range of ids, which the primary key index serves. A version 7 id
    # starts with its creation time, so a short prefix lists the runs of a window (8 digits:
    # 65 seconds, 12: a millisecond); the digits after are a counter that starts at random
    # every millisecond, so a few more pick one run.
    by_start = Q(
        pk__gte=uuid.UUID(compact.ljust(32, "0")), pk__lte=uuid.UUID(compact.ljust(32, "f"))
    )
    # Its last characters, as the list shows them (short_run_id): random bits, which no index
    # orders, so their ids are read first in a statement of their own (an OR of the two in one
    # statement would scan the runs table for every prefix search too).
    by_end = _ids_ending_with(queryset, compact)
    return by_start | Q(pk__in=by_end) if by_end else by_start


def _ids_ending_with(queryset: QuerySet, tail: str) -> list[uuid.UUID]:
    # PostgreSQL's text of a uuid has dashes; SQLite stores the 32 hex digits.
    hex_id = Replace(Cast("pk", output_field=CharField()), Value("-"), Value(""))
    ids = (
        queryset.model._default_manager.db_manager(queryset.db)  # the list's own database
        .annotate(hex_id=hex_id)
        .filter(hex_id__endswith=tail)
        .order_by()
        .values_list("pk", flat=True)
    )
    return list(ids[:TAIL_MATCHES])
