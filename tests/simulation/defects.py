"""Known engine defects the simulation steps around until they are fixed.

Each entry turns off the rule (or the part of a rule) that reaches the defect, so the rest of
the simulation keeps finding new ones. Remove an entry when its fix lands; the simulation then
checks that case again. `SIM_KNOWN_DEFECTS` overrides the list for one run: a comma-separated
list, or `none` to check everything (`SIM_KNOWN_DEFECTS=none make simulate`).
"""

from __future__ import annotations

import os

# Every defect the simulation was built to catch is fixed; so are the ones it found (see the
# regression tests in tests/test_promises.py, tests/test_claim.py and
# tests/test_hot_path_faults.py). Add an entry here only with an open issue for it.
KNOWN_DEFECTS: frozenset[str] = frozenset()


def known_defects() -> frozenset[str]:
    raw = os.environ.get("SIM_KNOWN_DEFECTS")
    if raw is None:
        return KNOWN_DEFECTS
    if raw.strip().lower() in ("", "none"):
        return frozenset()
    return frozenset(part.strip() for part in raw.split(",") if part.strip())


DEFECTS = known_defects()


def known(name: str) -> bool:
    """Whether the simulation should still step around defect `name`."""
    return name in DEFECTS
