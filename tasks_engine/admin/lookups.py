"""Changelist query strings that no database could answer: a NUL character.

PostgreSQL refuses NUL in text ("PostgreSQL text fields cannot contain NUL (0x00) bytes"), so
`?status__exact=%00` (or any other filter parameter holding one) failed with a 500 when the
list's query ran. Such a parameter is an invalid lookup, answered the way Django's admin answers
every invalid lookup: `IncorrectLookupParameters`, which `changelist_view` turns into a redirect
to the bare list with `?e=1`; on SQLite too, so both databases answer alike. The search box
(`?q=`) is left to Django, whose search form already refuses NUL ("Null characters are not
allowed.", the list unfiltered).
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import SEARCH_VAR
from django.http import HttpRequest

NUL = "\x00"
MESSAGE = "Null characters are not allowed in a list's filters; the filters were cleared."


def has_nul_lookup(request: HttpRequest) -> bool:
    """True when a query string parameter other than the search term holds a NUL character."""
    return any(
        NUL in key or any(NUL in value for value in values)
        for key, values in request.GET.lists()
        if key != SEARCH_VAR
    )


class RefuseNulLookupsMixin:
    """For a ModelAdmin: a NUL character in a filter parameter is an invalid lookup (?e=1)."""

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        if has_nul_lookup(request):
            messages.error(request, MESSAGE)
            raise IncorrectLookupParameters(MESSAGE)
        return super().get_changelist_instance(request)  # type: ignore[misc]
