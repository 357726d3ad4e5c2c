"""argparse types for management commands (the engine's, the outbox's, UMT's): a bad value
fails with a one-line error before anything is written."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from typing import Any

from ..values.serialization import TOO_DEEP
from ..values.text import check_text


def _number[N: (int, float)](
    value: str, parse: Callable[[str], N], ok: Callable[[N], bool], what: str
) -> N:
    """`value` parsed and checked, or an argparse error that says what was expected."""
    try:
        n = parse(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {value!r}") from None
    if not ok(n):
        raise argparse.ArgumentTypeError(f"must be {what}, got {value!r}")
    return n


def positive_int(value: str) -> int:
    return _number(value, int, lambda n: n >= 1, "a positive integer")


def ahead_periods(value: str) -> int:
    return _number(value, int, lambda n: 0 <= n <= 24, "an integer from 0 to 24")


def non_negative_int(value: str) -> int:
    return _number(value, int, lambda n: n >= 0, "an integer >= 0")


def positive_float(value: str) -> float:
    return _number(value, float, lambda f: math.isfinite(f) and f > 0, "a positive number")


def non_negative_float(value: str) -> float:
    return _number(value, float, lambda f: math.isfinite(f) and f >= 0, "a number >= 0")


def retention_days(value: str) -> float:
    """An age in days a prune can count back from now (conf.MAX_RETENTION_DAYS)."""
    from ..conf import MAX_RETENTION_DAYS as most

    return _number(value, float, lambda f: 0 <= f <= most, f"a number of days from 0 to {most}")


def port_number(value: str) -> int:
    return _number(value, int, lambda n: 1 <= n <= 65535, "a TCP port (1-65535)")


def json_value(value: str) -> Any:
    """Standard JSON only: Python's parser also takes NaN and Infinity, which JSON has not."""
    try:
        return json.loads(value, parse_constant=_not_json)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"malformed JSON: {exc}") from None
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"malformed JSON: {exc}") from None
    except RecursionError:
        raise argparse.ArgumentTypeError(f"malformed JSON: {TOO_DEEP}") from None


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not standard JSON")


def queue_name(value: str) -> str:
    """A queue a run can have (WorkflowRun.queue: 1 to 100 characters, no NUL): a worker
    told to serve another would serve nothing. A usage error otherwise."""
    from ..definitions import QUEUE_MAX_LENGTH

    try:
        check_text("queue", value, QUEUE_MAX_LENGTH)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def task_ref(value: str) -> tuple[str, int]:
    name, sep, version = value.rpartition("@")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME@VERSION, got {value!r}")
    try:
        v = int(version)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME@VERSION, got {value!r}") from None
    return name, v


class OneLineErrors:
    """Mixin for commands: argument errors print one line on stderr and exit 2."""

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> Any:
        parser = super().create_parser(prog_name, subcommand, **kwargs)  # type: ignore[misc]
        _one_line(parser)
        return parser


def _one_line(parser: argparse.ArgumentParser) -> None:
    import sys

    def error(message: str) -> Any:
        sys.stderr.write(f"{parser.prog}: error: {message}\n")
        sys.exit(2)

    parser.error = error  # type: ignore[method-assign]
