"""structlog, configured once: console lines in a terminal, JSON otherwise, secrets redacted
by `redact_secrets` (the rules: values/secrets.py)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

import structlog

from ..values.secrets import redact_mapping
from .tracing import run_trace_id

_configured = False


def redact_secrets(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> Mapping[str, Any]:
    """structlog processor: redact secrets in every value of the event (see module docstring).

    An exception still to be rendered (`exc_info`: a chain without `format_exc_info` before
    this processor, such as a host's ending in a renderer that prints tracebacks itself) is
    formatted here first, so that its message and traceback are redacted too."""
    if "exc_info" in event_dict:
        event_dict = structlog.processors.format_exc_info(_logger, _method, event_dict)
    return redact_mapping(event_dict)


def configure(force: bool = False) -> None:
    """Configure structlog for the engine, unless the host project owns logging.

    The host owns it when structlog is already configured (`structlog.is_configured()`: the
    host called `structlog.configure` in its settings or before `django.setup()`), or when
    `TASKS_ENGINE["CONFIGURE_LOGGING"]` is False. Then the host's configuration is left exactly
    as it is, and the engine's own loggers still redact secrets (`get_logger`). `force=True`
    (tests) configures it whatever the host did.
    """
    global _configured
    if _configured and not force:
        return
    _configured = True
    if not force and (structlog.is_configured() or not _configure_logging_setting()):
        return
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
        # One write per line: print() writes the line and its newline separately, and the
        # children of `runworker --processes N` share one stderr, so two lines could fuse.
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def _configure_logging_setting() -> bool:
    from ..conf import engine_settings

    try:
        return engine_settings().configure_logging
    except (TypeError, ValueError):  # an invalid TASKS_ENGINE: manage.py check reports it
        return True


def get_logger(**bind: Any) -> Any:
    """The engine's logger. Under a structlog configuration without `redact_secrets` (the
    host's own), the engine's events go through the host's processors with `redact_secrets`
    inserted before the last one (the renderer), so secrets never reach the host's logs."""
    configure()
    processors = structlog.get_config()["processors"]
    if redact_secrets in processors:
        return structlog.get_logger("tasks_engine").bind(**bind)
    chain = [*processors[:-1], redact_secrets, *processors[-1:]]
    return structlog.wrap_logger(
        None, processors=chain, logger_factory_args=("tasks_engine",)
    ).bind(**bind)


def run_logger(run: Any) -> Any:
    trace_id = run_trace_id(run.trace_id, run.pk)
    return get_logger(
        run_id=str(run.pk), task=run.task_name, version=run.version, trace_id=trace_id
    )
