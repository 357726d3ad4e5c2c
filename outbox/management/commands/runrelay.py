"""manage.py runrelay: dispatch outbox events to their routes."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from outbox.relay import Relay, RelayConfig
from tasks_engine.management.cli import OneLineErrors, positive_float, positive_int


class Command(OneLineErrors, BaseCommand):
    help = "Run the outbox relay: hand due events to their routes, exactly once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--batch",
            type=positive_int,
            default=100,
            help="events claimed and dispatched per transaction (default: %(default)r)",
        )
        parser.add_argument(
            "--poll-interval",
            type=positive_float,
            default=1.0,
            help="seconds between polls when idle; on PostgreSQL NOTIFY wakes "
            "the relay sooner (default: %(default)r)",
        )
        parser.add_argument(
            "--burst", action="store_true", help="exit 0 once no due pending event remains"
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        config = RelayConfig(
            batch=opts["batch"], poll_interval=opts["poll_interval"], burst=opts["burst"]
        )
        code = Relay(config).run()
        if code:
            raise SystemExit(code)
