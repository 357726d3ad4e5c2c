"""Our engine on its own: drain, enqueue rate, pickup latency, claim rate at scale.

    python bench/engine.py drain --runs 2000 --concurrency 8 [--processes 1] [--max-seconds 10]
    python bench/engine.py enqueue --runs 2000
    python bench/engine.py latency --runs 200 [--no-notify]
    python bench/engine.py scale --waiting 100000 [--finished 0] --runs 2000
    python bench/engine.py steps --runs 200   # 10-step workflows: steps/s and one run's latency
    python bench/engine.py metrics --runs 3000 --rounds 3   # drain with metrics off vs on

Each command uses a fresh database on a throwaway cluster (or on $BENCH_SERVER_URL) and prints
one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from common import Timer, database, median, percentile, setup_django, wait_ready, worker


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


def cmd_drain(a: argparse.Namespace) -> dict[str, Any]:
    with database() as url:
        setup_django(url)
        enqueue_many("bench_noop", a.runs)
        procs = [
            worker(url, "--concurrency", str(a.concurrency), "--burst") for _ in range(a.processes)
        ]
        with Timer() as t:
            window = drained_within("bench_noop", procs, a.max_seconds)
        if window is None:
            wait_all_finished("bench_noop", a.runs, 5)
            done, seconds = a.runs, span("bench_noop")
        else:
            done, seconds = window
        return {
            "bench": "drain",
            "runs": a.runs,
            "processes": a.processes,
            "concurrency": a.concurrency,
            "finished": done,
            "runs_per_s": round(done / seconds, 1),
            "wall_s_incl_startup": round(t.seconds, 2),
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
    env = {"TASKS_NOTIFY": "0" if a.no_notify else "1"}
    with database() as url:
        setup_django(url)
        from django.conf import settings

        from tasks_engine import enqueue
        from tasks_engine.models import WorkflowRun

        settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "NOTIFY": not a.no_notify}
        proc = worker(url, "--concurrency", "8", "--poll-interval", str(a.poll), env=env)
        wait_ready(proc, listening=not a.no_notify)
        ids = []
        for _ in range(a.runs):
            ids.append(enqueue("bench_noop").run_id)
            time.sleep(a.gap)
        wait_all_finished("bench_noop", a.runs)
        proc.terminate()
        proc.wait()
        lat = [
            (r.started_at - r.created_at).total_seconds() * 1000
            for r in WorkflowRun.objects.filter(pk__in=ids)
        ]
        return {
            "bench": "latency",
            "notify": not a.no_notify,
            "poll_s": a.poll,
            "runs": a.runs,
            "p50_ms": round(percentile(lat, 50), 2),
            "p99_ms": round(percentile(lat, 99), 2),
            "max_ms": round(max(lat), 2),
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
        empty, loaded = [], []
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
        }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("drain")
    d.add_argument("--runs", type=int, default=2000)
    d.add_argument("--concurrency", type=int, default=8)
    d.add_argument("--processes", type=int, default=1)
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
    a = p.parse_args()
    print(json.dumps(globals()[f"cmd_{a.cmd}"](a)))


if __name__ == "__main__":
    main()
