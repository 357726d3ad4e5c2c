"""@route: discovery from <app>/outbox_routes.py, one route per type."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.exceptions import ImproperlyConfigured

from outbox import route
from outbox.routes import RouteRegistry, registry

pytestmark = pytest.mark.one_db("route discovery")

DUP = "test.registered_twice"


@pytest.fixture
def cleanup() -> Iterator[None]:
    yield
    registry.unregister(DUP)


def test_routes_are_discovered_from_installed_apps() -> None:
    found = registry.get("test.record")
    assert found is not None
    assert found.handler.__module__ == "tests.testapp.outbox_routes"
    assert {"test.enqueue_noop", "test.always_fails"} <= set(registry.types())


def test_second_route_for_a_type_names_both_places(cleanup: None) -> None:
    @route(DUP)
    def first(event: object) -> None: ...

    with pytest.raises(ImproperlyConfigured) as info:

        @route(DUP)
        def second(event: object) -> None: ...

    message = str(info.value)
    assert DUP in message
    assert "first" in message and "second" in message
    assert message.count("test_outbox_routes.py:") == 2  # file and line of each
    assert registry.get(DUP).handler is first  # type: ignore[union-attr]


def test_the_same_function_registered_again_is_not_a_conflict() -> None:
    local = RouteRegistry()

    def handler(event: object) -> None: ...

    local.register("t", handler)
    local.register("t", handler)
    assert local.types() == ["t"]


@pytest.mark.parametrize("bad", ["", None, 3])
def test_route_type_must_be_a_non_empty_string(bad: object) -> None:
    with pytest.raises(ImproperlyConfigured):
        RouteRegistry().register(bad, lambda event: None)  # type: ignore[arg-type]
