"""The one rule for a name or key a run's column holds: a non-empty string of at most so many
characters, without a NUL (PostgreSQL's text refuses it; SQLite would store it). It imports
nothing of the engine's, so that the engine, the definitions and the command line all check
with it."""

from __future__ import annotations

from typing import Any


def check_text(
    what: str, value: Any, longest: int, *, not_a_string: type[Exception] = TypeError
) -> None:
    """`not_a_string` (TypeError unless the caller's contract says otherwise) for a value that
    is no string, ValueError for one the column cannot hold."""
    if not isinstance(value, str):
        raise not_a_string(f"{what} must be a non-empty string, not {value!r}")
    if not value:
        raise ValueError(f"{what} must be a non-empty string, not ''")
    if len(value) > longest:
        raise ValueError(f"{what} is {len(value)} characters long: at most {longest}")
    if "\x00" in value:
        raise ValueError(f"{what} must not contain a NUL character")
