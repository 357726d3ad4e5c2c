"""Our engine on its own: drain, enqueue rate, pickup latency, claim rate at scale.

    python bench/engine.py drain --runs 20000 [--concurrency 32] [--processes 2] [--max-seconds 10]
    python bench/engine.py drain --task bench_async_noop ...  # async no-op runs (async rows)
    python bench/engine.py enqueue --runs 2000
    python bench/engine.py latency --runs 200 [--concurrency 8] [--no-notify]
    python bench/engine.py scale --waiting 100000 [--finished 0] --runs 2000
    python bench/engine.py steps --runs 200   # 10-step workflows: steps/s and one run's latency
    python bench/engine.py metrics --runs 3000 --rounds 3   # drain with metrics off vs on
    python bench/engine.py flow --runs 1000 --held 100000   # bench/flow.py's rows

Each command uses a fresh database on a throwaway cluster (or on $BENCH_SERVER_URL) and prints
one JSON line, with `code`: the tasks_engine directory the driver imported, and `worker_code`:
the one its workers logged (see bench/common.py for $BENCH_CODE_ROOT). Without --concurrency a
worker runs on runworker's default; --processes N is `runworker --processes N` (one
supervisor, N worker processes), as a user would run it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ["DJANGO_SETTINGS_MODULE"] = "bench_settings"  # bench/ours: the bench_pickup job

from common import (
    CODE_ROOT,
    Timer,
    database,
    engine_code,
    median,
    percentile,
    setup_django,
    wait_ready,
    worker,
    worker_code,
)


def concurrency_args(concurrency: int | None) -> list[str]:
    """runworker's flag, or nothing: its own default."""
    return [] if concurrency is None else ["--concurrency", str(concurrency)]


def worker_concurrency(concurrency: int | None) -> int:
    """What a worker started with concurrency_args(concurrency) runs at."""
    if concurrency is not None:
        return concurrency
    from tasks_engine.management.commands import runworker

    default = runworker.Command().create_parser("manage.py", "runworker").get_default("concurrency")
    if default is None:  # chosen by the database (runworker.default_concurrency)
        return int(runworker.default_concurrency())
    return int(default)


def enqueue_many(task: str, n: int, *, one_transaction: bool = True) -> None:
    from django.db import transaction

    from tasks_engine import enqueue

    if one_transaction:
        with transaction.atomic():
            for _ in range(n):
                enqueue(task)
    else:
        for _ in range(n):
            enqueue(task)


def wait_all_finished(task: str, n: int, timeout: float = 600) -> None:
    from tasks_engine.models import WorkflowRun

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        done = WorkflowRun.objects.filter(task_name=task, status="completed").count()
        if done >= n:
            return
        time.sleep(0.05)
    raise TimeoutError(f"{task}: only {done}/{n} finished")


def span(task: str) -> float:
    from django.db.models import Max, Min

    from tasks_engine.models import WorkflowRun

    agg = WorkflowRun.objects.filter(task_name=task).aggregate(
        a=Min("started_at"), b=Max("finished_at")
    )
    return (agg["b"] - agg["a"]).total_seconds()


def drained_within(task: str, procs: list[Any], max_seconds: float) -> tuple[int, float] | None:
    """Wait for the burst workers to empty the queue; with `max_seconds`, stop them that long
    after the first run started and return (runs finished by then, max_seconds). None: the
    queue emptied first."""
    from datetime import timedelta

    from django.db.models import Min

    from tasks_engine import clock
    from tasks_engine.models import WorkflowRun

    first = None
    while any(p.poll() is None for p in procs):
        if max_seconds and first is None:
            first = WorkflowRun.objects.filter(task_name=task).aggregate(a=Min("started_at"))["a"]
        if first is not None and (clock.now() - first).total_seconds() >= max_seconds:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait()
            cutoff = first + timedelta(seconds=max_seconds)
            done = WorkflowRun.objects.filter(task_name=task, finished_at__lte=cutoff).count()
            queued = WorkflowRun.objects.filter(task_name=task).count()
            return None if done == queued else (done, max_seconds)
        time.sleep(0.05)
    return None


def backlog(url: str, task: str, runs: int) -> None:
    """Set Django up on `url`'s database holding `runs` runs of `task`, enqueued one by one in
    one transaction. The first drain of a code tree on a server enqueues them into a template
    database; every later one copies it (CREATE DATABASE ... TEMPLATE: well under a second,
    where 20,000 enqueues take about 7 s here). The runs are the same rows either way."""
    import hashlib

    import psycopg

    server, name = url.rsplit("/", 1)
    tree = hashlib.sha256(str(CODE_ROOT).encode()).hexdigest()[:8]
    template = f"bench_tpl_{task}_{runs}_{tree}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [template])
        made = found.fetchone() is None
        if made:
            conn.execute(f'CREATE DATABASE "{template}"')
            setup_django(f"{server}/{template}")
            from django.db import connection

            enqueue_many(task, runs)
            # No ANALYZE: a step table analyzed while empty makes the group statement's step
            # UPDATE a sequential scan (bench/PROFILE.md); as if enqueued just before.
            connection.close()
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    if made:
        use_database(name)  # Django is set up already, on the template
    else:
        setup_django(url)


def cmd_drain(a: argparse.Namespace) -> dict[str, Any]:
    with database() as url:
        backlog(url, a.task, a.runs)
        args = [*concurrency_args(a.concurrency), "--burst"]
        if a.processes > 1:
            args += ["--processes", str(a.processes)]
        if a.task != "bench_noop":
            # A worker of that (async) workflow only: it starts no slot thread, so that
            # --processes 2 --concurrency 256 fits in the cluster's max_connections.
            args += ["--task", f"{a.task}@1"]
        procs = [worker(url, *args)]
        with Timer() as t:
            window = drained_within(a.task, procs, a.max_seconds)
        if window is None:
            wait_all_finished(a.task, a.runs, 5)
            done, seconds = a.runs, span(a.task)
        else:
            done, seconds = window
        return {
            "bench": "drain",
            "task": a.task,
            "runs": a.runs,
            "processes": a.processes,
            "concurrency": a.concurrency,
            "worker_concurrency": worker_concurrency(a.concurrency),
            "finished": done,
            "runs_per_s": round(done / seconds, 1),
            "wall_s_incl_startup": round(t.seconds, 2),
            "worker_code": worker_code(procs[0]),
        }


def drain_rate(url: str, task: str, runs: int, concurrency: int, *extra: str) -> float:
    """Runs/s of one burst worker draining `runs` fresh runs of `task`."""
    from tasks_engine.models import WorkflowRun

    WorkflowRun.objects.filter(task_name=task).delete()
    enqueue_many(task, runs)
    proc = worker(url, "--concurrency", str(concurrency), "--burst", *extra)
    proc.wait()
    wait_all_finished(task, runs, 5)
    return runs / span(task)


def cmd_metrics(a: argparse.Namespace) -> dict[str, Any]:
    """The cost of recording metrics: drains with --metrics-port and without, alternating in
    one database so that both see the same machine load and table state."""
    import socket

    with database("bench_metrics") as url:
        setup_django(url)
        off: list[float] = []
        on: list[float] = []
        for _ in range(a.rounds):
            off.append(drain_rate(url, "bench_noop", a.runs, a.concurrency))
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = str(s.getsockname()[1])
            on.append(drain_rate(url, "bench_noop", a.runs, a.concurrency, "--metrics-port", port))
        return {
            "bench": "metrics",
            "runs": a.runs,
            "rounds": a.rounds,
            "concurrency": a.concurrency,
            "runs_per_s_off": [round(x, 1) for x in off],
            "runs_per_s_on": [round(x, 1) for x in on],
            "on_over_off_median": round(median(on) / median(off), 3),
            # load from other processes only ever slows a drain: best of each is the fairer pair
            "on_over_off_best": round(max(on) / max(off), 3),
        }


def cmd_enqueue(a: argparse.Namespace) -> dict[str, Any]:
    with database() as url:
        setup_django(url)
        with Timer() as t:
            enqueue_many("bench_noop", a.runs, one_transaction=False)
        return {"bench": "enqueue", "runs": a.runs, "per_s": round(a.runs / t.seconds, 1)}


def cmd_latency(a: argparse.Namespace) -> dict[str, Any]:
    """Pickup latency as for every peer: job k's step appends its wall-clock start to a file
    (bench/ours/bench_jobs), minus the time.time() this enqueuer took right after job k's
    enqueue committed (autocommit: enqueue returns once the commit is acknowledged)."""
    starts = Path(f"/tmp/bench-ours-{os.getpid()}.latency")
    starts.unlink(missing_ok=True)
    env = {"TASKS_NOTIFY": "0" if a.no_notify else "1", "BENCH_LATENCY_FILE": str(starts)}
    with database() as url:
        setup_django(url)
        from django.conf import settings

        from tasks_engine import enqueue

        settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "NOTIFY": not a.no_notify}
        args = [*concurrency_args(a.concurrency), "--poll-interval", str(a.poll)]
        proc = worker(url, *args, env=env)
        try:
            wait_ready(proc, listening=not a.no_notify)
            committed: dict[int, float] = {}
            for k in range(a.runs):
                enqueue("bench_pickup", {"k": k})
                committed[k] = time.time()
                time.sleep(a.gap)
            wait_all_finished("bench_pickup", a.runs)
        finally:
            proc.terminate()
            proc.wait()
        started = dict(line.split() for line in starts.read_text().splitlines())
        starts.unlink()
        lat = [(float(started[str(k)]) - t) * 1000 for k, t in committed.items()]
        return {
            "bench": "latency",
            "notify": not a.no_notify,
            "poll_s": a.poll,
            "runs": a.runs,
            "concurrency": a.concurrency,
            "worker_concurrency": worker_concurrency(a.concurrency),
            "p50_ms": round(percentile(lat, 50), 2),
            "p99_ms": round(percentile(lat, 99), 2),
            "max_ms": round(max(lat), 2),
            "worker_code": worker_code(proc),
        }


def fill(waiting: int, finished: int) -> None:
    from django.db import connection

    with connection.cursor() as cur:
        if waiting:
            cur.execute(
                "INSERT INTO tasks_engine_workflowrun (id, task_name, version, queue, status,"
                " priority, input, idempotency_key, input_hash, trace_id, attempts, failures,"
                " worker_id, available_at, waiting_on, cancel_reason, parent_step,"
                " unreached_steps, created_at, updated_at)"
                " SELECT gen_random_uuid(), 'bench_noop', 1, 'default', 'waiting', 0, '{}',"
                " NULL, '', '', 1, 0, '', now() + interval '30 days', 'sleep:far', '', '', '[]',"
                " now(), now() FROM generate_series(1, %s)",
                [waiting],
            )
        if finished:
            cur.execute(
                "INSERT INTO tasks_engine_workflowrun (id, task_name, version, queue, status,"
                " priority, input, idempotency_key, input_hash, trace_id, attempts, failures,"
                " worker_id, available_at, waiting_on, cancel_reason, parent_step,"
                " unreached_steps, created_at, updated_at, finished_at)"
                " SELECT gen_random_uuid(), 'bench_noop', 1, 'default', 'completed', 0, '{}',"
                " NULL, '', '', 1, 0, '', NULL, '', '', '', '[]', now(), now(), now()"
                " FROM generate_series(1, %s)",
                [finished],
            )
    settle()


def settle() -> None:
    """Vacuum, analyze, checkpoint and sync, so that a measurement does not share the disk with
    autovacuum, the checkpointer and the kernel writing back a bulk load (a long-lived table
    would not have one behind it): commits wait for WAL flushes, which queue behind that I/O."""
    import os

    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE tasks_engine_workflowrun")
        cur.execute("CHECKPOINT")
    os.sync()


def claim_rate(n: int, enqueue: Callable[[int], None] | None = None) -> float:
    """Claims per second, in-process: claim one run, complete it, repeat. `enqueue(n)` makes
    the runs (default: n runs of bench_noop; bench/flow.py gives keyed ones)."""
    from tasks_engine import transitions

    if enqueue is None:
        enqueue_many("bench_noop", n)
    else:
        enqueue(n)
    with Timer() as t:
        done = 0
        while done < n:
            got = transitions.claim_runs("bench", [("bench_noop", 1)], None, 1, 30)
            if not got:
                break
            transitions.complete_run(got[0].lease, None, [])
            done += 1
    return done / t.seconds


def use_database(name: str) -> None:
    """Point Django's connection at another database of the same server."""
    from django.db import connection

    connection.close()
    connection.settings_dict["NAME"] = name


def cmd_scale(a: argparse.Namespace) -> dict[str, Any]:
    """Two databases on one server, one empty and one loaded, measured alternately (3 rounds,
    medians), so that the machine's noise falls on both alike."""
    import psycopg
    from django.core.management import call_command

    with database() as url:
        server, empty_db = url.rsplit("/", 1)
        with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
            conn.execute('DROP DATABASE IF EXISTS "bench_loaded" WITH (FORCE)')
            conn.execute('CREATE DATABASE "bench_loaded"')
        setup_django(url)
        settle()
        use_database("bench_loaded")
        call_command("migrate", verbosity=0)
        fill(a.waiting, a.finished)
        empty: list[float] = []
        loaded: list[float] = []
        for _ in range(3):
            for name, rates in ((empty_db, empty), ("bench_loaded", loaded)):
                use_database(name)
                rates.append(claim_rate(a.runs))
        e, lo = median(empty), median(loaded)
        return {
            "bench": "scale",
            "claims_per_s_empty": round(e, 1),
            "waiting": a.waiting,
            "finished": a.finished,
            "claims_per_s_loaded": round(lo, 1),
            "ratio": round(lo / e, 3),
        }


def cmd_steps(a: argparse.Namespace) -> dict[str, Any]:
    with database() as url:
        setup_django(url)
        from tasks_engine import enqueue
        from tasks_engine.models import WorkflowRun

        proc = worker(url, "--concurrency", "8", "--poll-interval", "0.5")
        wait_ready(proc, listening=True)
        single = []
        for _ in range(5):
            rid = enqueue("bench_ten_steps").run_id
            while WorkflowRun.objects.get(pk=rid).status != "completed":
                time.sleep(0.002)
            r = WorkflowRun.objects.get(pk=rid)
            assert r.finished_at is not None
            single.append((r.finished_at - r.created_at).total_seconds() * 1000)
        proc.terminate()
        proc.wait()
        WorkflowRun.objects.all().delete()
        enqueue_many("bench_ten_steps", a.runs)
        proc = worker(url, "--concurrency", "8", "--burst")
        proc.wait()
        s = span("bench_ten_steps")
        return {
            "bench": "steps",
            "runs": a.runs,
            "steps_per_s": round(a.runs * 10 / s, 1),
            "single_run_ms_median": round(sorted(single)[len(single) // 2], 1),
            "worker_code": worker_code(proc),
        }


def cmd_flow(a: argparse.Namespace) -> list[dict[str, Any]]:
    """bench/flow.py's row (flow control's cost, owned by bench/flow.py): its measure() where
    this tree's flow.py has one, else its command line's JSON lines."""
    import subprocess
    import sys

    import flow

    measure = getattr(flow, "measure", None)
    if measure is not None:
        row = measure(runs=a.runs, held=a.held, drain_runs=a.drain_runs)
        return [row] if isinstance(row, dict) else list(row)
    cmd = [sys.executable, flow.__file__, "--runs", str(a.runs), "--held", str(a.held)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]


def cmd_key_flow(a: argparse.Namespace) -> list[dict[str, Any]]:
    """bench/key_flow.py's row (issue 46: per-key rate limits against per-queue, enqueue with
    a debounce key against without); none for a tree from before it."""
    import key_flow

    # Looked up as a file: importing tasks_engine.transitions (as find_spec would) needs
    # Django set up, which key_flow.measure does.
    if not (CODE_ROOT / "tasks_engine" / "transitions" / "flow_rate_claims.py").exists():
        return []  # a baseline tree from before issue 46
    return [key_flow.measure(runs=a.runs, rounds=a.rounds)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("drain")
    d.add_argument("--runs", type=int, default=2000)
    d.add_argument("--concurrency", type=int, default=None, help="default: runworker's")
    d.add_argument("--processes", type=int, default=1, help="runworker --processes N")
    d.add_argument(
        "--task",
        default="bench_noop",
        help="the no-op workflow drained: bench_noop, or bench_async_noop (an async def one)",
    )
    d.add_argument(
        "--max-seconds",
        type=float,
        default=0,
        help="measure at most this long (0: the whole queue)",
    )
    e = sub.add_parser("enqueue")
    e.add_argument("--runs", type=int, default=2000)
    lat = sub.add_parser("latency")
    lat.add_argument("--runs", type=int, default=200)
    lat.add_argument("--concurrency", type=int, default=None, help="default: runworker's")
    lat.add_argument("--poll", type=float, default=5.0)
    lat.add_argument("--gap", type=float, default=0.02)
    lat.add_argument("--no-notify", action="store_true")
    s = sub.add_parser("scale")
    s.add_argument("--runs", type=int, default=2000)
    s.add_argument("--waiting", type=int, default=100_000)
    s.add_argument("--finished", type=int, default=0)
    m = sub.add_parser("metrics")
    m.add_argument("--runs", type=int, default=3000)
    m.add_argument("--rounds", type=int, default=3)
    m.add_argument("--concurrency", type=int, default=8)
    st = sub.add_parser("steps")
    st.add_argument("--runs", type=int, default=200)
    f = sub.add_parser("flow")
    f.add_argument("--runs", type=int, default=1000)
    f.add_argument("--held", type=int, default=100_000)
    f.add_argument("--drain-runs", type=int, default=5000)
    kf = sub.add_parser("key_flow")
    kf.add_argument("--runs", type=int, default=500)
    kf.add_argument("--rounds", type=int, default=6)
    a = p.parse_args()
    if a.cmd in ("flow", "key_flow"):
        for row in cmd_flow(a) if a.cmd == "flow" else cmd_key_flow(a):
            print(json.dumps({**row, "code": engine_code()}), flush=True)
        return
    print(json.dumps({**globals()[f"cmd_{a.cmd}"](a), "code": engine_code()}))


if __name__ == "__main__":
    main()
