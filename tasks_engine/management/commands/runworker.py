"""manage.py runworker: execute durable runs."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tasks_engine.checks import worker_checks
from tasks_engine.conf import engine_settings
from tasks_engine.definitions import Workflow, registry
from tasks_engine.observe import metrics
from tasks_engine.worker import Worker, WorkerConfig, bounds, supervisor
from tasks_engine.worker.loop import connections_per_process

from ...db.alias import connection
from ..cli import (
    OneLineErrors,
    non_negative_float,
    non_negative_int,
    port_number,
    positive_float,
    positive_int,
    queue_name,
    task_ref,
)

# From drains of 20,000 no-op runs at 4, 8, 16 and 32 slots (bench/PROFILE.md): 16 runs 2.4x
# the rate of 4 (each group statement and WAL flush carries about five times the runs) and is
# within noise of 32 with half its connections. SQLite has one writer lock: more slots only
# queue on it.
POSTGRES_CONCURRENCY = 16
SQLITE_CONCURRENCY = 4


def default_concurrency() -> int:
    return POSTGRES_CONCURRENCY if connection.vendor == "postgresql" else SQLITE_CONCURRENCY


class Command(OneLineErrors, BaseCommand):
    help = "Run a worker that claims and executes durable workflow runs."

    def add_arguments(self, parser: CommandParser) -> None:
        s = engine_settings()
        parser.add_argument(
            "--concurrency",
            type=positive_int,
            default=None,
            help=f"runs executed at once (default: {POSTGRES_CONCURRENCY} on PostgreSQL,"
            f" {SQLITE_CONCURRENCY} on SQLite)",
        )
        parser.add_argument(
            "--prefetch",
            type=non_negative_int,
            default=None,
            metavar="N",
            help="the most runs claimed ahead, under a backlog, for slots about to free: as many "
            "as the slots start in 0.1 s; handed back after 1 s unstarted (default: 8 x the "
            "concurrency; 0: never)",
        )
        parser.add_argument(
            "--queue",
            action="append",
            default=[],
            type=queue_name,
            metavar="Q",
            help="serve only this queue; repeatable (default: every queue)",
        )
        parser.add_argument(
            "--task",
            action="append",
            default=[],
            type=task_ref,
            metavar="NAME@VERSION",
            help="serve only this workflow version; repeatable (default: all)",
        )
        parser.add_argument(
            "--lease-seconds",
            type=positive_float,
            default=s.lease_seconds,
            help="lease length (default: %(default)r)",
        )
        parser.add_argument(
            "--poll-interval",
            type=positive_float,
            default=s.poll_interval,
            help="seconds between polls when idle (default: %(default)r)",
        )
        parser.add_argument(
            "--grace-seconds",
            type=non_negative_float,
            default=30.0,
            help="on SIGTERM, time in-flight steps get to finish (default: %(default)r)",
        )
        parser.add_argument(
            "--burst", action="store_true", help="exit 0 once nothing is due or in flight"
        )
        parser.add_argument(
            "--processes",
            type=positive_int,
            default=1,
            metavar="N",
            help="run N worker processes under a supervisor that restarts a crashed one and "
            "forwards SIGTERM/SIGINT to all (default: %(default)r, one worker, no supervisor)",
        )
        parser.add_argument(
            "--metrics-port",
            type=port_number,
            default=None,
            metavar="PORT",
            help="serve Prometheus metrics at http://ADDR:PORT/metrics; with --processes N, "
            "worker k of N serves on PORT+k-1 (default: off)",
        )
        parser.add_argument(
            "--metrics-addr",
            default="127.0.0.1",
            metavar="ADDR",
            help="address the metrics server listens on (default: %(default)r)",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        concurrency = opts["concurrency"] or default_concurrency()
        workflows: list[Workflow] = []
        if opts["task"]:
            for name, version in opts["task"]:
                wf = registry.find(name, version)
                if wf is None:
                    raise CommandError(f"unknown task {name}@{version}")
                workflows.append(wf)
        else:
            workflows = [registry.get(n, v) for n, v in registry.pairs()]
        if not workflows:
            raise CommandError("no workflows are registered; nothing to run")
        if opts["processes"] > 1 and not supervisor.is_child():
            # before any warning
            self.check_processes(opts["processes"], concurrency, workflows)
        for found in worker_checks(opts["queue"], opts.get("processes") or 1):
            if found.is_serious():
                raise CommandError(f"{found.msg} ({found.id})")
            if not supervisor.is_child():  # the supervisor warned once for all of them
                self.stderr.write(f"warning: {found.msg} ({found.id})")
        lease = opts["lease_seconds"]
        s = engine_settings()
        heartbeat = s.heartbeat_seconds or lease / 3
        heartbeat = min(heartbeat, lease / 2)
        config = WorkerConfig(
            workflows=tuple(workflows),
            queues=tuple(opts["queue"]),
            concurrency=concurrency,
            prefetch=opts["prefetch"],
            lease_seconds=lease,
            heartbeat_seconds=heartbeat,
            poll_interval=opts["poll_interval"],
            grace_seconds=opts["grace_seconds"],
            burst=opts["burst"],
        )
        if opts["processes"] > 1 and not supervisor.is_child():
            code = supervisor.Supervisor(opts["processes"], burst=opts["burst"]).run()
        else:
            worker = Worker(config)
            if opts["metrics_port"] is not None:
                serve_metrics(worker, opts["metrics_addr"], opts["metrics_port"])
            code = worker.run()
        if code:
            raise SystemExit(code)

    def check_processes(self, processes: int, concurrency: int, workflows: list[Workflow]) -> None:
        """More processes than the CPUs and the database's connections allow: a usage error,
        before any child starts. Counted for the workflows these workers run (`--task`): a
        worker of async workflows only holds no slot threads (worker/loop.py)."""
        try:
            per_process = connections_per_process(
                concurrency,
                has_async=any(w.is_async for w in workflows),
                has_plain=not all(w.is_async for w in workflows),
            )
            problem = bounds.too_many(processes, per_process)
        except bounds.CannotCount as exc:
            self.stderr.write(
                f"warning: cannot read the database's connection limits ({exc}); "
                "--processes is checked against the CPUs only"
            )
            return
        if problem is not None:
            raise CommandError(problem)


def serve_metrics(worker: Worker, addr: str, port: int) -> None:
    """Serve this worker's metrics; a supervised worker k (1-based) serves on port + k - 1."""
    port += max(0, supervisor.child_index() - 1)
    # Registered before the server starts: a scrape arriving at once (a supervised worker's
    # first) saw only the process's default metrics.
    metrics.enable(slots_busy=worker.slots_busy)
    try:
        metrics.serve(port, addr)
    except (OSError, OverflowError) as exc:
        metrics.disable()
        raise CommandError(f"cannot serve metrics on {addr}:{port}: {exc}") from None
