"""A run's replay history: the step attempts it recorded, and where this pass's replay is.

Data only (no lease, no writes): the step API reads it to replay and adds to it as it
records; the executor reads what the pass left unreached; `replay-check` builds one from
stored rows without a worker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..exceptions import NonDeterminismError
from ..models import Fact, StepAttempt, WorkflowRun
from ..states import StepKind, StepStatus

# The error of a give-up row: the failed attempt a step records, without calling its body, when
# every attempt its retry policy allowed was interrupted (step_api.py). It says why the step failed
# but is no attempt that ran. Rows written before the key existed are known by their message.
GAVE_UP = "gave_up"
_LEGACY_GIVE_UP = re.compile(  # the message: f"step {key!r} was interrupted ..."
    r"""step ('.*'|".*") was interrupted \d+ times without finishing""", re.DOTALL
)


# The longest step key (StepAttempt.name). A sleep's key also goes into the run's `waiting_on`
# after "sleep:", so it is shorter; a fact wait's name is a fact's name.
STEP_KEY_LONGEST: int = StepAttempt._meta.get_field("name").max_length  # type: ignore[assignment]
SLEEP_KEY_LONGEST: int = (
    WorkflowRun._meta.get_field("waiting_on").max_length - len("sleep:")  # type: ignore[operator]
)
FACT_NAME_LONGEST: int = Fact._meta.get_field("name").max_length  # type: ignore[assignment]


@dataclass
class Attempt:
    id: int
    status: str
    run_pass: int
    counted: bool
    output: Any
    error: dict[str, Any] | None
    wake_at: datetime | None


@dataclass
class StepRecord:
    name: str
    kind: str
    attempts: list[Attempt] = field(default_factory=list)
    superseded: int = 0  # attempts an operator's retry from an earlier step set aside

    @property
    def next_attempt(self) -> int:
        return self.superseded + len(self.attempts) + 1

    @property
    def completed(self) -> Attempt | None:
        return next((a for a in self.attempts if a.status == StepStatus.COMPLETED), None)

    @property
    def armed(self) -> Attempt | None:
        """A timer or wait that was started and not yet resolved."""
        return next((a for a in self.attempts if a.status == StepStatus.RUNNING), None)

    def counted_failures(self, run_pass: int) -> int:
        return sum(
            1
            for a in self.attempts
            if a.run_pass == run_pass
            and (a.status == StepStatus.FAILED or (a.status == StepStatus.ABANDONED and a.counted))
        )

    def terminal_error(self, run_pass: int) -> dict[str, Any] | None:
        for a in reversed(self.attempts):
            if a.run_pass == run_pass and a.status == StepStatus.FAILED and a.error:
                return a.error if a.error.get("terminal") else None
        return None


@dataclass
class ReplayHistory:
    """The recorded steps by key (`name`, then `name#2`, ...) and this pass's cursor: the keys
    it has reached so far and how often each name was called."""

    records: dict[str, StepRecord]
    run_pass: int
    attempts_made: int = 0  # step attempts recorded so far, this pass's included
    seen: set[str] = field(default_factory=set)
    name_counts: dict[str, int] = field(default_factory=dict)
    patches: dict[str, bool] = field(default_factory=dict)  # ctx.patched() answers this pass

    def next_key(self, name: str, longest: int = STEP_KEY_LONGEST) -> str:
        """The key of this call of step `name` (its n-th call is `name#n`), marked reached.
        ValueError, nothing marked, for a name whose key the step's rows cannot hold (longer
        than `longest`, a NUL character): PostgreSQL would refuse its first write, an outage
        the run would meet again on every replay, and SQLite would store it."""
        if not name or "#" in name:
            raise ValueError(f"invalid step name {name!r} (non-empty, no '#')")
        if "\x00" in name:
            raise ValueError(f"invalid step name {name!r} (no NUL character)")
        n = self.name_counts.get(name, 0) + 1
        key = name if n == 1 else f"{name}#{n}"
        if len(key) > longest:
            raise ValueError(
                f"step name {name[:40]!r}... is too long: its key {key[:40]!r}... is"
                f" {len(key)} characters, at most {longest}"
            )
        self.name_counts[name] = n
        self.seen.add(key)
        return key

    def record(self, key: str, kind: str) -> StepRecord | None:
        """The record of `key`; NonDeterminismError if it was recorded as another kind."""
        rec = self.records.get(key)
        if rec is not None and rec.attempts and rec.kind != kind:
            raise NonDeterminismError(
                f"step {key!r} was recorded as {str(rec.kind)!r}"  # a StepKind: its value
                f" but replay called it as {str(kind)!r}"
            )
        return rec

    def remember(self, key: str, kind: str, attempt: Attempt) -> None:
        rec = self.records.setdefault(key, StepRecord(key, kind))
        if not rec.attempts:
            rec.kind = kind  # only superseded attempts before: the step may be of a new kind
        rec.attempts.append(attempt)

    def passed(self, before: str | None = None) -> list[str]:
        """Recorded steps (not markers) this pass has not reached yet, in recorded order. A
        record without replayable attempts (all set aside by an operator's retry) does not
        count. With `before`, only the steps recorded before step `before` (its record's
        place: a history's records are in the order of their first attempts): the steps a
        pass that reached `before` went past, when `before` is recorded."""
        found = []
        for key, rec in self.records.items():
            if key == before:
                break
            if key not in self.seen and rec.kind != StepKind.PATCH and rec.attempts:
                found.append(key)
        return found

    def unreached(self) -> list[str]:
        """Completed steps (not markers) this pass never reached: renamed or removed steps.
        The completed ones among `passed()`, which replay-check reports before a deploy."""
        return sorted(key for key in self.passed() if self.records[key].completed is not None)


def is_give_up(error: dict[str, Any] | None) -> bool:
    """Whether a step attempt's stored error is that of a give-up row (see GAVE_UP)."""
    if not isinstance(error, dict) or not error.get("terminal"):
        return False
    if error.get(GAVE_UP) is True:
        return True
    return error.get("type") == "tasks_engine.exceptions.StepFailedError" and bool(
        _LEGACY_GIVE_UP.fullmatch(str(error.get("message", "")))
    )


def load_history(run_id: Any) -> tuple[dict[str, StepRecord], int]:
    """The run's recorded steps, and how many attempts it recorded (superseded ones too)."""
    history: dict[str, StepRecord] = {}
    count = 0
    rows = (
        StepAttempt.objects.filter(run_id=run_id)
        .order_by("id")
        .values_list(
            "id",
            "name",
            "kind",
            "status",
            "run_pass",
            "counted",
            "output",
            "error",
            "wake_at",
            "superseded",
        )
    )
    for sid, name, kind, status, run_pass, counted, output, error, wake_at, superseded in rows:
        count += 1
        rec = history.setdefault(name, StepRecord(name, kind))
        if superseded:  # retried from an earlier step: history only, but it keeps its number
            rec.superseded += 1
            continue
        if not rec.attempts:
            rec.kind = kind
        rec.attempts.append(Attempt(sid, status, run_pass, counted, output, error, wake_at))
    return history, count
