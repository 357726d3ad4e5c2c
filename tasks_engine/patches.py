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

from typing import TYPE_CHECKING, Any

from .states import StepKind, StepStatus

if TYPE_CHECKING:
    from .context import Attempt, RunState, StepRecord, TaskContext

PATCH_PREFIX = "patch:"


def passed_steps(state: RunState) -> list[str]:
    """Recorded steps (not markers) this pass has not reached yet, in recorded order. A record
    without replayable attempts (all set aside by an operator's retry) does not count."""
    return [
        key
        for key, rec in state.history.items()
        if key not in state.seen and rec.kind != StepKind.PATCH and rec.attempts
    ]


class PatchSteps:
    _ctx: TaskContext
    _s: RunState

    if TYPE_CHECKING:

        def _key(self, name: str) -> str: ...
        def _record(self, key: str, kind: str) -> StepRecord | None: ...
        def _start(self, key: str, kind: str, attempt_no: int, **fields: Any) -> int: ...
        def _remember(self, key: str, kind: str, attempt: Attempt) -> None: ...

    def patched(self, change_id: str) -> bool:
        if not isinstance(change_id, str) or not change_id or "#" in change_id:
            raise ValueError(f"invalid change id {change_id!r} (a non-empty string, no '#')")
        answer = self._s.patches.get(change_id)
        if answer is not None:
            return answer
        key = self._key(PATCH_PREFIX + change_id)
        if self._record(key, StepKind.PATCH) is not None:
            answer = True
        elif passed_steps(self._s):
            answer = False
        else:
            self._mark(key)
            answer = True
        self._s.patches[change_id] = answer
        return answer

    def _mark(self, key: str) -> None:
        from .context import Attempt

        output = {"patched": True}
        step_id = self._start(key, StepKind.PATCH, 1, status=StepStatus.COMPLETED, output=output)
        attempt = Attempt(step_id, StepStatus.COMPLETED, self._s.run_pass, True, output, None, None)
        self._remember(key, StepKind.PATCH, attempt)
