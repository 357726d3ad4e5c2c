"""Where a run's time goes (bench/PROFILE.md): one burst worker draining no-op runs on a
throwaway cluster of its own (fsync on) with pg_stat_statements and auto_explain loaded.

    python bench/hotspots.py [--runs 20000] [--concurrency default 32] [--py-spy]

Per configuration, two drains of the same backlog: a plain one (jobs/s, the worker's CPU from
wait4, the server's CPU from /proc, pg_stat_statements per statement, pg_stat_wal), then, with
--py-spy, one under `py-spy record --gil` (only the thread holding the GIL is sampled: Python
CPU), whose stacks are grouped by phase (claim, build context, executor, group commit, ...)
and by library (psycopg, JSON, Django, threading/queue, the engine's own code). auto_explain
logs the plans (EXPLAIN ANALYZE) of a sample of statements to bench/out/profile/. Prints one
JSON line per configuration; bench/out/profile/ keeps the raw stacks and plans.

Measuring only: py-spy is installed into the project's .venv by hand (`pip install py-spy`),
it is no dependency of the project.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

os.environ["DJANGO_SETTINGS_MODULE"] = "bench_settings"

from common import CODE_ROOT, LOG_DIR, Timer

OUT = LOG_DIR / "profile"
PEERS_PY = Path(__file__).parent / ".venv-peers" / "bin" / "python"
RATE = 500  # py-spy samples per second (--nonblocking: the worker is not paused to sample)
CLK_TCK = os.sysconf("SC_CLK_TCK")

SERVER_SETTINGS = {
    "shared_preload_libraries": "'pg_stat_statements,auto_explain'",
    "pg_stat_statements.track": "all",
    "track_io_timing": "on",
    "auto_explain.log_min_duration": "0",
    "auto_explain.log_analyze": "on",
    "auto_explain.log_buffers": "on",
    "auto_explain.log_timing": "on",
    "auto_explain.sample_rate": "0.002",
}

# (phase, frame-name pattern): the innermost frame that matches names a sample's phase.
PHASES = [
    ("claim (main loop)", re.compile(r"^claim_runs |^claim_guarded ")),
    ("group commit: claim along", re.compile(r"^claim_after_group |^_claim_part")),
    ("group commit: statement", re.compile(r"^write_group ")),
    ("group commit: thread", re.compile(r"^GroupCommit\._commit_loop ")),
    ("slot: hand-off to group commit", re.compile(r"^GroupCommit\.submit ")),
    ("slot: build context", re.compile(r"^prepare \(tasks_engine/executor|^build_context ")),
    ("slot: executor (step API, user code)", re.compile(r"^execute \(tasks_engine/executor")),
    ("slot: take next run", re.compile(r"^Worker\._slot ")),
    ("main loop", re.compile(r"^Worker\.run ")),
    ("heartbeat", re.compile(r"^Heartbeat\.")),
    ("leader, listener, registration", re.compile(r"^Leader\.|^Listener\.|^Registration\.")),
]
LIBRARIES = [
    ("psycopg", ("psycopg/", "psycopg_binary/", "psycopg_pool/")),
    ("JSON", ("json/",)),
    ("Django", ("django/",)),
    ("threading, queue", ("threading.py", "queue.py")),
    ("pydantic", ("pydantic/", "pydantic_core/")),
    ("logging", ("logging/", "structlog/")),
]
FRAME = re.compile(r"^(.*) \(([^:()]+):\d+\)$")


def classify(stack: str) -> tuple[str, str]:
    frames = stack.split(";")
    phase = "startup, imports, other"
    for f in frames:  # outermost first: the last match is the innermost phase
        for name, pattern in PHASES:
            if pattern.search(f):
                phase = name
    library = "engine's own code"
    for f in reversed(frames):
        m = FRAME.match(f)
        path = m.group(2) if m else ""
        hit = next((lib for lib, prefixes in LIBRARIES if path.startswith(prefixes)), None)
        if hit:
            library = hit
            break
        if path.startswith("tasks_engine/") or path.startswith("bench"):
            break
        if path and not path.startswith("<"):
            library = "other stdlib / C"
            break
    return phase, library


def group_stacks(path: Path) -> dict[tuple[str, str], int]:
    out: Counter[tuple[str, str]] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack:
            out[classify(stack)] += int(count)
    return dict(out)


def top_functions(path: Path, n: int = 25) -> list[tuple[str, int]]:
    """Self samples per leaf function."""
    out: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack:
            out[stack.split(";")[-1]] += int(count)
    return out.most_common(n)


# -- the server -----------------------------------------------------------------------------


def proc_cpu(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class ServerCpu:
    """CPU seconds of the cluster's processes (each backend's last value seen, sampled every
    50 ms: a backend that exits between two samples loses at most 50 ms of its count)."""

    def __init__(self, postmaster: int) -> None:
        self.postmaster = postmaster
        self.start: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _pids(self) -> list[int]:
        from harness import children

        return [self.postmaster, *children(self.postmaster)]

    def _sample(self) -> None:
        for pid in self._pids():
            cpu = proc_cpu(pid)
            if cpu is not None:
                self.start.setdefault(pid, cpu if pid in self.known else 0.0)
                self.last[pid] = cpu

    def __enter__(self) -> ServerCpu:
        self.known = set(self._pids())
        self._sample()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self._sample()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def seconds(self) -> float:
        return sum(self.last[p] - self.start.get(p, 0.0) for p in self.last)


def statements(conn: Any, runs: int) -> list[dict[str, Any]]:
    rows = conn.execute(
        "SELECT query, calls, total_exec_time, rows, wal_bytes, shared_blks_hit,"
        " shared_blks_read FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database"
        " WHERE datname = current_database()) ORDER BY total_exec_time DESC LIMIT 15"
    ).fetchall()
    return [
        {
            "query": " ".join(q.split())[:240],
            "calls": calls,
            "calls_per_run": round(calls / runs, 3),
            "exec_ms_per_run": round(total / runs, 4),
            "exec_ms_per_call": round(total / calls, 4) if calls else 0,
            "rows_per_call": round(nrows / calls, 2) if calls else 0,
            "wal_bytes_per_run": round(int(wal) / runs, 1),
            "blocks_per_call": round((hit + read) / calls, 1) if calls else 0,
        }
        for q, calls, total, nrows, wal, hit, read in rows
    ]


def wal(conn: Any) -> dict[str, float]:
    row = conn.execute(
        "SELECT wal_records, wal_bytes, wal_write, wal_sync, wal_write_time, wal_sync_time"
        " FROM pg_stat_wal"
    ).fetchone()
    keys = ("records", "bytes", "writes", "syncs", "write_ms", "sync_ms")
    return dict(zip(keys, (float(x) for x in row), strict=True))


def commits(conn: Any) -> float:
    return float(
        conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()[0]
    )


# -- one drain ------------------------------------------------------------------------------


def drain(
    cluster: Any,
    template: str,
    name: str,
    runs: int,
    concurrency: int | None,
    spy: Path | None,
    processes: int = 1,
) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(cluster.url(), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    url = cluster.url(name)
    args = ["runworker", "--burst"]
    if concurrency is not None:
        args += ["--concurrency", str(concurrency)]
    if processes > 1:
        args += ["--processes", str(processes)]  # wait4: the supervisor's usage has its children's
    cmd = [sys.executable, str(CODE_ROOT / "manage.py"), *args]
    if spy is not None:
        py_spy = shutil.which("py-spy", path=str(Path(sys.executable).parent))
        if py_spy is None:
            raise SystemExit("py-spy is not installed in this venv: pip install py-spy")
        spy_args = ["record", "--gil", "--nonblocking", "-r", str(RATE), "-f", "raw"]
        cmd = [py_spy, *spy_args, "-o", str(spy), "--", *cmd]
    env = {**os.environ, "DATABASE_URL": url, "PYTHONUNBUFFERED": "1"}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset()")
        conn.execute("SELECT pg_stat_reset_shared('wal')")
        commits_before = commits(conn)
        log = open(OUT / f"{name}.log", "wb")  # noqa: SIM115 - closed below
        began = datetime.now(UTC)  # a --warm template's history started before
        with ServerCpu(cluster_pid(cluster)) as server, Timer() as t:
            proc = subprocess.Popen(cmd, env=env, cwd=CODE_ROOT, stdout=log, stderr=log)
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        log.close()
        if proc.returncode:
            raise SystemExit(f"worker exited {proc.returncode}: see {OUT / name}.log")
        span = conn.execute(
            "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at))"
            " FROM tasks_engine_workflowrun WHERE status = 'completed' AND started_at >= %s",
            [began],
        ).fetchone()
        assert span is not None
        done, seconds = int(span[0]), float(span[1])
        assert done == runs, f"{done} of {runs} completed"
        result = {
            "runs_per_s": round(runs / seconds, 1),
            "drain_s": round(seconds, 2),
            "wall_s": round(t.seconds, 2),
            "worker_cpu_us_per_run_incl_startup": round(
                (usage.ru_utime + usage.ru_stime) / runs * 1e6, 1
            ),
            "worker_user_s": round(usage.ru_utime, 2),
            "worker_sys_s": round(usage.ru_stime, 2),
            "server_cpu_us_per_run": round(server.seconds() / runs * 1e6, 1),
            "commits_per_run": round((commits(conn) - commits_before) / runs, 3),
            "wal_per_run": {k: round(v / runs, 3) for k, v in wal(conn).items()},
            "statements": statements(conn, runs),
        }
    return result


def cluster_pid(cluster: Any) -> int:
    return int((cluster.data / "postmaster.pid").read_text().split()[0])


def profile(a: argparse.Namespace) -> None:
    import psycopg

    from tests.pgcluster import Cluster

    OUT.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(fsync=True, settings=SERVER_SETTINGS).init()
    cluster.start()
    try:
        template = "hot_template"
        cluster.createdb(template)
        url = cluster.url(template)
        os.environ["DATABASE_URL"] = url
        from common import setup_django

        setup_django(url)
        from django.db import connection
        from engine import enqueue_many

        if a.warm:
            # A long-lived system: a drained history of as many runs, analyzed (autovacuum
            # would have), then the backlog.
            enqueue_many("bench_noop", a.runs)
            connection.close()
            subprocess.run(
                [sys.executable, str(CODE_ROOT / "manage.py"), "runworker", "--burst"],
                env={**os.environ, "DATABASE_URL": url},
                cwd=CODE_ROOT,
                check=True,
                capture_output=True,
            )
            with connection.cursor() as cur:
                cur.execute("VACUUM ANALYZE")
        enqueue_many("bench_noop", a.runs)
        connection.close()  # no ANALYZE: as bench/engine.py's backlog()
        # An empty worker's start-up and exit, so that per-run CPU can leave it out.
        with psycopg.connect(cluster.url(), autocommit=True) as admin:
            admin.execute('CREATE DATABASE "hot_empty"')
        subprocess.run(
            [sys.executable, str(CODE_ROOT / "manage.py"), "migrate", "-v0"],
            env={**os.environ, "DATABASE_URL": cluster.url("hot_empty")},
            cwd=CODE_ROOT,
            check=True,
        )
        idle = idle_worker_cpu(cluster.url("hot_empty"))
        for rnd in range(a.rounds):
            for processes in a.processes:
                for c in a.concurrency:
                    spy = a.py_spy and rnd == 0 and processes == 1
                    row = one_config(a, cluster, template, c, processes, idle, spy)
                    print(json.dumps({**row, "round": rnd}), flush=True)
        if a.pgqueuer:
            print(json.dumps({"pgqueuer": pgqueuer_drain(cluster, a.runs)}), flush=True)
        shutil.copy(cluster.log, OUT / "postgres-auto_explain.log")
    finally:
        cluster.destroy()


def one_config(
    a: argparse.Namespace,
    cluster: Any,
    template: str,
    c: str,
    processes: int,
    idle: float,
    spy: bool,
) -> dict[str, Any]:
    conc = None if c == "default" else int(c)
    name = f"hot_c{c}_p{processes}"
    row: dict[str, Any] = {"concurrency": c, "processes": processes, "runs": a.runs}
    row["idle_worker_cpu_s"] = idle
    row["plain"] = plain = drain(cluster, template, name, a.runs, conc, None, processes)
    cpu = plain["worker_user_s"] + plain["worker_sys_s"] - idle * processes
    plain["worker_cpu_us_per_run"] = round(cpu / a.runs * 1e6, 1)
    if not spy:
        plain["statements"] = plain["statements"][:3]
        return row
    raw = OUT / f"{name}.stacks.txt"
    row["py_spy"] = drain(cluster, template, name + "_spy", a.runs, conc, raw)
    row["py_spy"].pop("statements")
    groups = group_stacks(raw)
    per_run = 1e6 / RATE / a.runs
    table: dict[str, dict[str, float]] = defaultdict(dict)
    for (phase, lib), n in sorted(groups.items()):
        table[phase][lib] = round(n * per_run, 1)
    row["gil_us_per_run"] = table
    row["gil_us_per_run_total"] = round(sum(groups.values()) * per_run, 1)
    row["top_self"] = [(f, round(n * per_run, 1)) for f, n in top_functions(raw)]
    return row


def pgqueuer_drain(cluster: Any, runs: int) -> dict[str, Any]:
    """PgQueuer on its defaults (bench/peers/drive_pgqueuer.py) on the same cluster: its
    statements, commits, WAL and server CPU per job, for comparison (statistics taken from
    the `postgres` database, filtered to the driver's database; enqueue statements included,
    listed apart by their text)."""
    import psycopg

    name = "hot_pgqueuer"
    cmd = [str(PEERS_PY), str(Path(__file__).parent / "peers" / "drive_pgqueuer.py")]
    cmd += ["--dsn", cluster.url(name), "--mode", "drain", "--jobs", str(runs)]
    cmd += ["--concurrency", "0"]
    with psycopg.connect(cluster.url(), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset()")
        conn.execute("SELECT pg_stat_reset_shared('wal')")
        with ServerCpu(cluster_pid(cluster)) as server:
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        out = json.loads(done.stdout.strip().splitlines()[-1])
        rows = conn.execute(
            "SELECT query, calls, total_exec_time, rows, wal_bytes FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)"
            " ORDER BY total_exec_time DESC LIMIT 12",
            [name],
        ).fetchall()
        commits_n = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [name]
        ).fetchall()[0][0]
        wal_now = wal(conn)
    return {
        "per_s": out["per_s"],
        "server_cpu_us_per_job_incl_enqueue": round(server.seconds() / runs * 1e6, 1),
        "commits_per_job_incl_enqueue": round(commits_n / runs, 3),
        "wal_per_job_incl_enqueue": {k: round(v / runs, 3) for k, v in wal_now.items()},
        "statements": [
            {
                "query": " ".join(q.split())[:240],
                "calls_per_job": round(c / runs, 3),
                "exec_ms_per_job": round(t / runs, 4),
                "rows_per_call": round(r / c, 2) if c else 0,
                "wal_bytes_per_job": round(int(w) / runs, 1),
            }
            for q, c, t, r, w in rows
        ],
    }


def idle_worker_cpu(url: str) -> float:
    """A burst worker's CPU with nothing to do: start-up (imports, Django) and exit."""
    proc = subprocess.Popen(
        [sys.executable, str(CODE_ROOT / "manage.py"), "runworker", "--burst"],
        env={**os.environ, "DATABASE_URL": url},
        cwd=CODE_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, _, usage = os.wait4(proc.pid, 0)
    return round(usage.ru_utime + usage.ru_stime, 3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=20_000)
    p.add_argument("--concurrency", nargs="+", default=["default", "32"])
    p.add_argument("--processes", nargs="+", type=int, default=[1])
    p.add_argument("--rounds", type=int, default=1, help="plain drains of every configuration")
    p.add_argument("--py-spy", action="store_true", help="also a drain under py-spy --gil")
    p.add_argument("--pgqueuer", action="store_true", help="and PgQueuer's drain, server side")
    p.add_argument(
        "--warm",
        action="store_true",
        help="the backlog behind as many drained, analyzed runs (a long-lived table's plans)",
    )
    profile(p.parse_args())


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent / "peers"))
    main()
