"""Tags: string pairs on a run to find it by (`enqueue(..., tags=)`, `@workflow(tags=)`).

The rule is checked where tags enter (the API, the command line, the admin's `tag:K=V`), so a
bad pair is a ValueError before anything is written. A run without tags stores NULL, not `{}`:
its row takes no entry in the tag index (PostgreSQL: GIN `jsonb_path_ops` on the rows that
have tags, which answers `tags @> {...}`). SQLite has no such index; its filter compares each
pair's value in the run's JSON.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django.db.models import Q, QuerySet
from django.db.models.fields.json import KeyTextTransform
from django.db.models.lookups import Exact

MAX_PAIRS = 16
KEY_MAX_LENGTH = 64
VALUE_MAX_LENGTH = 256
_KEY = re.compile(r"[A-Za-z0-9_.-]+")


def check_tags(tags: Any, what: str = "tags") -> dict[str, str]:
    """`tags` as a plain dict, or ValueError saying which pair breaks the rule: string keys of
    at most 64 characters from [A-Za-z0-9_.-], string values of at most 256 (no NUL), at most
    16 pairs."""
    if tags is None:
        return {}
    if not isinstance(tags, Mapping):
        raise ValueError(f"{what} must be a dict of strings, not {tags!r}")
    if len(tags) > MAX_PAIRS:
        raise ValueError(f"{what} has {len(tags)} pairs: at most {MAX_PAIRS}")
    checked: dict[str, str] = {}
    for key, value in tags.items():
        if not isinstance(key, str) or not _KEY.fullmatch(key) or len(key) > KEY_MAX_LENGTH:
            raise ValueError(
                f"{what}: key {key!r} must be 1 to {KEY_MAX_LENGTH} characters of"
                " A-Z, a-z, 0-9, '_', '.', '-'"
            )
        if not isinstance(value, str):
            raise ValueError(f"{what}: the value of {key!r} must be a string, not {value!r}")
        if len(value) > VALUE_MAX_LENGTH:
            raise ValueError(
                f"{what}: the value of {key!r} is {len(value)} characters long:"
                f" at most {VALUE_MAX_LENGTH}"
            )
        if "\x00" in value:
            raise ValueError(f"{what}: the value of {key!r} must not contain a NUL character")
        checked[key] = value
    return checked


def merged(defaults: Mapping[str, str], own: Mapping[str, str]) -> dict[str, str]:
    """A run's tags: the workflow's defaults under the enqueue's own (ValueError past 16)."""
    tags = {**defaults, **own}
    if len(tags) > MAX_PAIRS:
        raise ValueError(
            f"tags: {len(tags)} pairs with the workflow's defaults merged in: at most {MAX_PAIRS}"
        )
    return tags


def parse_pair(text: str) -> tuple[str, str]:
    """`K=V` (the command line's `--tag`, the admin's `tag:K=V`) as a checked pair."""
    key, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"tag {text!r} must be KEY=VALUE")
    check_tags({key: value}, "tag")
    return key, value


def parse_pairs(texts: list[str]) -> dict[str, str]:
    """Several `K=V` as one filter; the same key twice with two values matches nothing, so it
    is refused."""
    pairs: dict[str, str] = {}
    for text in texts:
        key, value = parse_pair(text)
        if pairs.get(key, value) != value:
            raise ValueError(f"tag {key!r} is given twice, as {pairs[key]!r} and {value!r}")
        pairs[key] = value
    return pairs


def with_tags[M: Any](runs: QuerySet[M], tags: Mapping[str, str], *, postgres: bool) -> QuerySet[M]:
    """The runs that carry every pair of `tags` (checked by the caller)."""
    if not tags:
        return runs
    if postgres:  # jsonb containment: what the GIN index answers
        return runs.filter(tags__contains=dict(tags))
    condition = Q()
    for key, value in tags.items():  # not `tags__<key>`: a key with "__" would be split
        condition &= Q(Exact(KeyTextTransform(key, "tags"), value))
    return runs.filter(condition)
