"""`manage.py tasks replay-check`: replay the history of every unfinished run against the code
now deployed, executing no step and writing nothing, and list the runs that no longer match.

Each handler runs with a replay-only step API: a recorded step returns its stored result (or
raises its stored terminal error), and the first step that has no outcome in the history ends
the replay, the point where a worker would go on. Problems: a step called as another kind
than it was recorded; a new step reached while recorded steps were not (a step renamed,
removed or moved); the recorded step where the worker would go on (a run parked on a wait, a
step to retry) reached while steps recorded before it were not (one removed, renamed or
moved before it: the worker would complete with them unreached); a handler that returns
without reaching recorded steps; input the model no longer accepts; an unknown task or
version. Histories are read in batches (one query for
the runs, one for their steps, one for their op results per batch).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

from pydantic import ValidationError

from .. import transitions
from ..db.alias import connection
from ..definitions import Workflow, registry
from ..exceptions import NonDeterminismError
from ..models import OpLedger, StepAttempt, WorkflowRun
from ..observe import tracing
from ..observe.logs import get_logger
from ..states import ACTIVE, StepKind, current_pass
from .attempt_handle import AttemptHandle
from .context import TaskContext
from .history import Attempt, ReplayHistory, StepRecord
from .step_api import StepAPI
from .step_base import RunState

BATCH = 1000
RUN_COLUMNS = (
    "id",
    "task_name",
    "version",
    "input",
    "failures",
    "pass_offset",
    "trace_id",
    "queue",
    "priority",
)


@dataclass(frozen=True)
class Mismatch:
    run_id: uuid.UUID
    task: str
    version: int
    problem: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": str(self.run_id),
            "task": self.task,
            "version": self.version,
            "problem": self.problem,
        }


class _Stop(BaseException):
    """The replay reached the point where a worker would go on: the history matches."""


class _Mismatch(BaseException):
    """The history no longer matches the code (BaseException: user code cannot catch it)."""


class _WriteRefused(BaseException):
    pass


def check(task: str | None = None, *, batch: int = BATCH) -> tuple[int, list[Mismatch]]:
    """(runs checked, the runs that no longer match), oldest first."""
    found: list[Mismatch] = []
    checked = 0
    for runs, histories, ops in _batches(task, batch):
        with _no_writes():
            for row in runs:
                checked += 1
                problem = _replay(row, histories.get(row["id"], {}), ops.get(row["id"], {}))
                if problem is not None:
                    found.append(Mismatch(row["id"], row["task_name"], row["version"], problem))
    return checked, found


def _batches(
    task: str | None, size: int
) -> Iterator[tuple[list[dict[str, Any]], dict[Any, dict[str, StepRecord]], dict[Any, dict]]]:
    qs = WorkflowRun.objects.filter(status__in=list(ACTIVE))
    if task is not None:
        qs = qs.filter(task_name=task)
    last: uuid.UUID | None = None
    while True:
        page = qs.filter(pk__gt=last) if last is not None else qs
        runs = list(page.order_by("pk").values(*RUN_COLUMNS)[:size])
        if not runs:
            return
        last = runs[-1]["id"]
        ids = [r["id"] for r in runs]
        histories: dict[Any, dict[str, StepRecord]] = {}
        steps = (
            _replayable(StepAttempt.objects.filter(run_id__in=ids))
            .order_by("run_id", "id")
            .values_list(
                "run_id", "id", "name", "kind", "status", "run_pass", "counted", "output", "error"
            )
        )
        for run_id, sid, name, kind, status, run_pass, counted, output, error in steps:
            rec = histories.setdefault(run_id, {}).setdefault(name, StepRecord(name, kind))
            rec.attempts.append(Attempt(sid, status, run_pass, counted, output, error, None))
        ops: dict[Any, dict[str, Any]] = {}
        done = OpLedger.objects.filter(run_id__in=ids, status=OpLedger.Status.DONE)
        for run_id, op_key, result in done.values_list("run_id", "op_key", "result"):
            ops.setdefault(run_id, {})[op_key] = result
        yield runs, histories, ops
        if len(runs) < size:
            return


def _replayable(steps: Any) -> Any:
    """The attempts a replay reads: not those an operator's retry set aside (`superseded`,
    where the model has that column), as the executor's history leaves them out."""
    fields = {f.name for f in StepAttempt._meta.get_fields()}
    return steps.exclude(superseded=True) if "superseded" in fields else steps


def _replay(row: dict[str, Any], history: dict[str, StepRecord], ops: dict[str, Any]) -> str | None:
    wf = registry.find(row["task_name"], row["version"])
    if wf is None:
        return f"no workflow {row['task_name']}@{row['version']} is registered in this code"
    ctx = _replay_context(row, wf, history, ops)
    try:
        ctx._load_input(wf.load_input(row["input"]))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "input"
        return f"its input no longer validates: {where}: {first.get('msg')}"
    try:
        handled = wf.fn(ctx)
        if inspect.iscoroutine(handled):  # an async workflow: its steps resolve at once
            asyncio.run(handled)
    except _Stop:
        return None
    except _Mismatch as exc:
        return str(exc)
    except _WriteRefused as exc:
        return f"the handler writes to the database outside a step: {exc}"
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        return f"replay raised {type(exc).__name__}: {exc}"
    unreached = ctx._state.history.passed()
    if unreached:
        return f"the handler returns without reaching recorded steps {', '.join(unreached)}"
    return None


def _replay_context(
    row: dict[str, Any], wf: Workflow, history: dict[str, StepRecord], ops: dict[str, Any]
) -> ReplayContext:
    lease = transitions.Lease(row["id"], uuid.UUID(int=0), "replay-check")
    state = RunState(
        handle=AttemptHandle(lease, has_parent=False, cancel_requested=False),
        history=ReplayHistory(history, current_pass(row["failures"], row["pass_offset"])),
        step_retry=wf.step_retry,
        deadline_at=None,
        max_attempts_per_run=2**62,
        draining=threading.Event(),
    )
    return ReplayContext(
        input=None,
        run_id=row["id"],
        task_name=row["task_name"],
        version=row["version"],
        queue=row["queue"],
        trace_id=tracing.run_trace_id(row["trace_id"], row["id"]),
        priority=row["priority"],
        attempt=0,
        state=state,
        logger=lambda: get_logger(run_id=str(row["id"]), task=wf.key, replay_check=True),
        ops=ops,
        awaited=wf.is_async,
    )


class ReplayContext(TaskContext):
    def __init__(self, *, ops: dict[str, Any], awaited: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        steps = ReplaySteps(self)
        self._step = _Awaitable(steps) if awaited else steps  # type: ignore[assignment]
        self._ops = ops
        self._awaited = awaited

    def with_attempt_token(
        self, op_key: str, fn: Callable[[Any], Any], *, commit: Callable[[Any], Any] | None = None
    ) -> Any:
        if self._awaited:
            return _resolved(self._op, op_key)
        return self._op(op_key)

    def _op(self, op_key: str) -> Any:
        if op_key in self._ops:
            return self._ops[op_key]
        raise _Stop  # a worker would run (or resume) the op here


class _Awaitable:
    """An async workflow's `ctx.step` over the replay: each call awaits the plain replay's."""

    def __init__(self, steps: ReplaySteps) -> None:
        self._steps = steps

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._steps, name)
        return functools.partial(_resolved, method)


async def _resolved(method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return method(*args, **kwargs)


class ReplaySteps(StepAPI):
    """The step API over a recorded history: never runs a step, never writes."""

    def _record(self, key: str, kind: str) -> StepRecord | None:
        try:
            return super()._record(key, kind)
        except NonDeterminismError as exc:
            raise _Mismatch(str(exc)) from None

    def _replay_step(self, name: str, kind: str) -> Any:
        begun = self._begin(name, kind)  # raises a step's stored terminal error
        if begun.replayed:
            return begun.value
        self._frontier(begun.key, begun.record)

    def _frontier(self, key: str, rec: StepRecord | None) -> NoReturn:
        """Where a worker would go on: at a new step, every recorded step not reached yet was
        passed over (renamed, removed or moved); at a recorded one (an armed wait, a step to
        retry), those recorded before it. Passed over, they are never reached again, or their
        old results are replayed out of place: the worker would complete with them unreached
        (`unreached_steps`, the completed ones among them) or take them out of order."""
        history = self._s.history
        new = rec is None or not rec.attempts
        passed = history.passed() if new else history.passed(before=key)
        if passed:
            s = "s" if len(passed) > 1 else ""
            raise _Mismatch(
                f"recorded step{s} {', '.join(passed)} no longer reached before"
                f" {'new ' if new else ''}step {key!r}"
            )
        raise _Stop

    def _start(self, key: str, kind: str, attempt_no: int, **fields: Any) -> NoReturn:
        self._frontier(key, None)  # a marker a live run would record now: new ground

    def run(self, name: str, fn: Callable[[], Any], **options: Any) -> Any:
        return self._replay_step(name, StepKind.FUNCTION)

    def sleep(self, name: str, duration: Any) -> None:
        self._replay_step(name, StepKind.SLEEP)

    def wait_for_fact(self, name: str, **options: Any) -> Any:
        return self._replay_step(name, StepKind.FACT_WAIT)

    def run_child(self, workflow_or_name: Any, input: Any = None, *, name: str, **options: Any):
        return self._replay_step(name, StepKind.CHILD)


@contextmanager
def _no_writes() -> Iterator[None]:
    """Refuse every statement but reads while handlers replay (user code between steps)."""

    def guard(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        head = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
        if head not in ("SELECT", "SAVEPOINT", "RELEASE", "ROLLBACK"):
            raise _WriteRefused(sql.strip().split("\n", 1)[0][:80])
        return execute(sql, params, many, context)

    with connection.execute_wrapper(guard):
        yield
