"""JSON in and out of the store: canonical input hashing, step results, errors."""

from __future__ import annotations

import hashlib
import importlib
import json
import traceback
from typing import Any

from pydantic import BaseModel

from .exceptions import StepFailedError


def to_jsonable(value: Any) -> Any:
    """The JSON-decoded form of `value`: what replay will return. Pydantic models dump as JSON."""
    if value is None or type(value) in (str, int, bool):
        return value  # already its own JSON-decoded form (the common case for a step)
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    try:
        return json.loads(json.dumps(value, default=_default))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"step results must be JSON-serialisable: {exc}") from exc


def _default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def input_hash(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def encode_error(exc: BaseException) -> dict[str, str]:
    cls = type(exc)
    return {
        "type": f"{cls.__module__}.{cls.__qualname__}",
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
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
