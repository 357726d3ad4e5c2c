"""The definition API: @workflow, RetryPolicy, and the registry keyed by (name, version)."""

from __future__ import annotations

import inspect
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from .conf import parse_rate
from .exceptions import NonRetryableError, UnknownTaskError
from .values.durations import MAX_DURATION, duration_seconds
from .values.serialization import TOO_DEEP, nested_too_deeply, to_jsonable, unstorable
from .values.tags import check_tags
from .values.text import check_text

if TYPE_CHECKING:
    from .engine import Enqueued
    from .runtime.context import TaskContext

DEFAULT_QUEUE = "default"
# What an enqueue does when its concurrency key already has its limit of runs pending or
# running (docs/FLOW_CONTROL.md): wait, cancel the new run, or cancel the key's runs.
ON_LIMIT = ("queue", "cancel_new", "cancel_running")


def is_integer(value: Any) -> bool:
    """An int and not a bool (`True` is an int to Python, never a count or a version here)."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how soon a failed step (or run) is tried again. Checked when made, so a
    bad policy fails where the workflow is defined: intervals are seconds or timedeltas (kept
    as seconds) from 0 to durations.MAX_DURATION, the coefficient a finite number >= 1,
    `jitter` a fraction from 0 to 1, `max_attempts` an integer >= 1, `non_retryable` a tuple
    (or list) of exception classes. TypeError for a wrong type (a bool too), ValueError for
    a bad value."""

    max_attempts: int = 3
    initial_interval: float | timedelta = 1.0
    backoff_coefficient: float = 2.0
    max_interval: float | timedelta = 60.0
    non_retryable: (
        tuple[type[BaseException], ...] | list[type[BaseException]]
    ) = ()  # kept as a tuple
    jitter: float = 0.0  # fraction of the delay added at random, 0 = deterministic

    def __post_init__(self) -> None:
        attempts = self.max_attempts
        if not is_integer(attempts):
            raise TypeError(f"RetryPolicy.max_attempts must be an integer, not {attempts!r}")
        if attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be at least 1, not {attempts!r}")
        for what in ("initial_interval", "max_interval"):
            seconds = duration_seconds(getattr(self, what), f"RetryPolicy.{what}", zero_ok=True)
            object.__setattr__(self, what, seconds)  # frozen: a timedelta is kept as seconds
        _check_number("backoff_coefficient", self.backoff_coefficient, 1, None, ">= 1")
        _check_number("jitter", self.jitter, 0, 1, "from 0 to 1")
        found = self.non_retryable
        classes = tuple(found) if isinstance(found, tuple | list) else None
        if classes is None or not all(
            isinstance(c, type) and issubclass(c, BaseException) for c in classes
        ):
            raise TypeError(
                f"RetryPolicy.non_retryable must be a tuple of exception classes, not {found!r}"
            )
        object.__setattr__(self, "non_retryable", classes)

    def delay(self, failures: int) -> float:
        """Seconds to wait after the `failures`-th failure (1-based)."""
        try:
            growth = self.backoff_coefficient ** max(failures - 1, 0)
            base = _seconds(self.initial_interval) * growth
        except OverflowError:  # a large max_attempts: the cap applies long before this
            base = math.inf
        delay = min(base, _seconds(self.max_interval))
        return delay + (random.random() * delay * self.jitter if self.jitter else 0.0)

    def is_retryable(self, exc: BaseException) -> bool:
        return not isinstance(exc, (NonRetryableError, *self.non_retryable))


def _seconds(value: float | timedelta) -> float:
    """A RetryPolicy interval: seconds once made (a timedelta only while it is checked)."""
    return value.total_seconds() if isinstance(value, timedelta) else value


def _check_number(what: str, value: Any, low: float, high: float | None, expected: str) -> None:
    """A RetryPolicy number: TypeError unless an int or a float (not a bool), ValueError
    unless finite and within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"RetryPolicy.{what} must be a number, not {value!r}")
    if not (math.isfinite(value) and low <= value and (high is None or value <= high)):
        raise ValueError(f"RetryPolicy.{what} must be a finite number {expected}, not {value!r}")


def _input_error(
    task: str,
    found: tuple[tuple[str | int, ...], str],
    value: Any,
    message: str = "cannot be stored as JSON: it holds {what}",
) -> ValidationError:
    loc, what = found
    detail: InitErrorDetails = {
        "type": PydanticCustomError("unstorable_value", message, {"what": what}),
        "loc": loc,
        "input": value,
    }
    return ValidationError.from_exception_data(f"input of {task}", [detail])


DEFAULT_STEP_RETRY = RetryPolicy()
DEFAULT_WORKFLOW_RETRY = RetryPolicy(max_attempts=1)


@dataclass(eq=False)
class Workflow:
    fn: Callable[[TaskContext], Any]
    name: str
    version: int = 1
    input_model: type[BaseModel] | None = None
    queue: str = DEFAULT_QUEUE
    retry: RetryPolicy = DEFAULT_WORKFLOW_RETRY
    step_retry: RetryPolicy = DEFAULT_STEP_RETRY
    priority: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    # Flow control: a string, or a callable of the validated input returning one.
    concurrency_key: str | Callable[[Any], str] | None = None
    concurrency_limit: int = 1
    # At most one queued run per key (docs/FLOW_CONTROL.md): the same forms as concurrency_key.
    queueing_key: str | Callable[[Any], str] | None = None
    deadline: timedelta | None = None  # default deadline_at = created + deadline
    # A cron expression: the workflow runs on it, under its own name, with input {}
    # (tasks_engine/schedules/). Checked by `manage.py check`, not here.
    schedule: str | None = None
    schedule_timezone: str = "UTC"
    # Tags every run of the workflow carries, under the enqueue's own (tasks_engine/tags.py).
    tags: dict[str, str] = field(default_factory=dict)
    # Debounce: enqueues with one key inside the window collapse into one run, due `debounce`
    # after the last of them (at most `debounce_max` after the first), with the last's input.
    debounce: timedelta | None = None
    debounce_key: str | Callable[[Any], str] | None = None
    debounce_max: timedelta | None = None
    on_limit: str = "queue"
    # At most N claims per key in any window ("N/s", "N/m", "N/h"), keyed by rate_limit_key.
    rate_limit: str | None = None
    rate_limit_key: str | Callable[[Any], str] | None = None

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def is_async(self) -> bool:
        """An `async def` workflow: its runs go on the worker's event loop (runtime/aio.py)."""
        return inspect.iscoroutinefunction(self.fn)

    def validate_input(self, data: Any) -> Any:
        """Validated input as stored (JSON). Raises pydantic.ValidationError, also for a value
        JSON cannot hold exactly (NaN, ±Infinity, a NUL character, a type with no JSON form,
        nesting too deep to write) instead of storing something else (pydantic's JSON mode
        turns NaN into null)."""
        try:
            return self._validated(data)
        except (RecursionError, ValueError) as exc:
            if not nested_too_deeply(exc):
                raise
            raise _input_error(
                self.key, ((), TOO_DEEP), data, "cannot be stored as JSON: {what}"
            ) from None

    def _validated(self, data: Any) -> Any:
        if self.input_model is None:
            value = data if data is not None else {}
            if (found := unstorable(value)) is not None:
                raise _input_error(self.key, found, value)
            return to_jsonable(value, f"the input of {self.key}")
        if isinstance(data, self.input_model):
            model = self.input_model.model_validate(data.model_dump())
        else:
            model = self.input_model.model_validate(data if data is not None else {})
        # Types with a JSON form of pydantic's own (datetimes, UUIDs, ...) are fine here.
        if (found := unstorable(model.model_dump(), foreign_ok=True)) is not None:
            raise _input_error(self.key, found, data)
        return model.model_dump(mode="json")

    def key_for(self, stored: Any, override: str | None = None) -> str | None:
        """The run's concurrency key: `override`, else the workflow's (a callable gets the
        validated input). Raises ValueError for a key that is not a non-empty string."""
        return self._run_key("concurrency_key", self.concurrency_key, stored, override)

    def queueing_key_for(self, stored: Any, override: str | None = None) -> str | None:
        """The run's queueing key, as `key_for` finds the concurrency key."""
        return self._run_key("queueing_key", self.queueing_key, stored, override)

    def _run_key(
        self,
        what: str,
        declared: str | Callable[[Any], str] | None,
        stored: Any,
        override: str | None,
    ) -> str | None:
        key: Any = override
        if key is None and declared is not None:
            key = self._call_key(what, declared, stored) if callable(declared) else declared
        if key is None:
            return None
        check_text(f"{what} of {self.key}", key, 255, not_a_string=ValueError)
        return key

    def _call_key(self, what: str, declared: Callable[[Any], str], stored: Any) -> Any:
        """The key callable's answer; what it raises becomes a ValueError naming the workflow
        (nothing is written), saying what the callable was given."""
        try:
            return declared(self.load_input(stored))
        except Exception as exc:
            given = (
                f"an instance of {self.input_model.__name__}"
                if self.input_model is not None
                else "the input as a dict (declare input= for a model)"
            )
            raise ValueError(
                f"{what} callable of {self.key} raised {type(exc).__name__}: {exc}"
                f" (it is given {given})"
            ) from exc

    def debounce_key_for(self, stored: Any, override: str | None = None) -> str | None:
        """The run's debounce key, as `key_for` finds the concurrency key. ValueError for a key
        given to a workflow that declares no debounce window."""
        if override is not None and self.debounce is None:
            raise ValueError(
                f"debounce_key needs a debounce window: {self.key} declares no debounce="
            )
        return self._run_key("debounce_key", self.debounce_key, stored, override)

    def rate_key_for(self, stored: Any) -> str | None:
        """The run's rate limit key (rate_limit_key), as `key_for` finds the concurrency key."""
        return self._run_key("rate_limit_key", self.rate_limit_key, stored, None)

    def limit_for(self, key: str | None, override: int | None = None) -> int | None:
        """The run's concurrency limit: `override`, else the workflow's; None without a key.
        Raises TypeError for a limit that is not an integer, ValueError for one out of range
        or one without a key."""
        if override is not None:
            _check_limit(override)
            if key is None:
                raise ValueError(
                    f"concurrency_limit needs a concurrency_key: {self.key} declares none,"
                    " and none was given"
                )
            return override
        return self.concurrency_limit if key is not None else None

    def load_input(self, stored: Any) -> Any:
        if self.input_model is None:
            return stored
        return self.input_model.model_validate(stored)

    def enqueue(self, input: Any = None, **kwargs: Any) -> Enqueued:
        from .engine import enqueue  # lazy on purpose: the engine needs the models loaded

        kwargs.setdefault("version", self.version)
        return enqueue(self.name, input, **kwargs)

    def __call__(self, ctx: TaskContext) -> Any:
        return self.fn(ctx)

    def __repr__(self) -> str:
        return f"<Workflow {self.key}>"


class Registry:
    def __init__(self) -> None:
        self._by_key: dict[tuple[str, int], Workflow] = {}
        self._latest: dict[str, int] = {}  # each name's newest version: what enqueue runs

    def register(self, wf: Workflow) -> Workflow:
        existing = self._by_key.get((wf.name, wf.version))
        if existing is not None and _origin(existing.fn) != _origin(wf.fn):
            raise ImproperlyConfigured(
                f"workflow {wf.key} is defined twice: {_origin(existing.fn)} and {_origin(wf.fn)}"
            )
        self._by_key[(wf.name, wf.version)] = wf
        self._latest[wf.name] = max(wf.version, self._latest.get(wf.name, wf.version))
        return wf

    def get(self, name: str, version: int | None = None) -> Workflow:
        if version is None:
            found = self._latest.get(name)
            if found is None:
                raise UnknownTaskError(f"unknown task {name!r}")
            version = found
        try:
            return self._by_key[(name, version)]
        except KeyError:
            raise UnknownTaskError(f"unknown task {name}@{version}") from None

    def find(self, name: str, version: int) -> Workflow | None:
        return self._by_key.get((name, version))

    def pairs(self) -> list[tuple[str, int]]:
        return sorted(self._by_key)

    def unregister(self, name: str, version: int) -> None:
        self._by_key.pop((name, version), None)
        versions = [v for (n, v) in self._by_key if n == name]
        if versions:
            self._latest[name] = max(versions)
        else:
            self._latest.pop(name, None)


def _origin(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


registry = Registry()


def workflow(
    fn: Callable[[Any], Any] | None = None,  # (ctx: TaskContext), or async (ctx: AsyncTaskContext)
    *,
    name: str | None = None,
    version: int = 1,
    input: type[BaseModel] | None = None,
    queue: str = DEFAULT_QUEUE,
    retry: RetryPolicy | None = None,
    step_retry: RetryPolicy | None = None,
    priority: int = 0,
    concurrency_key: str | Callable[[Any], str] | None = None,
    concurrency_limit: int = 1,
    queueing_key: str | Callable[[Any], str] | None = None,
    deadline: timedelta | None = None,
    schedule: str | None = None,
    schedule_timezone: str = "UTC",
    tags: dict[str, str] | None = None,
    debounce: timedelta | None = None,
    debounce_key: str | Callable[[Any], str] | None = None,
    debounce_max: timedelta | None = None,
    on_limit: str = "queue",
    rate_limit: str | None = None,
    rate_limit_key: str | Callable[[Any], str] | None = None,
) -> Any:
    """Register a workflow. Usable bare (`@workflow`) or with arguments. `deadline`: runs
    enqueued without a `deadline_at` get created + deadline. `tags`: every run's defaults,
    under the enqueue's own (ValueError here for a pair the rule refuses). `debounce`,
    `on_limit` and `rate_limit`: docs/FLOW_CONTROL.md."""
    if input is not None and not (isinstance(input, type) and issubclass(input, BaseModel)):
        raise TypeError("workflow input must be a pydantic BaseModel subclass")
    _check_definition(name, version, queue, retry, step_retry, priority)
    keys = (
        ("concurrency_key", concurrency_key),
        ("queueing_key", queueing_key),
        ("debounce_key", debounce_key),
        ("rate_limit_key", rate_limit_key),
    )
    for what, declared in keys:
        if declared is not None and not (
            (isinstance(declared, str) and declared) or callable(declared)
        ):
            raise TypeError(f"{what} must be a non-empty string or a callable of the input")
    _check_limit(concurrency_limit)
    _check_debounce(debounce, debounce_key, debounce_max, queueing_key)
    _check_key_limits(on_limit, concurrency_key, rate_limit, rate_limit_key)
    default_tags = check_tags(tags, "workflow tags")
    if deadline is not None and (
        not isinstance(deadline, timedelta) or not timedelta(0) < deadline <= MAX_DURATION
    ):
        raise ValueError(
            f"workflow deadline must be a positive timedelta of at most {MAX_DURATION.days}"
            f" days, got {deadline!r}"
        )

    def wrap(f: Callable[[Any], Any]) -> Workflow:
        _check_not_async_generator(f)
        wf = Workflow(
            fn=f,
            name=name or f.__name__,
            version=version,
            input_model=input,
            queue=queue,
            retry=retry or DEFAULT_WORKFLOW_RETRY,
            step_retry=step_retry or DEFAULT_STEP_RETRY,
            priority=priority,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
            queueing_key=queueing_key,
            deadline=deadline,
            schedule=schedule,
            schedule_timezone=schedule_timezone,
            tags=default_tags,
            debounce=debounce,
            debounce_key=debounce_key,
            debounce_max=debounce_max,
            on_limit=on_limit,
            rate_limit=rate_limit,
            rate_limit_key=rate_limit_key,
        )
        return registry.register(wf)

    return wrap(fn) if fn is not None else wrap


def _check_not_async_generator(fn: Callable[..., Any]) -> None:
    """A workflow returns its output once: an async generator (an `async def` with `yield`)
    would only hand the engine an iterator. Refused where it is defined."""
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise TypeError(
            f"a workflow cannot be a generator: {_origin(fn)} yields; define it with def or"
            " async def and return its output"
        )


MAX_LIMIT = 2**31 - 1  # the column's range
# WorkflowRun's columns (models can't be imported here): what a definition must fit.
NAME_MAX_LENGTH = 200
QUEUE_MAX_LENGTH = 100
INT32 = (-(2**31), 2**31 - 1)


def _check_definition(
    name: Any, version: Any, queue: Any, retry: Any, step_retry: Any, priority: Any
) -> None:
    """@workflow's own arguments, refused where the workflow is defined (import time):
    TypeError for a wrong type, ValueError for a value its runs' columns cannot hold."""
    if name is not None:
        check_text("workflow name", name, NAME_MAX_LENGTH)
    if not is_integer(version):
        raise TypeError(f"workflow version must be an integer, not {version!r}")
    if not 1 <= version <= INT32[1]:
        raise ValueError(f"workflow version must be from 1 to {INT32[1]}, not {version!r}")
    check_text("workflow queue", queue, QUEUE_MAX_LENGTH)
    for what, policy in (("retry", retry), ("step_retry", step_retry)):
        if policy is not None and not isinstance(policy, RetryPolicy):
            raise TypeError(f"workflow {what} must be a RetryPolicy, not {policy!r}")
    check_priority(priority, "workflow priority")


def check_priority(priority: Any, what: str = "priority") -> None:
    """A run's priority (the column's int32): TypeError unless an integer (not a bool),
    ValueError outside the range. For @workflow and enqueue alike."""
    if not is_integer(priority):
        raise TypeError(f"{what} must be an integer, not {priority!r}")
    if not INT32[0] <= priority <= INT32[1]:
        raise ValueError(f"{what} must be between {INT32[0]} and {INT32[1]}, not {priority!r}")


def _check_limit(limit: Any) -> None:
    if not is_integer(limit):
        raise TypeError(f"concurrency_limit must be an integer, not {limit!r}")
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"concurrency_limit must be between 1 and {MAX_LIMIT}, not {limit}")


def _check_debounce(debounce: Any, key: Any, cap: Any, queueing_key: Any) -> None:
    """debounce= and its companions: a window (a positive timedelta) needs a key and a key a
    window; debounce_max, a timedelta no shorter than the window, needs one too."""
    for what, value in (("debounce", debounce), ("debounce_max", cap)):
        if value is None:
            continue
        if not isinstance(value, timedelta):
            raise TypeError(f"workflow {what} must be a timedelta, not {value!r}")
        duration_seconds(value, f"workflow {what}")  # ValueError: not positive, or too long
    if debounce is None:
        for what, value in (("debounce_key", key), ("debounce_max", cap)):
            if value is not None:
                raise ValueError(f"workflow {what} needs debounce= (the window)")
        return
    if key is None:
        raise ValueError(
            "workflow debounce needs a debounce_key (a string, or a callable of the input)"
        )
    if cap is not None and cap < debounce:
        raise ValueError(
            f"workflow debounce_max must be at least debounce ({debounce!r}), got {cap!r}"
        )
    if queueing_key is not None:
        raise ValueError("workflow debounce and queueing_key are exclusive: use one")


def _check_key_limits(on_limit: Any, concurrency_key: Any, rate: Any, rate_key: Any) -> None:
    """on_limit=, and rate_limit= with its key (conf.parse_rate's ValueError for a bad rate)."""
    if not isinstance(on_limit, str):
        raise TypeError(f"workflow on_limit must be a string, not {on_limit!r}")
    if on_limit not in ON_LIMIT:
        raise ValueError(
            f"workflow on_limit must be one of {', '.join(ON_LIMIT)}, not {on_limit!r}"
        )
    if on_limit != "queue" and concurrency_key is None:
        raise ValueError(f"workflow on_limit={on_limit!r} needs a concurrency_key")
    if rate is not None:
        parse_rate(rate, "workflow rate_limit")
        if rate_key is None:
            raise ValueError(
                "workflow rate_limit needs a rate_limit_key (a string, or a callable of the"
                " input); for a limit on the whole queue, use QUEUES' rate_limit"
            )
    elif rate_key is not None:
        raise ValueError("workflow rate_limit_key needs rate_limit= (N/s, N/m or N/h)")
    if rate_key is not None and concurrency_key is not None:
        raise ValueError(
            "workflow rate_limit_key and concurrency_key cannot be combined (yet): a run is"
            " claimed under one kind of key"
        )
