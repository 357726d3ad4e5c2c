"""argparse types shared by the engine's commands: bad values fail before anything is written."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any


def positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}")
    return n


def non_negative_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {value!r}")
    return n


def positive_float(value: str) -> float:
    try:
        f = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {value!r}") from None
    if not math.isfinite(f) or f <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {value!r}")
    return f


def non_negative_float(value: str) -> float:
    try:
        f = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {value!r}") from None
    if not math.isfinite(f) or f < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {value!r}")
    return f


def json_value(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"malformed JSON: {exc}") from None


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
