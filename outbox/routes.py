"""The route registry: one handler per event type, declared with `@route` in
`<app>/outbox_routes.py` and discovered at startup. Import-safe before apps load."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from .models import OutboxEvent

Handler = Callable[["OutboxEvent"], Any]
H = TypeVar("H", bound=Handler)


@dataclass(frozen=True)
class Route:
    type: str
    handler: Handler
    where: str  # "module.qualname (file:line)", for error messages


class RouteRegistry:
    def __init__(self) -> None:
        self._routes: dict[str, Route] = {}

    def register(self, type: str, handler: Handler) -> Route:
        if not isinstance(type, str) or not type:
            raise ImproperlyConfigured(f"an outbox route needs a non-empty type, got {type!r}")
        new = Route(type, handler, _where(handler))
        old = self._routes.get(type)
        # The same function seen again (a module imported twice) is not a second route.
        if old is not None and old.where != new.where:
            raise ImproperlyConfigured(
                f"outbox event type {type!r} has two routes: {old.where} and {new.where}"
            )
        self._routes[type] = new
        return new

    def unregister(self, type: str) -> None:
        self._routes.pop(type, None)

    def get(self, type: str) -> Route | None:
        return self._routes.get(type)

    def types(self) -> list[str]:
        return sorted(self._routes)


registry = RouteRegistry()


def route(type: str) -> Callable[[H], H]:
    """Register the decorated function as the handler of events of `type`.

    It gets the `OutboxEvent` (`event.attempts` already counts this attempt) and runs inside
    the relay's transaction, in a savepoint: its database writes commit with the event's
    `dispatched` status, and an exception rolls back only its own writes. Keep it short (a few
    writes, an `enqueue`): the batch's row locks are held until every route of it returns.
    """

    def decorate(handler: H) -> H:
        registry.register(type, handler)
        return handler

    return decorate


def _where(handler: Handler) -> str:
    name = f"{getattr(handler, '__module__', '?')}.{getattr(handler, '__qualname__', handler)!s}"
    try:
        code = inspect.unwrap(handler).__code__  # type: ignore[attr-defined]
        return f"{name} ({code.co_filename}:{code.co_firstlineno})"
    except AttributeError:
        return name
