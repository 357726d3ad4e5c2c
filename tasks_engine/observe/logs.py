"""The engine's events: structlog through the standard library's logging, secrets redacted by
`redact_secrets` (the rules: values/secrets.py).

Each event is a `logging` record of the `tasks_engine` logger, so Django's `LOGGING` routes,
filters and formats it like any other. Its message is the event as a dict (`EventDict`) that a
`structlog.stdlib.ProcessorFormatter` renders and that any other formatter prints as one JSON
object. When nothing would print the engine's records (no handler on `tasks_engine` or above
it: a project that configures no logging), the engine adds its own stderr handler: JSON lines,
coloured console lines in a terminal. `TASKS_ENGINE["LOG_JSON_TO_STDERR"] = True` prints them
as JSON lines on stderr whatever `LOGGING` says (docs/logging.md)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

import structlog

from ..values.secrets import redact_mapping
from .tracing import run_trace_id

LOGGER_NAME = "tasks_engine"
_configured = False
_json = structlog.processors.JSONRenderer()


class EventDict(dict[str, Any]):
    """An engine event as a log record's message: `ProcessorFormatter` takes the dict; a plain
    formatter (`%(message)s`) prints `str()` of it, the event as one JSON object."""

    def __str__(self) -> str:
        return str(_json(None, "", dict(self)))


def wrap_for_formatter(
    logger: Any, method: str, event_dict: MutableMapping[str, Any]
) -> tuple[tuple[EventDict], dict[str, Any]]:
    """The chain's last processor: `ProcessorFormatter.wrap_for_formatter` with the event as an
    `EventDict`, so that it reads as JSON under any formatter."""
    return (EventDict(event_dict),), {"extra": {"_logger": logger, "_name": method}}


class JSONFormatter(structlog.stdlib.ProcessorFormatter):
    """The engine's events (and any other record) as one JSON object per line: `event`,
    `level`, `logger`, `timestamp` and the event's fields. For Django's `LOGGING`:
    `"formatters": {"json": {"()": "tasks_engine.observe.logs.JSONFormatter"}}`."""

    def __init__(self, renderer: Any = None, **kwargs: Any) -> None:
        super().__init__(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                renderer or structlog.processors.JSONRenderer(),
            ],
            foreign_pre_chain=[
                structlog.stdlib.add_logger_name,
                structlog.stdlib.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                structlog.processors.format_exc_info,
                redact_secrets,
            ],
            **kwargs,
        )


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The engine's own handler: one write per line on stderr (the children of `runworker
    --processes N` share it, and a line written in two parts could fuse with a sibling's)."""

    def __init__(self, json: bool | None = None) -> None:
        super().__init__(sys.stderr)
        terminal = json is None and sys.stderr.isatty()
        renderer = structlog.dev.ConsoleRenderer(colors=True) if terminal else None
        self.setFormatter(JSONFormatter(renderer))


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
    """Configure structlog for the engine, unless the host project owns it, and make sure the
    engine's records reach an output.

    The host owns structlog when it is already configured (`structlog.is_configured()`: the
    host called `structlog.configure` in its settings or before `django.setup()`), or when
    `TASKS_ENGINE["CONFIGURE_LOGGING"]` is False. Then the host's configuration is left exactly
    as it is, and the engine's own loggers still redact secrets (`get_logger`). `force=True`
    (tests) configures it whatever the host did, and adds the engine's stderr handler.
    """
    global _configured
    if _configured and not force:
        return
    _configured = True
    if not force and (structlog.is_configured() or not _setting("configure_logging", True)):
        return
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,  # before the work of redacting a dropped event
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.add_logger_name,
            structlog.stdlib.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact_secrets,
            wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    _give_the_engine_an_output(force)


def _give_the_engine_an_output(force: bool) -> None:
    """INFO and up unless `LOGGING` sets the `tasks_engine` logger's level; the engine's stderr
    handler when nothing would print its records, or when LOG_JSON_TO_STDERR asks for it (then
    they no longer propagate to the project's handlers: one line per event)."""
    logger = logging.getLogger(LOGGER_NAME)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    for handler in [h for h in logger.handlers if isinstance(h, StderrHandler)]:
        logger.removeHandler(handler)  # configure(force=True) again: one handler, not two
    if _setting("log_json_to_stderr", False):
        logger.addHandler(StderrHandler(json=True))
        logger.propagate = False
    elif force or not logger.hasHandlers():
        logger.addHandler(StderrHandler())


def _setting(name: str, default: bool) -> bool:
    from ..conf import engine_settings

    try:
        return bool(getattr(engine_settings(), name))
    except (TypeError, ValueError):  # an invalid TASKS_ENGINE: manage.py check reports it
        return default


def get_logger(**bind: Any) -> Any:
    """The engine's logger. Under a structlog configuration without `redact_secrets` (the
    host's own), the engine's events go through the host's processors with `redact_secrets`
    inserted before the last one (the renderer), so secrets never reach the host's logs."""
    configure()
    processors = structlog.get_config()["processors"]
    if redact_secrets in processors:
        return structlog.get_logger(LOGGER_NAME).bind(**bind)
    chain = [*processors[:-1], redact_secrets, *processors[-1:]]
    return structlog.wrap_logger(None, processors=chain, logger_factory_args=(LOGGER_NAME,)).bind(
        **bind
    )


def run_logger(run: Any) -> Any:
    trace_id = run_trace_id(run.trace_id, run.pk)
    return get_logger(
        run_id=str(run.pk), task=run.task_name, version=run.version, trace_id=trace_id
    )
