"""Changelist input that no database could answer: a NUL character in a filter, a selected id
the primary key cannot hold.

PostgreSQL refuses NUL in text ("PostgreSQL text fields cannot contain NUL (0x00) bytes"), so
`?status__exact=%00` (or any other filter parameter holding one) failed with a 500 when the
list's query ran. Such a parameter is an invalid lookup, answered the way Django's admin answers
every invalid lookup: `IncorrectLookupParameters`, which `changelist_view` turns into a redirect
to the bare list with `?e=1`; on SQLite too, so both databases answer alike. The search box
(`?q=`) is left to Django, whose search form already refuses NUL ("Null characters are not
allowed.", the list unfiltered).

A list action posted with a malformed `_selected_action` id ("not-a-uuid" for a run, "x" or a
number past 64 bits for a schedule or an outbox event) was a 500: Django filters by `pk__in`
the posted ids and the key's field raises ValidationError (or the database a DataError). It is
answered as Django answers an action with nothing selected: a message and a redirect back to
the list, before the action runs, so nothing is written (`RefuseMalformedSelectionMixin`).
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import SEARCH_VAR
from django.core.exceptions import ValidationError
from django.db.models import Model
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect

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


def malformed_id(model: type[Model], values: list[str]) -> str | None:
    """The first of `values` that is no valid primary key of `model` (one its field cannot
    read, or out of the column's range), or None."""
    field = model._meta.pk
    assert field is not None
    for value in values:
        try:
            field.run_validators(field.to_python(value))  # the range of an integer key
        except ValidationError:
            return value
    return None


class RefuseMalformedSelectionMixin:
    """For a ModelAdmin with list actions: a selected id its primary key cannot hold is a
    message and a redirect back to the list, and the action does not run."""

    model: type[Model]

    def response_action(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        bad = malformed_id(self.model, request.POST.getlist(ACTION_CHECKBOX_NAME))
        if bad is not None:
            name = self.model._meta.verbose_name
            messages.error(request, f"{bad!r} is not a valid id of a {name}; nothing was changed.")
            return HttpResponseRedirect(request.get_full_path())
        response: HttpResponse | None = super().response_action(  # type: ignore[misc]
            request, *args, **kwargs
        )
        return response
