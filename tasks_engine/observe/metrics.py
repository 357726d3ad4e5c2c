"""Prometheus metrics: what the engine counts, and the two ways they are served.

Recording is in-process and costs no statement and no database lock: the executor, the step API
and the worker loop call the `record_*` functions below, each of which returns at once unless
`enable()` was called (by `runworker --metrics-port`). A worker serves its registry over HTTP
(`serve`); the database gauge `tasks_runs{queue,status}` is refreshed in the worker that is the
maintenance leader (the `metrics-run-counts` service), and computed on demand by the Django view
`tasks_engine.views.metrics` for a web process.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    make_wsgi_app,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer

from .. import clock
from ..states import RunStatus

LIVE_STATUSES = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING)
FINISHED_OUTCOMES = frozenset({"completed", "failed", "canceled"})

_enabled = False

RUNS_FINISHED = Counter(
    "tasks_runs_finished", "Runs that finished, by outcome.", ["task", "status"], registry=None
)
STEPS = Counter(
    "tasks_steps",
    "Executed step attempts by outcome (failed includes attempts that will be retried).",
    ["task", "kind", "status"],
    registry=None,
)
STEP_DURATION = Histogram(
    "tasks_step_duration_seconds",
    "Wall time of executed step attempts.",
    ["task"],
    registry=None,
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800, float("inf")),
)
CLAIM_DELAY = Histogram(
    "tasks_claim_delay_seconds",
    "Time from a run being due (enqueued, woken, backoff over, lease expired) to its claim.",
    ["queue"],
    registry=None,
    buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, float("inf")),
)
SLOTS_BUSY = Gauge(
    "tasks_worker_slots_busy", "Worker slots executing (or reserved for) a run.", registry=None
)
RUNS = Gauge(
    "tasks_runs", "Unfinished runs by queue and status.", ["queue", "status"], registry=None
)

WORKER_METRICS = (RUNS_FINISHED, STEPS, STEP_DURATION, CLAIM_DELAY, SLOTS_BUSY, RUNS)


def enabled() -> bool:
    return _enabled


def enable(slots_busy: Callable[[], float] | None = None) -> None:
    """Start recording into the process's default registry (idempotent)."""
    global _enabled
    if not _enabled:
        for metric in WORKER_METRICS:
            REGISTRY.register(metric)
        _enabled = True
    if slots_busy is not None:
        SLOTS_BUSY.set_function(slots_busy)


def disable() -> None:
    """Stop recording into the default registry (a worker whose metrics server could not
    start)."""
    global _enabled
    if _enabled:
        for metric in WORKER_METRICS:
            REGISTRY.unregister(metric)
        _enabled = False


def serve(port: int, addr: str = "127.0.0.1") -> Any:
    """Serve the default registry as Prometheus text (at /metrics) from a daemon thread; HEAD
    answers as GET does, without the body."""
    family, host = _address_family(addr, port)

    class Server(ThreadingWSGIServer):
        address_family = family

    app = head_as_get(make_wsgi_app(REGISTRY))
    server: Server = make_server(host, port, app, Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="tasks-metrics", daemon=True).start()
    return server


def _address_family(addr: str, port: int) -> tuple[socket.AddressFamily, str]:
    """IPv4 or IPv6, as `addr` resolves (as prometheus_client's own server picks it)."""
    infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]
    return family, str(sockaddr[0])


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # a scrape every few seconds
        return None


def head_as_get(app: Callable[..., Any]) -> Callable[..., Any]:
    """A WSGI app answering HEAD with GET's status and headers (prometheus_client answers 405)."""

    def answer(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("REQUEST_METHOD") != "HEAD":
            return app(environ, start_response)
        answered: list[tuple[str, list[tuple[str, str]]]] = []

        def hold(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            answered.append((status, headers))
            return lambda data: None

        body = b"".join(app({**environ, "REQUEST_METHOD": "GET"}, hold))
        status, headers = answered[-1]
        start_response(status, [*headers, ("Content-Length", str(len(body)))])
        return []

    return answer


# -- recording (no-ops unless enabled) ---------------------------------------------------------


def record_run_outcome(task: str, outcome: str) -> None:
    if _enabled and outcome in FINISHED_OUTCOMES:
        RUNS_FINISHED.labels(task, outcome).inc()


def record_step(task: str, kind: str, status: str, seconds: float) -> None:
    if _enabled:
        STEPS.labels(task, kind, status).inc()
        STEP_DURATION.labels(task).observe(seconds)


def record_claims(runs: list[Any]) -> None:
    """Claimed runs carry `due_at`, the time they were due when the claim took them."""
    if not _enabled or not runs:
        return
    now = clock.now()
    for run in runs:
        due: datetime | None = getattr(run, "due_at", None)
        if due is not None:
            CLAIM_DELAY.labels(run.queue).observe(max(0.0, (now - due).total_seconds()))


# -- the database gauge ------------------------------------------------------------------------


def run_counts() -> dict[tuple[str, str], int]:
    """Unfinished runs per (queue, status), one grouped count over the live-status index
    (finished runs are counted by tasks_runs_finished_total instead: counting a table of
    millions of completed rows every few seconds is not free)."""
    from django.db.models import Count

    from ..models import WorkflowRun

    rows = (
        WorkflowRun.objects.filter(status__in=LIVE_STATUSES)
        .values_list("queue", "status")
        .annotate(n=Count("id"))
        .order_by()
    )
    return {(queue, status): n for queue, status, n in rows}


def refresh_run_counts() -> int:
    """The leader's service: set `tasks_runs` from the database. Returns the series set."""
    if not _enabled:
        return 0
    counts = run_counts()
    RUNS.clear()
    for (queue, status), n in counts.items():
        RUNS.labels(queue, status).set(n)
    return len(counts)


class RunCountsCollector:
    """`tasks_runs` computed at scrape time (for the Django view)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "tasks_runs", "Unfinished runs by queue and status.", labels=["queue", "status"]
        )
        for (queue, status), n in sorted(run_counts().items()):
            family.add_metric([queue, status], n)
        yield family


def database_registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCountsCollector())  # type: ignore[arg-type]
    return registry
