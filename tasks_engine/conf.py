"""TASKS_ENGINE settings with typed defaults."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from typing import Any

import django
from django.conf import settings

DURABLE_BACKEND = "tasks_engine.backends.DurableBackend"


def django_has_tasks() -> bool:
    """Django's tasks framework (`django.tasks`) is new in Django 6.0; 5.2 LTS has none."""
    return importlib.util.find_spec("django.tasks") is not None


def no_django_tasks_message() -> str:
    return (
        f"{DURABLE_BACKEND} needs Django 6.0 or later (django.tasks is new in 6.0) and this is "
        f"Django {django.get_version()}: remove it from TASKS or upgrade Django (workflows, "
        "runworker and the admin work on Django 5.2)"
    )


@dataclass(frozen=True)
class QueueLimits:
    """`TASKS_ENGINE["QUEUES"][name]`: fleet-wide flow control of one queue."""

    concurrency: int | None = None  # at most this many of its runs `running` at once
    rate: tuple[int, float] | None = None  # (N, window seconds): at most N claims per window
    # At most this many of its runs held by one worker process at once (executing, or claimed
    # ahead for a slot): a cap of each process, whatever its --concurrency.
    worker_concurrency: int | None = None


@dataclass(frozen=True)
class EngineSettings:
    lease_seconds: float = 30.0
    heartbeat_seconds: float | None = None  # None: lease / 3
    poll_interval: float = 1.0
    max_step_attempts_per_run: int = 1000
    notify: bool = True  # LISTEN/NOTIFY wake-ups on PostgreSQL (polling remains the fallback)
    # Server-side parameters for the engine's statements, which psycopg prepares after a few
    # executions. Turn off behind a pooler that cannot keep prepared statements.
    prepared_statements: bool = True
    # Workers send the hot writes of all their slots together (worker/group_commit.py).
    group_commit: bool = True
    # SQLite only: an atomic step holds the database's only write lock while its code runs;
    # past this many seconds it is rolled back and fails (db/sqlite_bounds.py). None or 0: no bound.
    sqlite_atomic_step_seconds: float | None = 5.0
    queues: dict[str, QueueLimits] = field(default_factory=dict)
    # A worker whose beat is older is dead: the leader makes its runs claimable at once.
    dead_worker_seconds: float = 10.0
    # The maintenance leader's lease (services/leader.py): a leader that dies is replaced within
    # about this long.
    leader_lease_seconds: float = 5.0
    # Finished runs are pruned this many days after they finished, per status (None: kept).
    retention_days: tuple[tuple[str, float | None], ...] = (
        ("completed", 30.0),
        ("failed", 90.0),
        ("canceled", 30.0),
    )
    # The metrics view (views.metrics) requires `Authorization: Bearer <token>` when set.
    metrics_token: str | None = None
    # A direct PostgreSQL URL for LISTEN when the default database goes through a transaction
    # pooler (tasks_engine/db/pooler.py); None: LISTEN on the default database's parameters.
    listen_url: str | None = None
    # False: the engine never configures structlog (the host project does; docs/logging.md).
    configure_logging: bool = True
    log_json_to_stderr: bool = False
    # The largest input, step result, workflow output, fact payload or outbox payload, in bytes
    # of its compact JSON text (values/serialization.py): refused past it, never stored.
    max_payload_bytes: int = 16 * 2**20
    # The database alias of the engine's tables (db/alias.py; db/routers.py routes the models).
    database: str = "default"
    # The alias the admin's lists and run pages read from (a replica); None: `database`.
    admin_read_database: str | None = None
    # PostgreSQL only: runs, their steps and facts in time partitions of this period ("month",
    # "week"; docs/DATABASES.md, "Partitions"); None: plain tables.
    partition: str | None = None

    @property
    def heartbeat(self) -> float:
        return self.heartbeat_seconds or self.lease_seconds / 3


# Every key TASKS_ENGINE reads; another one is a misspelling or a setting of another release
# (checks.py warns, naming the nearest known key).
KNOWN_KEYS = frozenset(
    {
        "LEASE_SECONDS",
        "HEARTBEAT_SECONDS",
        "POLL_INTERVAL",
        "MAX_STEP_ATTEMPTS_PER_RUN",
        "NOTIFY",
        "PREPARED_STATEMENTS",
        "GROUP_COMMIT",
        "SQLITE_ATOMIC_STEP_SECONDS",
        "QUEUES",
        "SCHEDULES",
        "DEAD_WORKER_SECONDS",
        "LEADER_LEASE_SECONDS",
        "RETENTION_DAYS",
        "METRICS_TOKEN",
        "LISTEN_URL",
        "CONFIGURE_LOGGING",
        "LOG_JSON_TO_STDERR",
        "MAX_PAYLOAD_BYTES",
        "DATABASE",
        "ADMIN_READ_DATABASE",
        "PARTITION",
    }
)

_cached: tuple[Any, EngineSettings] | None = None


def engine_settings() -> EngineSettings:
    """Read on every engine statement, so parsed once per TASKS_ENGINE object (a settings
    override in tests assigns a new one)."""
    global _cached
    raw = getattr(settings, "TASKS_ENGINE", {}) or {}
    if _cached is not None and _cached[0] is raw:
        return _cached[1]
    _cached = (raw, _parse(raw))
    return _cached[1]


def _parse(raw: dict[str, Any]) -> EngineSettings:
    return EngineSettings(
        lease_seconds=float(raw.get("LEASE_SECONDS", 30)),
        heartbeat_seconds=_optional_float(raw.get("HEARTBEAT_SECONDS")),
        poll_interval=float(raw.get("POLL_INTERVAL", 1.0)),
        max_step_attempts_per_run=int(raw.get("MAX_STEP_ATTEMPTS_PER_RUN", 1000)),
        notify=bool(raw.get("NOTIFY", True)),
        prepared_statements=bool(raw.get("PREPARED_STATEMENTS", True)),
        group_commit=bool(raw.get("GROUP_COMMIT", True)),
        sqlite_atomic_step_seconds=_optional_float(raw.get("SQLITE_ATOMIC_STEP_SECONDS", 5.0)),
        queues=parse_queues(queues_setting(raw)),
        dead_worker_seconds=float(raw.get("DEAD_WORKER_SECONDS", 10)),
        leader_lease_seconds=float(raw.get("LEADER_LEASE_SECONDS", 5)),
        retention_days=_retention(raw.get("RETENTION_DAYS")),
        metrics_token=raw.get("METRICS_TOKEN") or None,
        configure_logging=bool(raw.get("CONFIGURE_LOGGING", True)),
        log_json_to_stderr=bool(raw.get("LOG_JSON_TO_STDERR", False)),
        listen_url=raw.get("LISTEN_URL") or None,
        max_payload_bytes=_payload_bound(raw.get("MAX_PAYLOAD_BYTES", 16 * 2**20)),
        database=_alias_name("DATABASE", raw.get("DATABASE", "default")),
        admin_read_database=_alias_name(
            "ADMIN_READ_DATABASE", raw.get("ADMIN_READ_DATABASE"), optional=True
        ),
        partition=_partition(raw.get("PARTITION")),
    )


PARTITION_UNITS = ("month", "week")


def _partition(value: Any) -> str | None:
    if value is None or value in PARTITION_UNITS:
        return value  # type: ignore[no-any-return]
    raise ValueError(f"PARTITION must be 'month', 'week' or None, not {value!r}")


def _alias_name(key: str, value: Any, *, optional: bool = False) -> Any:
    """A database alias: a non-empty string (whether DATABASES has it is checks.py's E040)."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key} must be the name of a DATABASES alias, not {value!r}")
    return value


# MAX_PAYLOAD_BYTES' range. At most 32 MiB: a value of many small elements grows about sixfold
# as PostgreSQL's jsonb, which holds at most 256 MB. At least 64 KiB: below it the size is
# never measured (values/serialization.py), so small values cost nothing.
PAYLOAD_BYTES_RANGE = (64 * 2**10, 32 * 2**20)


def _payload_bound(value: Any) -> int:
    low, high = PAYLOAD_BYTES_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(
            f"MAX_PAYLOAD_BYTES must be an integer from {low} to {high} (bytes), not {value!r}"
        )
    return value


# The oldest age a prune counts back (100 years): further back the cut-off date overflows.
MAX_RETENTION_DAYS = 36_500

_RATE = re.compile(r"\s*(\d+)\s*/\s*([smh])\s*")
_WINDOW = {"s": 1.0, "m": 60.0, "h": 3600.0}


def queues_setting(raw: dict[str, Any]) -> Any:
    value = raw.get("QUEUES")
    return {} if value is None else value


def parse_queues(raw: Any) -> dict[str, QueueLimits]:
    """QUEUES validated; a bad value raises ValueError naming its queue."""
    if not isinstance(raw, dict):
        raise ValueError("QUEUES must be a dict of queue name -> limits")
    return {str(name): _queue_limits(name, spec) for name, spec in raw.items()}


def _queue_limits(name: Any, spec: Any) -> QueueLimits:
    where = f"QUEUES[{name!r}]"
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: a queue name must be a non-empty string")
    if not isinstance(spec, dict):
        raise ValueError(
            f"{where} must be a dict with 'concurrency', 'rate_limit' and/or 'worker_concurrency'"
        )
    unknown = sorted(set(spec) - {"concurrency", "rate_limit", "worker_concurrency"})
    if unknown:
        raise ValueError(f"{where}: unknown option(s) {', '.join(map(repr, unknown))}")
    concurrency = _positive(where, spec, "concurrency")
    per_worker = _positive(where, spec, "worker_concurrency")
    rate = spec.get("rate_limit")
    parsed = None if rate is None else parse_rate(rate, f"{where}['rate_limit']")
    return QueueLimits(concurrency=concurrency, rate=parsed, worker_concurrency=per_worker)


def parse_rate(rate: Any, where: str) -> tuple[int, float]:
    """A rate limit `"N/s"`, `"N/m"` or `"N/h"` as (N, window seconds); ValueError naming
    `where` otherwise."""
    m = _RATE.fullmatch(rate) if isinstance(rate, str) else None
    if m is None or int(m.group(1)) < 1 or int(m.group(1)) > INT32_MAX:
        raise ValueError(f"{where} must look like '30/m' (N/s, N/m or N/h, N >= 1), not {rate!r}")
    return int(m.group(1)), _WINDOW[m.group(2)]


INT32_MAX = 2**31 - 1  # the claim counts in int: a larger N could not be compared


def _positive(where: str, spec: dict[str, Any], option: str) -> int | None:
    value = spec.get(option)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{where}[{option!r}] must be an integer >= 1, not {value!r}")
    return value


def _retention(raw: Any) -> tuple[tuple[str, float | None], ...]:
    """RETENTION_DAYS: statuses it leaves out keep their default; None keeps for ever."""
    days = dict(EngineSettings.retention_days)
    if raw is None:
        return tuple(days.items())
    if not isinstance(raw, dict):
        raise TypeError(f"RETENTION_DAYS must be a dict of status to days, not {raw!r}")
    unknown = set(raw) - set(days)
    if unknown:
        raise ValueError(f"RETENTION_DAYS: unknown status {sorted(unknown)[0]!r}")
    for status, value in raw.items():
        try:
            days[status] = _optional_float(value)
        except (TypeError, ValueError):
            days[status] = -1.0  # refused below
        kept = days[status]
        if kept is not None and not 0 <= kept <= MAX_RETENTION_DAYS:
            raise ValueError(
                f"RETENTION_DAYS[{status!r}] must be a number of days from 0 to"
                f" {MAX_RETENTION_DAYS} or None (kept for ever), not {value!r}"
            )
    return tuple(days.items())


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)
