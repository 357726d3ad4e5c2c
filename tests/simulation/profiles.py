"""Hypothesis settings of the simulation, chosen by `HYPOTHESIS_PROFILE` (default `ci`).

- `ci`: what `make test` runs on each database, derandomized, 150 examples, about 20 s
  (`SIM_EXAMPLES` overrides).
- `long`: what `make simulate` runs: `SIM_EXAMPLES` examples (default 20,000); failing
  examples are kept under /tmp/umt-sim-examples and replayed first on the next run.
- `dev`: a quick look while editing (20 examples).

`SIM_SHRINK=0` runs any of them without shrinking (see `selected`).

A failure prints the shrunk rule sequence (the reproduction) and a `@reproduce_failure` blob;
`--hypothesis-seed=N` makes the whole search repeatable.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase

EXAMPLES_DIR = "/tmp/umt-sim-examples"
_BASE = settings(
    deadline=None,
    print_blob=True,
    derandomize=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def _examples(default: int) -> int:
    return int(os.environ.get("SIM_EXAMPLES", default))


# Derandomized: `make test` (and CI) explores the same examples every run, so a red build
# always means a change broke something; `make simulate` searches at random.
settings.register_profile(
    "sim-ci",
    max_examples=_examples(150),
    stateful_step_count=40,
    database=None,
    derandomize=True,
    parent=_BASE,
)
settings.register_profile(
    "sim-long",
    max_examples=_examples(20_000),
    stateful_step_count=60,
    database=DirectoryBasedExampleDatabase(EXAMPLES_DIR),
    parent=_BASE,
)
settings.register_profile(
    "sim-dev", max_examples=_examples(20), stateful_step_count=40, database=None, parent=_BASE
)


def selected() -> settings:
    """The profile; `SIM_SHRINK=0` leaves the shrinking out (to see an injected defect fail
    the profile, defects.py, without minutes of shrinking its first failure)."""
    name = os.environ.get("HYPOTHESIS_PROFILE", "ci")
    chosen = settings.get_profile(name if name.startswith("sim-") else f"sim-{name}")
    if os.environ.get("SIM_SHRINK", "1") == "0":
        return settings(chosen, phases=[p for p in chosen.phases if p != Phase.shrink])
    return chosen


def timeout_seconds() -> int:
    """pytest-timeout for the simulation test: none for the long run, generous otherwise (a
    hang is caught sooner: an attempt that does not reach its next stop in 30 s fails)."""
    return 0 if selected().max_examples > 1000 else 1800
