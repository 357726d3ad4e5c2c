"""structlog, configured once: console lines in a terminal, JSON otherwise, secrets redacted."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

import structlog

SECRET_KEY = re.compile(r"pass(key|word)?|token|secret|api[_-]?key|authorization|cookie", re.I)
URL_QUERY_VALUE = re.compile(r"([?&][^=&\s#]+=)[^&\s#]+")
REDACTED = "[redacted]"
_configured = False


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return URL_QUERY_VALUE.sub(lambda m: m.group(1) + REDACTED, value)
    if isinstance(value, dict):
        return {
            k: REDACTED if SECRET_KEY.search(str(k)) else _redact_value(v) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_redact_value(v) for v in value]
    return value


def redact_secrets(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> Mapping[str, Any]:
    return {
        key: REDACTED if SECRET_KEY.search(key) else _redact_value(value)
        for key, value in event_dict.items()
    }


def configure(force: bool = False) -> None:
    global _configured
    if _configured and not force:
        return
    _configured = True
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=True)
        if sys.stderr.isatty()
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact_secrets,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def get_logger(**bind: Any) -> Any:
    configure()
    return structlog.get_logger("tasks_engine").bind(**bind)


def run_logger(run: Any) -> Any:
    return get_logger(
        run_id=str(run.pk), task=run.task_name, version=run.version, trace_id=run.trace_id
    )
