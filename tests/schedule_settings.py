"""Settings for process tests of schedules: the test settings plus TASKS_ENGINE["SCHEDULES"]
from the environment (JSON in TEST_SCHEDULES), so real workers fire the test's schedules and
no other test's workers fire any."""

import json
import os

from tests.settings import *  # noqa: F403

TASKS_ENGINE = {
    **TASKS_ENGINE,  # noqa: F405
    "SCHEDULES": json.loads(os.environ.get("TEST_SCHEDULES", "{}")),
}
