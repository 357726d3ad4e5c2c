"""System checks for the engine's configuration."""

from __future__ import annotations

import difflib
from typing import Any

from django.conf import settings
from django.core import checks
from django.db import DEFAULT_DB_ALIAS

from .conf import (
    DURABLE_BACKEND,
    KNOWN_KEYS,
    django_has_tasks,
    engine_settings,
    no_django_tasks_message,
    parse_queues,
    queues_setting,
)
from .db.pooler import SETTINGS_TO_CHANGE, behind_transaction_pooler, undeclared_pooler_seen


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    raw = getattr(settings, "TASKS_ENGINE", {}) or {}
    try:
        parse_queues(queues_setting(raw))
    except ValueError as exc:
        return [checks.Error(f"TASKS_ENGINE {exc}", id="tasks_engine.E006")]
    try:
        s = engine_settings()
    except (TypeError, ValueError) as exc:
        return [checks.Error(f"TASKS_ENGINE is invalid: {exc}", id="tasks_engine.E001")]
    if not _positive(s.lease_seconds):
        errors.append(
            checks.Error("TASKS_ENGINE LEASE_SECONDS must be > 0", id="tasks_engine.E002")
        )
    if s.heartbeat_seconds is not None and not _positive(s.heartbeat_seconds):
        errors.append(
            checks.Error(
                "TASKS_ENGINE HEARTBEAT_SECONDS must be > 0 (or None: a third of the lease)",
                id="tasks_engine.E003",
            )
        )
    elif s.heartbeat >= s.lease_seconds:
        errors.append(
            checks.Error(
                "TASKS_ENGINE HEARTBEAT_SECONDS must be shorter than LEASE_SECONDS",
                hint="Leave it None to use a third of the lease.",
                id="tasks_engine.E003",
            )
        )
    if not _positive(s.poll_interval):
        errors.append(
            checks.Error("TASKS_ENGINE POLL_INTERVAL must be > 0", id="tasks_engine.E004")
        )
    if s.max_step_attempts_per_run < 1:
        errors.append(
            checks.Error(
                "TASKS_ENGINE MAX_STEP_ATTEMPTS_PER_RUN must be >= 1", id="tasks_engine.E007"
            )
        )
    for key, value in (
        ("DEAD_WORKER_SECONDS", s.dead_worker_seconds),
        ("LEADER_LEASE_SECONDS", s.leader_lease_seconds),
    ):
        if not _positive(value):
            # A beat is never younger than 0 s: every worker would be reaped as dead, and the
            # runs it executes retaken by another worker while its steps still run.
            errors.append(checks.Error(f"TASKS_ENGINE {key} must be > 0", id="tasks_engine.E008"))
    errors += _unknown_keys(raw)
    errors += _sqlite_atomic_step_bound(s)
    errors += _engine_database(s)
    errors += _partition_vendor(s)
    return errors


def _partition_vendor(s: Any) -> list[checks.CheckMessage]:
    """Time partitions are PostgreSQL's (declarative partitioning): SQLite has none."""
    engine = str(_engine_db().get("ENGINE", ""))
    if s.partition is None or engine.endswith("postgresql"):
        return []
    return [
        checks.Error(
            f"TASKS_ENGINE PARTITION is {s.partition!r} but the engine's database is not "
            "PostgreSQL: only PostgreSQL has partitions (leave PARTITION unset)",
            id="tasks_engine.E042",
        )
    ]


ENGINE_ROUTER = "tasks_engine.db.routers.EngineRouter"


def _engine_db() -> dict[str, Any]:
    """The DATABASES entry of the engine's alias ({} if it has none: E040 says so)."""
    try:
        alias = engine_settings().database
    except (TypeError, ValueError):
        alias = DEFAULT_DB_ALIAS
    return settings.DATABASES.get(alias, {})  # type: ignore[no-any-return]


def _engine_database(s: Any) -> list[checks.CheckMessage]:
    """DATABASE and ADMIN_READ_DATABASE name aliases of DATABASES; an engine off "default"
    needs its router, or the ORM's statements would go to "default" while the rest go to it."""
    found: list[checks.CheckMessage] = []
    for key, alias in (("DATABASE", s.database), ("ADMIN_READ_DATABASE", s.admin_read_database)):
        if alias is not None and alias not in settings.DATABASES:
            found.append(
                checks.Error(
                    f"TASKS_ENGINE {key} names the database alias {alias!r}, which DATABASES "
                    f"does not have (it has {', '.join(map(repr, settings.DATABASES))})",
                    id="tasks_engine.E040",
                )
            )
    routers = [
        r if isinstance(r, str) else type(r).__module__ + "." + type(r).__qualname__
        for r in getattr(settings, "DATABASE_ROUTERS", [])
    ]
    if s.database != DEFAULT_DB_ALIAS and ENGINE_ROUTER not in routers:
        found.append(
            checks.Error(
                f"TASKS_ENGINE DATABASE is {s.database!r} but DATABASE_ROUTERS does not list "
                f"{ENGINE_ROUTER}: the engine's models would be read, written and migrated on "
                "'default'",
                hint=f'Add "{ENGINE_ROUTER}" to DATABASE_ROUTERS (docs/DATABASES.md).',
                id="tasks_engine.E041",
            )
        )
    return found


def _positive(value: float) -> bool:
    return 0 < value < float("inf")  # NaN is not


def _unknown_keys(raw: Any) -> list[checks.CheckMessage]:
    if not isinstance(raw, dict):
        return []
    found: list[checks.CheckMessage] = []
    for key in sorted(set(raw) - KNOWN_KEYS, key=str):
        near = difflib.get_close_matches(str(key), sorted(KNOWN_KEYS), n=1)
        found.append(
            checks.Warning(
                f"TASKS_ENGINE has an unknown key {key!r}: it is ignored",
                hint=f"Did you mean {near[0]!r}?" if near else "See docs/reference.md, Settings.",
                id="tasks_engine.W003",
            )
        )
    return found


def _sqlite_atomic_step_bound(s: Any) -> list[checks.CheckMessage]:
    """On SQLite an atomic step holds the only write lock while its code runs: warn when the
    bound lets it hold that lock long enough for other workers' leases to lapse. A sound bound
    says nothing: a warning on every SQLite start would be noise."""
    bound = s.sqlite_atomic_step_seconds
    if bound is not None and bound < 0:
        return [
            checks.Error(
                "TASKS_ENGINE SQLITE_ATOMIC_STEP_SECONDS must be >= 0 (0 or None: no bound)",
                id="tasks_engine.E005",
            )
        ]
    if not any(db["ENGINE"] == "django.db.backends.sqlite3" for db in settings.DATABASES.values()):
        return []
    hint = (
        "An atomic step holds SQLite's only write lock while its code runs, and every "
        "worker's writes (lease renewals too) wait for it. Keep SQLITE_ATOMIC_STEP_SECONDS "
        f"at most half of LEASE_SECONDS ({s.lease_seconds / 2:g}s); see docs/SQLITE.md."
    )
    if not bound:
        return [
            checks.Warning(
                "TASKS_ENGINE SQLITE_ATOMIC_STEP_SECONDS is disabled: on SQLite a frozen "
                "atomic step stalls every worker",
                hint=hint,
                id="tasks_engine.W001",
            )
        ]
    if bound > s.lease_seconds / 2:
        return [
            checks.Warning(
                f"TASKS_ENGINE SQLITE_ATOMIC_STEP_SECONDS ({bound:g}s) is more than half of "
                f"LEASE_SECONDS ({s.lease_seconds:g}s): on SQLite other workers' leases can "
                "lapse while an atomic step holds the write lock",
                hint=hint,
                id="tasks_engine.W001",
            )
        ]
    return []


# Misconfiguration that would otherwise show only at run time: settings the database in use
# ignores or cannot honour, a lease too short for its heartbeats, a queue name that looks misspelt.
SQLITE = "django.db.backends.sqlite3"
POSTGRES_ONLY_SETTINGS = {
    "NOTIFY": "SQLite has no LISTEN/NOTIFY: workers and relays poll every POLL_INTERVAL",
    "LISTEN_URL": "SQLite has no LISTEN/NOTIFY",
    "PREPARED_STATEMENTS": "prepared statements are a PostgreSQL (psycopg) feature",
    "GROUP_COMMIT": "on SQLite each write commits by itself (one writer at a time)",
}


@checks.register()
def check_misconfiguration(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        s = engine_settings()
    except (TypeError, ValueError):
        return []  # tasks_engine.E001 reports it
    raw = getattr(settings, "TASKS_ENGINE", {}) or {}
    found = _lease_holds_three_heartbeats(s)
    if _engine_db().get("ENGINE") == SQLITE:
        found += _postgres_only_settings_on_sqlite(raw)
        found += _sqlite_transaction_mode(_engine_db())
    if behind_transaction_pooler():
        found += _transaction_pooler(s)
    found += _workflow_queue_typos(raw)
    return found


def _lease_holds_three_heartbeats(s: Any) -> list[checks.CheckMessage]:
    """Two missed heartbeats (a GC pause, a slow commit) must not lose a lease: a lease shorter
    than three heartbeats is given up after one. (E003 reports a heartbeat >= the lease.)"""
    beat = s.heartbeat_seconds
    if not beat or beat >= s.lease_seconds or s.lease_seconds >= 3 * beat:
        return []
    return [
        checks.Warning(
            f"TASKS_ENGINE LEASE_SECONDS ({s.lease_seconds:g}s) is shorter than three "
            f"heartbeats (HEARTBEAT_SECONDS {beat:g}s): one late heartbeat loses the lease "
            "and another worker runs the step again",
            hint="Leave HEARTBEAT_SECONDS None (a third of the lease) or make the lease at "
            f"least {3 * beat:g}s.",
            id="tasks_engine.W020",
        )
    ]


def _postgres_only_settings_on_sqlite(raw: dict[str, Any]) -> list[checks.CheckMessage]:
    """Only settings the project set itself: the defaults suit both databases."""
    return [
        checks.Warning(
            f"TASKS_ENGINE {key} is ignored on SQLite: {why}",
            hint="Remove it from TASKS_ENGINE for SQLite, or set it only when DATABASE_URL "
            "is PostgreSQL.",
            id="tasks_engine.W021",
        )
        for key, why in POSTGRES_ONLY_SETTINGS.items()
        if raw.get(key)
    ]


def _sqlite_transaction_mode(db: dict[str, Any]) -> list[checks.CheckMessage]:
    """The engine's writes on SQLite rely on BEGIN IMMEDIATE: it takes the one write lock up
    front (waiting up to the busy timeout), where a deferred transaction reads first and then
    fails with "database is locked" when another process wrote meanwhile. Left unset, the
    engine sets it on its connections (db/sqlite_connections.py); a mode the project set wins."""
    mode = (db.get("OPTIONS") or {}).get("transaction_mode")
    if mode is None or str(mode).upper() == "IMMEDIATE":
        return []
    return [
        checks.Warning(
            f"DATABASES['default'] is SQLite with OPTIONS transaction_mode {mode!r}, not "
            "IMMEDIATE: with a worker beside the web process (or two workers), engine writes "
            "fail with 'database is locked', and the steps they interrupt run again",
            hint='Remove "transaction_mode" from DATABASES["default"]["OPTIONS"] (the engine '
            'then uses IMMEDIATE) or set it to "IMMEDIATE" (docs/SQLITE.md).',
            id="tasks_engine.W026",
        )
    ]


def _transaction_pooler(s: Any) -> list[checks.CheckMessage]:
    found: list[checks.CheckMessage] = []
    if s.prepared_statements:
        found.append(
            checks.Error(
                "TASKS_ENGINE PREPARED_STATEMENTS cannot work through a transaction pooler "
                "(DATABASES['default']['DISABLE_SERVER_SIDE_CURSORS'] is True): a statement "
                "prepared on one server connection does not exist on the next",
                hint="Set TASKS_ENGINE['PREPARED_STATEMENTS'] = False "
                "(docs/operations/poolers.md).",
                id="tasks_engine.E020",
            )
        )
    if s.notify and not s.listen_url:
        found.append(
            checks.Warning(
                "TASKS_ENGINE NOTIFY: LISTEN cannot work through a transaction pooler; without "
                "LISTEN_URL workers and relays are woken by polling only (POLL_INTERVAL)",
                hint="Set TASKS_ENGINE['LISTEN_URL'] to a direct PostgreSQL URL (bypassing the "
                "pooler) for push wake-ups.",
                id="tasks_engine.W022",
            )
        )
    return found


@checks.register(checks.Tags.database)
def check_undeclared_pooler(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """`check --database default` (and every `runworker` before it starts): a transaction
    pooler the settings do not declare. It connects, so only when asked for the database."""
    if not databases or engine_settings().database not in databases:
        return []
    return _undeclared_pooler()


def _undeclared_pooler() -> list[checks.CheckMessage]:
    if not undeclared_pooler_seen():
        return []
    return [
        checks.Error(
            "a transaction pooler (PgBouncer in transaction mode) serves DATABASES['default'] "
            "(two connections reached one server session), configured as a direct connection: "
            f"prepared statements and session settings would pass between clients; "
            f"{SETTINGS_TO_CHANGE}",
            id="tasks_engine.E027",
        )
    ]


def declared_queues(raw: dict[str, Any] | None = None) -> set[str] | None:
    """The queue names TASKS_ENGINE["QUEUES"] declares, or None when it declares none."""
    if raw is None:
        raw = getattr(settings, "TASKS_ENGINE", {}) or {}
    queues = raw.get("QUEUES")
    if not queues or not isinstance(queues, dict | list | tuple):
        return None
    return {str(name) for name in queues}


# How alike two queue names must be (difflib's ratio) to call one a likely typo of the other:
# "reprots" and "reports" (0.86) are; "flow-rate" and "flow-io" (0.62), two queues, are not.
TYPO_SIMILARITY = 0.8


def likely_typo_of(queue: str, known: set[str]) -> str | None:
    """The known queue `queue` is probably a misspelling of (case aside), or None. Queues are
    open (any valid name can be used), so this is only ever advice."""
    if queue in known:
        return None
    folded = {name.casefold(): name for name in sorted(known)}
    near = difflib.get_close_matches(queue.casefold(), folded, n=1, cutoff=TYPO_SIMILARITY)
    return folded[near[0]] if near else None


def _workflow_queue_typos(raw: dict[str, Any]) -> list[checks.CheckMessage]:
    """QUEUES declares limits, not the list of queues: a workflow's queue it leaves out is fine,
    unless it is close to one it names (one of the two misspelt, the limit applying to neither)."""
    declared = declared_queues(raw)
    if declared is None:
        return []
    from .definitions import registry

    found: list[checks.CheckMessage] = []
    for name, version in registry.pairs():
        queue = registry.get(name, version).queue
        near = likely_typo_of(queue, declared)
        if near is not None:
            found.append(
                checks.Warning(
                    f"workflow {name}@{version} uses queue {queue!r}, close to {near!r} that "
                    "TASKS_ENGINE QUEUES limits: a typo?",
                    hint=f"If both queues are meant, add {queue!r} to QUEUES ({{}}: no limits).",
                    id="tasks_engine.W023",
                )
            )
    return found


def known_queues() -> set[str]:
    """The queues the configuration names: QUEUES' and every registered workflow's."""
    from .definitions import DEFAULT_QUEUE, registry

    workflows = {registry.get(n, v).queue for n, v in registry.pairs()}
    return (declared_queues() or set()) | workflows | {DEFAULT_QUEUE}


def _served_queue_typos(queues: list[str]) -> list[checks.CheckMessage]:
    """A worker may serve a queue nobody names (runs enqueued with queue=): only one close to a
    known queue is worth a word."""
    known = known_queues()
    return [
        checks.Warning(
            f"queue {queue!r} is named by neither TASKS_ENGINE QUEUES nor a workflow, and is "
            f"close to {near!r}: a typo? (served all the same)",
            id="tasks_engine.W023",
        )
        for queue in queues
        if (near := likely_typo_of(queue, known)) is not None
    ]


def worker_checks(queues: list[str], processes: int = 1) -> list[checks.CheckMessage]:
    """What `runworker` checks about its own arguments before it starts: errors stop it (one
    line on stderr, exit 1), warnings are printed and it goes on."""
    found = _served_queue_typos(queues)
    if processes > 1 and _engine_db().get("ENGINE") == SQLITE:
        found.append(
            checks.Warning(
                f"--processes {processes} on SQLite: SQLite has one writer, so the processes "
                "take turns for its write lock (more slots in one process, --concurrency, "
                "do the same with less contention)",
                id="tasks_engine.W024",
            )
        )
    found += _undeclared_pooler()
    others = _live_workers_on_sqlite()
    if others:
        found.append(
            checks.Warning(
                f"{others} other worker process(es) already serve this SQLite database: SQLite "
                "has one writer, so the processes take turns for its write lock (one worker "
                "with more --concurrency does the same with less contention)",
                id="tasks_engine.W025",
            )
        )
    return found


def _live_workers_on_sqlite() -> int:
    """Live worker rows, on SQLite only (0 elsewhere, or before the table exists)."""
    if _engine_db().get("ENGINE") != SQLITE:
        return 0
    from django.db import DatabaseError

    from .models import Worker
    from .transitions import alive

    try:
        return Worker.objects.filter(alive()).count()
    except DatabaseError:
        return 0


@checks.register()
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every schedule (`@workflow(schedule=...)`, `TASKS_ENGINE["SCHEDULES"]`) must parse, name
    a known timezone and task, and carry input that task accepts: found here, not when it
    would have fired."""
    from .schedules import collect

    errors: list[checks.CheckMessage] = []
    for p in collect()[1]:
        origin = (
            f"schedule= of workflow {p.name!r}"
            if p.source == "workflow"
            else 'TASKS_ENGINE["SCHEDULES"]'
        )
        errors.append(
            checks.Error(
                f"schedule {p.name!r} ({origin}): {p.message}",
                hint="See docs/schedules.md.",
                id=f"tasks_engine.{p.code}",
            )
        )
    return errors


@checks.register(deploy=True)
def check_unserved_runs(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """`check --deploy`: unfinished runs whose (task, version) and queue no live worker serves
    (a version retired by a deploy while runs of it were mid-way, a queue nobody listens to).
    Only once workers are known: with no live worker row nothing can be said. Says nothing
    when the database cannot be read (not migrated yet, or down): this is advice, not a gate."""
    from django.db import DatabaseError

    from .db.alias import atomic
    from .services.fleet import unserved_runs

    try:
        with atomic():  # a failed read inside a caller's transaction stays contained
            unserved = unserved_runs()
    except DatabaseError:
        return []
    return [
        checks.Warning(
            f"{u['runs']} unfinished run(s) of {u['task']}@{u['version']} in queue "
            f"{u['queue']!r}: no live worker serves this task version and queue",
            hint="Start a worker that registers this version and serves this queue, or "
            "cancel the runs (manage.py tasks workers lists what each worker serves).",
            obj=f"{u['task']}@{u['version']}",
            id="tasks_engine.W002",
        )
        for u in unserved or []
    ]


@checks.register()
def check_durable_backend_has_django_tasks(
    app_configs: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Django 5.2 has no tasks framework and ignores TASKS: a project that names the engine's
    backend there would see its tasks never run, so it hears it at `manage.py check`."""
    if django_has_tasks():
        return []
    tasks = getattr(settings, "TASKS", None)
    named = isinstance(tasks, dict) and any(
        isinstance(conf, dict) and conf.get("BACKEND") == DURABLE_BACKEND for conf in tasks.values()
    )
    if not named:
        return []
    return [checks.Error(f"TASKS: {no_django_tasks_message()}", id="tasks_engine.E030")]
