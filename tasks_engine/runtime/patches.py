"""`ctx.patched(change_id)`: change a deployed workflow in place without breaking runs mid-way.

A run that reaches the call with new code records a marker, a step attempt of kind `patch`
named `patch:<id>`, completed at once and fenced like any step write, and takes the new path.
A replay takes the new path when its history holds the marker. A history that already went
past this point without one was made by the old code: it takes the old path.

"Went past this point" is read from the history itself, as Temporal's replayer reads it from
its event log: when the call is reached, every step this pass replayed so far has been marked
seen; a recorded step that is not (a step the old code ran after this point, in this pass or
an earlier one) means the old code passed here. Markers are left out of that test, so that
removing a retired `patched` call does not flip another one (temporalio/sdk-rust#535).
The answer is memoized per pass and depends only on the recorded history, so every replay,
on any worker, after any restart, gives the same one.
"""

from __future__ import annotations

from ..states import StepKind, StepStatus
from .history import STEP_KEY_LONGEST, Attempt
from .step_base import StepBase

PATCH_PREFIX = "patch:"


class PatchSteps(StepBase):
    def patched(self, change_id: str) -> bool:
        if (
            not isinstance(change_id, str)
            or not change_id
            or "#" in change_id
            or "\x00" in change_id
            or len(PATCH_PREFIX + change_id) > STEP_KEY_LONGEST  # its marker's step key
        ):
            raise ValueError(
                f"invalid change id {change_id!r} (a non-empty string of at most"
                f" {STEP_KEY_LONGEST - len(PATCH_PREFIX)} characters, no '#', no NUL)"
            )
        answers = self._s.history.patches
        answer = answers.get(change_id)
        if answer is not None:
            return answer
        key = self._key(PATCH_PREFIX + change_id)
        if self._record(key, StepKind.PATCH) is not None:
            answer = True
        elif self._s.history.passed():
            answer = False
        else:
            self._mark(key)
            answer = True
        answers[change_id] = answer
        return answer

    def _mark(self, key: str) -> None:
        output = {"patched": True}
        step_id = self._start(key, StepKind.PATCH, 1, status=StepStatus.COMPLETED, output=output)
        attempt = Attempt(step_id, StepStatus.COMPLETED, self._s.run_pass, True, output, None, None)
        self._remember(key, StepKind.PATCH, attempt)
