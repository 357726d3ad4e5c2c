"""JSON in and out of the store: canonical input hashing, step results, errors."""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import traceback
from decimal import Decimal
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError

from ..exceptions import StepFailedError, UnstorableValueError

# The longest reason an operator can give (a cancel's, a retry's, a schedule's pause): it is
# stored, logged and shown on the run page.
REASON_MAX_LENGTH = 2000


def check_reason(reason: Any) -> None:
    """An operator's reason is None or text the database can store, of at most
    REASON_MAX_LENGTH characters: TypeError or ValueError otherwise."""
    if reason is not None and not isinstance(reason, str):
        raise TypeError(f"reason must be a string, not {type(reason).__name__}")
    if reason is not None and len(reason) > REASON_MAX_LENGTH:
        raise ValueError(f"reason is {len(reason)} characters long: at most {REASON_MAX_LENGTH}")
    if reason is not None and "\x00" in reason:
        raise ValueError("reason must not contain a NUL character (a database cannot store it)")


def to_jsonable(value: Any, what: str = "value") -> Any:
    """The JSON-decoded form of `value`: what replay will return. Pydantic models dump as JSON.

    A value JSON cannot hold exactly is refused with `UnstorableValueError` naming what and
    where: a type JSON has no form for (a datetime, a set), NaN or ±Infinity (not standard
    JSON, and PostgreSQL's jsonb refuses them), a NUL character in a string (jsonb refuses
    it too), nesting deeper than MAX_JSON_DEPTH and a size past MAX_PAYLOAD_BYTES
    (`check_stored_form`). Refused here, where it is produced, it can never fail a statement
    it shares with other runs' writes.
    """
    kind = type(value)
    if value is None or kind is int or kind is bool:
        return value  # already its own JSON-decoded form (the common case for a step)
    if kind is str:
        if "\x00" in value:
            raise _unstorable(what, value)
        if 6 * len(value) + 2 > UNMEASURED_BYTES:  # \uXXXX: the most a character can take
            check_size(what, len(json.dumps(value, ensure_ascii=False).encode()))
        return value
    try:
        if isinstance(value, BaseModel):
            return _model_jsonable(what, value)
        try:
            text = json.dumps(value, default=_default, allow_nan=False)
        except (TypeError, ValueError):
            raise _unstorable(what, value) from None
        if "\\u0000" in text:  # rare: make sure it is a NUL and not the six characters \u0000
            _refuse_unstorable(what, value)
        return check_stored_form(what, text, _AS_STORED.decode(text))
    except (RecursionError, ValueError) as exc:
        if not nested_too_deeply(exc):
            raise
        raise too_deep(what) from None


def nested_too_deeply(exc: BaseException) -> bool:
    """Whether `exc` is Python's recursion limit or pydantic's bound on nesting (a bare
    ValueError) stopping a value's JSON, before MAX_JSON_DEPTH could be checked."""
    return isinstance(exc, RecursionError) or str(exc) == "Maximum serialization depth exceeded"


# Lists and objects inside each other at most this deep: SQLite's JSON functions refuse more
# than 1,000 levels (its JSON_VALID check fails the row), and Python's recursion limit stops
# its JSON writer and reader at about that many too.
MAX_JSON_DEPTH = 200
# A JSON text of at most this many characters is within every MAX_PAYLOAD_BYTES the settings
# allow (conf.PAYLOAD_BYTES_RANGE): not measured, so small values cost nothing.
UNMEASURED_BYTES = 64 * 2**10

TOO_DEEP = f"it is nested too deeply (lists and objects more than {MAX_JSON_DEPTH} levels deep)"


def check_stored_form(what: str, text: str, decoded: Any) -> Any:
    """`decoded` (the value of the JSON `text`, in any formatting) once it is known to nest
    at most MAX_JSON_DEPTH deep and to take at most MAX_PAYLOAD_BYTES as compact JSON: the
    checks run only for a text long enough to fail them."""
    check_depth(what, text, decoded)
    if len(text) > UNMEASURED_BYTES:  # never shorter than the compact UTF-8 text
        check_size(what, len(canonical_json(decoded).encode()))
    return decoded


def check_depth(what: str, text: str, decoded: Any) -> None:
    """UnstorableValueError for nesting past MAX_JSON_DEPTH; walked only when the text holds
    more brackets than that."""
    if len(text) <= MAX_JSON_DEPTH or text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return
    if type(decoded) in (dict, list) and _nests_too_deeply(decoded):
        raise too_deep(what)


def check_size(what: str, size: int) -> None:
    """UnstorableValueError for a value of `size` bytes of JSON past MAX_PAYLOAD_BYTES."""
    from ..conf import engine_settings

    bound = engine_settings().max_payload_bytes
    if size > bound:
        raise UnstorableValueError(
            f"{what} is too large to store: {size} bytes as JSON, at most {bound}"
            " (TASKS_ENGINE['MAX_PAYLOAD_BYTES'])"
        )


def _nests_too_deeply(value: Any) -> bool:
    """Whether lists and objects nest past MAX_JSON_DEPTH in a JSON-decoded value: level by
    level, without recursion, stopping there."""
    level, current = 0, [value]
    while current:
        level += 1
        if level > MAX_JSON_DEPTH:
            return True
        below: list[Any] = []
        add = below.append
        for node in current:
            for child in node.values() if type(node) is dict else node:
                kind = type(child)
                if kind is dict or kind is list:
                    add(child)
        current = below
    return False


def too_deep(what: str) -> UnstorableValueError:
    """Nesting past MAX_JSON_DEPTH, or past what Python's recursion limit lets JSON be
    written: refused, instead of a RecursionError from deep inside."""
    return UnstorableValueError(f"{what} cannot be stored as JSON: {TOO_DEEP}")


def stored_float(text: str) -> float | int:
    """A JSON number with a fraction or exponent as the store gives it back, on both
    databases: PostgreSQL's jsonb keeps the number, not its notation, so 1e+20 (how Python
    writes 1e20) comes back as the int 100000000000000000000, and -0.0 as 0.0 (its numeric
    has no negative zero). Python writes a positive exponent only from 1e16 on, where every
    float is a whole number."""
    if "e+" in text or "E+" in text:
        return int(Decimal(text))
    return float(text) or 0.0


# One decoder, made once: json.loads(text, parse_float=...) builds one a call (1.4 us each,
# on every step result).
_AS_STORED = json.JSONDecoder(parse_float=stored_float)


def _model_jsonable(what: str, model: BaseModel) -> Any:
    """The model dumped in JSON mode (datetimes, UUIDs, enums ... as pydantic writes them), but
    not a NaN or ±Infinity (JSON mode would write null) nor a NUL character."""
    if unstorable(model) is not None:
        raise _unstorable(what, model)
    try:
        dumped = model.model_dump(mode="json")
    except PydanticSerializationError:  # a field of a type pydantic cannot write as JSON
        raise _unstorable(what, model) from None
    _refuse_unstorable(what, dumped)  # bytes holding a NUL, say
    text = json.dumps(dumped)
    return check_stored_form(what, text, _AS_STORED.decode(text))  # its floats as stored


def _default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return _model_jsonable("value", value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


Path = tuple[str | int, ...]


def unstorable(value: Any, *, foreign_ok: bool = False) -> tuple[Path, str] | None:
    """Where and why `value` cannot be stored as JSON, e.g. (("when",), "a datetime"), or None
    when it can. `foreign_ok`: ignore values of other types (a serialiser of its own, such as
    pydantic's, turns them into JSON); floats and strings are still checked."""
    if value is None or isinstance(value, bool | int):
        return None
    if isinstance(value, str):
        return ((), "a string with a NUL character") if "\x00" in value else None
    if isinstance(value, float):
        return None if math.isfinite(value) else ((), f"the float {value!r}")
    if isinstance(value, BaseModel):
        return unstorable(value.model_dump(), foreign_ok=True)
    items: Any
    if isinstance(value, dict):
        for key in value:
            if isinstance(key, str) and "\x00" in key:
                return (key,), "a key with a NUL character"
            if not foreign_ok and not (key is None or isinstance(key, str | int | float | bool)):
                return (str(key),), f"a key of type {type(key).__name__}"
        items = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    elif foreign_ok:
        return None
    else:
        return (), f"a {type(value).__name__}"
    for where, item in items:
        found = unstorable(item, foreign_ok=foreign_ok)
        if found is not None:
            return (where, *found[0]), found[1]
    return None


def _refuse_unstorable(what: str, value: Any) -> None:
    if unstorable(value) is not None:
        raise _unstorable(what, value)


def _unstorable(what: str, value: Any) -> UnstorableValueError:
    path, why = unstorable(value) or ((), f"a {type(value).__name__}")
    where = " at " + "".join(f"[{p!r}]" for p in path) if path else ""
    return UnstorableValueError(
        f"{what} cannot be stored as JSON: it holds {why}{where} (JSON holds null, booleans, "
        "finite numbers, strings without NUL, lists and objects with string keys)"
    )


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def input_hash(value: Any, what: str = "the input") -> str:
    """The digest idempotency keys compare, of the canonical JSON the bounds are measured on:
    UnstorableValueError past MAX_JSON_DEPTH or MAX_PAYLOAD_BYTES."""
    try:
        text = canonical_json(value)
    except RecursionError:
        raise too_deep(what) from None
    check_depth(what, text, value)
    data = text.encode()
    if len(data) > UNMEASURED_BYTES:
        check_size(what, len(data))
    return hashlib.sha256(data).hexdigest()


def encode_error(exc: BaseException) -> dict[str, str]:
    """The stored form of an error: shown in the admin and by `manage.py tasks inspect`.

    Secrets are redacted as in the logs (`secrets.redact_text`), and NUL characters, which
    PostgreSQL's jsonb refuses (the row would fail to store), become U+FFFD.
    """
    from .secrets import redact_text

    cls = type(exc)
    message = str(exc).replace("\x00", "\ufffd")
    trace = "".join(traceback.format_exception(exc)).replace("\x00", "\ufffd")
    return {
        "type": f"{cls.__module__}.{cls.__qualname__}",
        "message": redact_text(message),
        "traceback": redact_text(trace),
    }


def rebuild_error(error: dict[str, Any]) -> BaseException:
    """The original exception class when it can be rebuilt from its path and message."""
    path, message = error.get("type", ""), error.get("message", "")
    module_name, _, qualname = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), qualname)
        if isinstance(cls, type) and issubclass(cls, Exception):
            exc = cls(message)
            if str(exc) == message:
                return exc
    except Exception:  # noqa: BLE001 - any failure means "cannot rebuild"
        pass
    return StepFailedError(message)


# Made once: json.dumps with any argument builds an encoder a call.
_ENCODE = json.JSONEncoder(allow_nan=False).encode
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode


def plain_stored(value: Any) -> tuple[Any, str, str] | None:
    """(stored form, canonical JSON text, input hash) of a value made of JSON's own types, in
    one pass: what `to_jsonable` and `input_hash` answer for it. None for anything else (a
    type with no JSON form, NaN, a NUL character, a value near the depth or size bounds):
    the caller then takes the full checks, which name what is wrong."""
    try:
        text = _ENCODE(value)
    except (TypeError, ValueError, RecursionError):
        return None
    if (
        len(text) > UNMEASURED_BYTES
        or "\\u0000" in text
        or (len(text) > MAX_JSON_DEPTH and text.count("[") + text.count("{") > MAX_JSON_DEPTH)
    ):
        return None
    stored = _AS_STORED.decode(text)
    canonical = _CANONICAL(stored)
    try:
        data = canonical.encode()
    except UnicodeEncodeError:  # a lone surrogate: input_hash says so
        return None
    if len(data) > UNMEASURED_BYTES:
        return None
    return stored, canonical, hashlib.sha256(data).hexdigest()
