"""Settings of the workers the ported tests start: the test settings with their TASKS."""

from tests.settings import *  # noqa: F403

from .config import TASKS  # noqa: F401
