"""The PostgreSQL statements of the hot writes, built from one definition of each part.

queries/postgresql.sql defines each part of a hot write once: its row's columns
(`hot_<part>_columns`), its statement over those rows (`hot_<part>`) and the fence
(`hot_fence`). Two forms are built from them, each text once per shape (then prepared once):

- a group (`group_statement`): each part's rows arrive as one JSON parameter
  (`json_to_recordset`), so the text does not depend on the group's size, and each part is a
  CTE whose results a UNION reports, tagged by part;
- a write alone (`single_statement`): its columns bound as parameters, and its start or
  completion the statement itself (`... RETURNING`), not a CTE read by a SELECT. PostgreSQL
  inlines a one-row CTE read once, so this plans as a plain `UPDATE ... WHERE id = $1`: a group
  of one paid about 15 % of an in-process claim and complete for the JSON rows, the
  materialised CTE and the outer SELECT.

The fence and the columns being the same in both, a write alone and a group cannot drift.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

from ..db.sql import p_json, query
from .claims import CLAIM_COLUMNS, prestarted_sql

Part = Literal["deferred", "starts", "completes"]
Columns = tuple[tuple[str, str], ...]  # (name, SQL type)

ROWS = {"deferred": "dv", "starts": "sv", "completes": "cv"}  # each part's rows
RESULTS = {"deferred": "d", "starts": "i", "completes": "c"}  # each part's CTE
LOOKUP = {  # a group's JSON rows have no statistics: keep each lookup on its primary key
    "deferred": "s.id = ANY(ARRAY(SELECT step_id FROM dv)) AND ",
    "completes": "r.id = ANY(ARRAY(SELECT run_id FROM cv)) AND ",
}
FENCED = ("run_id", "token")  # a write alone binds its lease once for all its parts
DEFERRED_PREFIX = "d_"  # a write alone's deferred completion's own parameters


@functools.cache
def columns(part: Part) -> Columns:
    """The part's row columns, as queries/postgresql.sql lists them."""
    text = {
        "deferred": query("hot_deferred_columns"),
        "starts": query("hot_starts_columns"),
        "completes": query("hot_completes_columns"),
    }[part]
    pairs = (column.split() for column in text.replace("\n", " ").split(","))
    return tuple((name, sql_type) for name, sql_type in pairs)


def fence(rows: str, *, unless_canceled: bool = False) -> str:
    canceled = " AND r.cancel_requested_at IS NULL" if unless_canceled else ""
    return query("hot_fence").format(v=rows, unless_canceled=canceled)


def _body(part: Part, *, group: bool, after: str = "") -> str:
    """The part's statement over its rows (a CTE of a group, or the statement alone)."""
    lookup = LOOKUP.get(part, "") if group else ""
    if part == "deferred":
        if group:
            return query("hot_deferred").format(lookup=lookup, rows="fdv", fence="")
        return query("hot_deferred").format(lookup="", rows="dv", fence=" AND " + fence("dv"))
    if part == "starts":
        return query("hot_starts").format(fence=fence("sv", unless_canceled=True))
    return query("hot_completes").format(lookup=lookup, after=after)


def _fenced_deferred(*, gated: bool = False) -> str:
    if gated:
        return query("hot_deferred_gated").format(fence=fence("alone"))
    return query("hot_deferred_fenced").format(fence=fence("dv"))


def _json_rows(part: Part) -> str:
    cols = ", ".join(f"{name} {sql_type}" for name, sql_type in columns(part))
    return f"{ROWS[part]} AS (SELECT * FROM json_to_recordset(%({part})s::json) AS t ({cols}))"


def param(part: Part, column: str) -> str:
    """A write alone's parameter name for a column of one of its parts."""
    if column in FENCED or part != "deferred":
        return column
    return DEFERRED_PREFIX + column


def bind(part: Part, row: dict[str, Any]) -> dict[str, Any]:
    """A write alone's parameters for one row of `part`: every column of the part (one the row
    leaves out is NULL), jsonb ones adapted."""
    return {
        param(part, name): p_json(row.get(name)) if sql_type == "jsonb" else row.get(name)
        for name, sql_type in columns(part)
    }


def _bound_row(part: Part) -> str:
    cols = ", ".join(
        f"%({param(part, name)})s::{sql_type} AS {name}" for name, sql_type in columns(part)
    )
    return f"{ROWS[part]} AS (SELECT {cols})"


def _after(parts: tuple[Part, ...]) -> str:
    return "".join(
        f" AND (SELECT count(*) FROM {RESULTS[p]}) >= 0" for p in parts if p != "completes"
    )


@functools.cache
def group_statement(
    parts: tuple[Part, ...], deferred_written: bool, claim: str | None, prestart: bool = False
) -> str:
    """The statement of a group holding `parts` (in the order deferred, starts, completes):
    rows ('k', prestarted step id or NULL, NULL, claimed run's columns...) for the claim's CTEs
    `claim` (ending in `k`, then `ks` with `prestart`: claims.Prestart), ('i', step id, token,
    run id) per start, ('c', NULL, token, run id) per completion, ('d', step id, token, run
    id) per deferred completion written (with `deferred_written`)."""
    ctes = [_json_rows(part) for part in parts]
    # With completions in the group, its deferred completions follow them (and are gated on
    # them: hot_deferred_gated); the starts' fences lock their runs' rows before them.
    gated = "deferred" in parts and "completes" in parts
    deferred = [_fenced_deferred(gated=gated), f"d AS ({_body('deferred', group=True)})"]
    if "deferred" in parts and not gated:
        ctes += deferred
    if "starts" in parts:
        ctes.append(f"i AS ({_body('starts', group=True)})")
    if "completes" in parts:
        after = _after(("starts",)) if "starts" in parts else ""
        ctes.append(f"c AS ({_body('completes', group=True, after=after)})")
    if gated:
        ctes += deferred
    selects: list[str] = []
    if "starts" in parts:
        selects.append(query("hot_started"))
    if "completes" in parts:
        selects.append(query("hot_completed"))
    if deferred_written:
        selects.append(query("hot_deferred_written"))
    pad = ""
    if claim is not None:
        pad = ", NULL" * (len(CLAIM_COLUMNS) - 1)
        ctes.append(claim)
        # The claim's rows go first: UNION resolves the padding NULLs' types from them.
        started, join = prestarted_sql(prestart)
        selects.insert(0, f"SELECT 'k', {started}, NULL::uuid, k.* FROM k{join}")
    results = " UNION ALL ".join(selects).format(pad=pad)
    return f"WITH {', '.join(ctes)} {results}"


@functools.cache
def single_statement(part: Part, deferred: int) -> str:
    """The statement of one start or one completion carrying `deferred` deferred completions
    (one: bound as parameters; more: as a group's JSON rows, `%(deferred)s`). It returns the
    part's RETURNING row: (step id, run id, token) for a start, (run id, token) for a
    completion."""
    ctes: list[str] = []
    if deferred:
        alone = deferred == 1
        ctes.append(_bound_row("deferred") if alone else _json_rows("deferred"))
        if not alone:
            ctes.append(_fenced_deferred())
        ctes.append(f"d AS ({_body('deferred', group=not alone)})")
    ctes.append(_bound_row(part))
    after = _after(("deferred",)) if deferred and part == "completes" else ""
    return f"WITH {', '.join(ctes)} {_body(part, group=False, after=after)}"
