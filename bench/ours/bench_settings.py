"""Settings of our engine's benchmark processes (driver and workers): the test settings plus
`bench_jobs`, whose workflow records when its job starts. Kept out of the engine's tree so
that a baseline checkout (run_all.py --baseline) runs the same jobs."""

from tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "bench_jobs"]  # noqa: F405
