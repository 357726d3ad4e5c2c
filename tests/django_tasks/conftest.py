from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import override_settings

from . import config


@pytest.fixture(autouse=True)
def _ported_tasks_settings() -> Iterator[None]:
    """Every ported test sees the TASKS its workers start with (config.py)."""
    with override_settings(TASKS=config.TASKS):
        yield
