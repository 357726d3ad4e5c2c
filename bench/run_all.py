"""Peer comparison (`make bench`): our engine against PgQueuer, Procrastinate, DBOS,
django-tasks-db and Celery on Redis on one throwaway PostgreSQL cluster (fsync on, every engine
on its durable defaults; Celery's redis-server is its own, on its defaults), alternating
engines, N repetitions; then bench/report.py writes bench/results.md and
bench/results.png and updates README.md's benchmark sentence.

    .venv/bin/python bench/run_all.py                    # the full run (see results.md)
    .venv/bin/python bench/run_all.py --baseline main~3  # and ours at that commit, alternating
    .venv/bin/python bench/run_all.py --quick            # 2,000 jobs, 1 repetition: bench/out/quick
    .venv/bin/python bench/run_all.py --issue-rows --out /tmp/x  # enqueue, pickup, default drains
    .venv/bin/python bench/run_all.py --only async       # some sections only (see --only)

With --baseline REF, our engine at REF (a `git worktree add` of it in a temporary directory,
driven by this checkout's bench/engine.py with this .venv, $BENCH_CODE_ROOT pointing at the
worktree: see bench/common.py) is measured right before or after each of our measurements, in
alternating order, and the report shows ours ÷ baseline per row; a measurement whose driver or
worker imported tasks_engine from anywhere else is an error, not a number.

Our numbers come from bench/engine.py (this interpreter, $BENCH_SERVER_URL pointing at the
cluster); each peer's from bench/peers/drive_<peer>.py run with bench/.venv-peers/bin/python,
which this script creates from bench/requirements-peers.txt. A peer that cannot be installed or
run is reported as n/a with the reason; it never fails the run.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH / "peers"))

import harness  # noqa: E402  (bench/peers/harness.py: RSS sampling)

from tests.pgcluster import Cluster, pg_bin  # noqa: E402

PEERS_VENV = BENCH / ".venv-peers"
PEERS_PY = PEERS_VENV / "bin" / "python"
REQUIREMENTS = BENCH / "requirements-peers.txt"
OUT = BENCH / "out"

OURS = "ours"
BASELINE = "baseline"
# The peers whose drains run at eight in flight only, on --slow-jobs: they drain a few hundred
# jobs/s, so the --drain-seconds window ends long before 5,000 are done.
SLOW_PEERS = ("procrastinate", "dbos", "django-tasks-db")
# Ours and PgQueuer: (processes, concurrency) drained; None is the engine's own default.
SWEEP = [(p, c) for p in (1, 2) for c in (None, 8, 16, 32, 64)]
HEADLINE = [(p, c) for p in (1, 2) for c in (None, 32)]
# The async rows (issue 44): async no-op runs (bench_async_noop, an `async def` workflow) drained
# by ours at each concurrency, against PgQueuer (asyncio-native) capped at it on its default
# batch (10; at concurrency 16, 8: PgQueuer wants max_concurrent_tasks >= 2 x batch_size).
ASYNC_SWEEP = [(p, c) for p in (1, 2) for c in (16, 64, 256)]
ASYNC_TASK = "bench_async_noop"
PGQUEUER_BATCH = 10
# What --only can pick: the sections of a run, in their order.
SECTIONS = ("enqueue", "latency", "drain", "async", "steps", "pgbench", "rss", "scale", "flow")
# peer -> (driver script, modules that must import, distributions whose version we report)
PEERS: dict[str, tuple[str, list[str], list[str]]] = {
    "pgqueuer": ("drive_pgqueuer.py", ["pgqueuer", "asyncpg"], ["pgqueuer", "asyncpg"]),
    "procrastinate": ("drive_procrastinate.py", ["procrastinate"], ["procrastinate"]),
    "dbos": ("drive_dbos.py", ["dbos"], ["dbos", "SQLAlchemy"]),
    "django-tasks-db": ("drive_django_tasks_db.py", ["django_tasks_db"], ["django-tasks-db"]),
    "celery": ("drive_celery.py", ["celery", "redis"], ["celery", "kombu", "redis"]),
}
# The peers drained on their own defaults beside ours (the headline); Celery only there (its
# prefork pool has no "in flight" setting but its process count).
DEFAULT_PEERS = ("pgqueuer", "celery")


def drain_key(processes: int, concurrency: int | None) -> str:
    """The bench name of a drain: "drain p1 c32", "drain p2 cdefault"."""
    return f"drain p{processes} c{concurrency or 'default'}"


def async_drain_key(processes: int, concurrency: int) -> str:
    """The bench name of an async drain: "async drain p1 c64"."""
    return f"async drain p{processes} c{concurrency}"


def pgqueuer_async_batch(concurrency: int) -> int:
    """PgQueuer's batch on an async row: its default, as far as its own rule allows."""
    return max(1, min(PGQUEUER_BATCH, concurrency // 2))


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- the peers' virtual environment ----------------------------------------------------------


def ensure_peers_venv() -> dict[str, str]:
    """Create/refresh bench/.venv-peers; return {peer or 'matplotlib': reason} for what failed."""
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    stamp = PEERS_VENV / ".installed"
    failures: dict[str, str] = {}
    if not (stamp.exists() and stamp.read_text() == digest):
        log("installing the peers into bench/.venv-peers")
        if not PEERS_PY.exists():
            made = run([sys.executable, "-m", "venv", str(PEERS_VENV)], 300)
            if made.returncode:
                reason = "cannot create bench/.venv-peers: " + tail(made.stderr)
                return {p: reason for p in [*PEERS, "matplotlib"]}
        pip = [str(PEERS_PY), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        whole = run([*pip, "-r", str(REQUIREMENTS)], 900)
        if whole.returncode:
            # One by one, so that one broken peer costs only its own row.
            for line in REQUIREMENTS.read_text().splitlines():
                req = line.split("#")[0].strip()
                if req and run([*pip, req], 600).returncode:
                    failures[req] = "pip install failed: " + tail(whole.stderr)
        else:
            stamp.write_text(digest)
    reasons: dict[str, str] = {}
    for peer, (_, modules, _) in PEERS.items():
        check = run([str(PEERS_PY), "-c", "import " + ", ".join(modules)], 120)
        if check.returncode:
            broken = "; ".join(f"{r}: {why}" for r, why in failures.items()) or tail(check.stderr)
            reasons[peer] = f"not importable ({broken})"
    if run([str(PEERS_PY), "-c", "import matplotlib"], 120).returncode:
        reasons["matplotlib"] = "matplotlib not installed: no chart"
    return reasons


def versions() -> dict[str, str]:
    dists = ["Django", "psycopg", "matplotlib"] + [d for p in PEERS.values() for d in p[2]]
    code = (
        "import json, importlib.metadata as m\n"
        "out = {}\n"
        f"for d in {dists!r}:\n"
        "    try: out[d] = m.version(d)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))"
    )
    got = run([str(PEERS_PY), "-c", code], 60)
    peers = json.loads(got.stdout) if got.returncode == 0 else {}
    ours = run([sys.executable, "-c", code.replace(repr(dists), "['Django', 'psycopg']")], 60)
    mine = json.loads(ours.stdout) if ours.returncode == 0 else {}
    return {
        **{f"peers venv: {k}": v for k, v in peers.items()},
        **{f"project venv: {k}": v for k, v in mine.items()},
    }


# -- running one measurement -------------------------------------------------------------------


def run(cmd: list[str], timeout: float, env: dict[str, str] | None = None):
    """Run ``cmd`` in a session of its own; on timeout, kill that whole process group (a hung
    driver's workers included), so nothing it started outlives the measurement."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        stdout, _ = proc.communicate()
        stderr = f"timed out after {timeout:.0f} s"
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def tail(text: str | bytes | None) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    lines = [x.strip() for x in (text or "").strip().splitlines() if x.strip()]
    return (lines[-1] if lines else "no output")[:300]


def last_json(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return None


def measure(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    started = time.monotonic()
    done = run(cmd, timeout, env)
    out = last_json(done.stdout) if done.returncode == 0 else None
    if out is None:
        return {"error": tail(done.stderr) or f"exit {done.returncode}"}
    out["seconds"] = round(time.monotonic() - started, 1)
    return out


def measure_lines(
    cmd: list[str], timeout: float, env: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Every JSON line of a driver that prints several rows (bench/engine.py flow); each
    row's own name is its "bench" key, kept as "row"."""
    done = run(cmd, timeout, env)
    rows = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode or not rows:
        return [{"error": tail(done.stderr) or f"exit {done.returncode}"}]
    if len(rows) > 1:
        return [{**r, "row": r["bench"]} for r in rows]
    return rows


def measure_ours_rss(cmd: list[str], timeout: float, env: dict[str, str]) -> dict[str, Any]:
    """bench/engine.py drain, sampling the RSS of the worker processes it starts."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, **env},
        start_new_session=True,
    )
    peaks: dict[int, float] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for child in harness.children(proc.pid):
                peaks[child] = max(peaks.get(child, 0.0), harness.tree_rss_mib(child))
            stop.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
    stop.set()
    sampler.join()
    out = last_json(stdout) if proc.returncode == 0 else None
    if out is None:
        return {"error": tail(stderr) or f"exit {proc.returncode}"}
    out["rss_mib"] = round(max(peaks.values(), default=0.0), 1)
    return out


class Harness:
    def __init__(
        self, a: argparse.Namespace, server: str, na: dict[str, str], baseline: Path | None
    ) -> None:
        self.a = a
        self.server = server
        self.na = na
        self.baseline = baseline
        self.results: list[dict[str, Any]] = []
        self.failed: dict[tuple[str, str], int] = {}

    def engines(self, rep: int, names: list[str]) -> list[str]:
        """The run order of this repetition: rotated, so no engine always goes first; the
        baseline (with --baseline) right after ours in even repetitions, right before in odd
        ones, so that each pair sees the same machine and neither always goes first."""
        names = [n for n in names if n == OURS or n not in self.na]
        k = rep % len(names)
        order = names[k:] + names[:k]
        if self.baseline is not None and OURS in order:
            i = order.index(OURS) + (1 if rep % 2 == 0 else 0)
            order.insert(i, BASELINE)
        return order

    def record(self, engine: str, bench: str, rep: int, value: dict[str, Any]) -> None:
        hidden = ("bench", "peer", "mode", "seconds", "code", "worker_code")
        shown = value.get("error") or {k: v for k, v in value.items() if k not in hidden}
        value = {**value, "engine": engine, "bench": bench, "rep": rep}
        self.results.append(value)
        log(f"{bench:<18} {engine:<16} rep {rep + 1}: {shown}")
        if "error" in value:
            self.failed[(engine, bench)] = self.failed.get((engine, bench), 0) + 1

    def peers(self) -> list[str]:
        """The peers of the enqueue and pickup rows: every one, or with --issue-rows the
        issue's two."""
        return list(DEFAULT_PEERS) if self.a.issue_rows else list(PEERS)

    def skip(self, engine: str, bench: str) -> bool:
        return self.failed.get((engine, bench), 0) >= 2

    def ours(self, engine: str, bench: str, rep: int, *args: str, rss: bool = False) -> None:
        """bench/engine.py on our current code, or (engine == BASELINE) on the baseline's."""
        for value in self.ours_rows(engine, bench, *args, rss=rss):
            self.record(engine, value.pop("row", bench), rep, value)

    def ours_rows(
        self,
        engine: str,
        bench: str,
        *args: str,
        rss: bool = False,
        script: str = "engine.py",
        timeout: float | None = None,
    ) -> list[dict[str, Any]]:
        if self.skip(engine, bench):
            return []
        root = self.baseline if engine == BASELINE else ROOT
        assert root is not None
        cmd = [sys.executable, str(BENCH / script), *args]
        env = {"BENCH_SERVER_URL": self.server, "BENCH_CODE_ROOT": str(root)}
        if rss:
            rows = [measure_ours_rss(cmd, timeout or self.a.timeout, env)]
        else:
            rows = measure_lines(cmd, timeout or self.a.timeout, env)
        return [check_code(row, root) for row in rows]

    def peer(self, engine: str, bench: str, rep: int, mode: str, **opts: Any) -> None:
        if self.skip(engine, bench):
            return
        db = "bench_" + engine.replace("-", "_")
        cmd = [str(PEERS_PY), str(BENCH / "peers" / PEERS[engine][0])]
        cmd += ["--dsn", f"{self.server}/{db}", "--mode", mode]
        for k, v in opts.items():
            cmd += [f"--{k.replace('_', '-')}", str(v)]
        self.record(engine, bench, rep, measure(cmd, self.a.timeout))

    # -- the benchmarks, one repetition each --

    def enqueue(self, rep: int) -> None:
        n = self.a.enqueue_jobs
        for e in self.engines(rep, [OURS, *self.peers()]):
            if e in (OURS, BASELINE):
                self.ours(e, "enqueue", rep, "enqueue", "--runs", str(n))
            else:
                self.peer(e, "enqueue", rep, "enqueue", jobs=n)

    def drain(self, rep: int, processes: int, concurrency: int | None) -> None:
        """One drain configuration: ours and PgQueuer (concurrency None: each on its own
        defaults, and Celery on its own), and at eight in flight the slow peers too."""
        bench = drain_key(processes, concurrency)
        names = [OURS, "pgqueuer", *(SLOW_PEERS if concurrency == 8 else ())]
        if concurrency is None:
            names.append("celery")
        for e in self.engines(rep, names):
            n = self.a.slow_jobs if e in SLOW_PEERS else self.a.jobs
            window = ["--max-seconds", str(self.a.drain_seconds)]
            if e in (OURS, BASELINE):
                args = ["drain", "--runs", str(n), "--processes", str(processes), *window]
                if concurrency is not None:
                    args += ["--concurrency", str(concurrency)]
                self.ours(e, bench, rep, *args)
            else:
                self.peer(
                    e,
                    bench,
                    rep,
                    "drain",
                    jobs=n,
                    processes=processes,
                    concurrency=concurrency or 0,  # 0: PgQueuer batch 10, no cap; Celery's own
                    max_seconds=self.a.drain_seconds,
                )

    def async_drain(self, rep: int, processes: int, concurrency: int) -> None:
        """One async configuration: our async no-op runs and PgQueuer's (its jobs are
        coroutines on its loop anyway), at the same concurrency, the same window."""
        bench = async_drain_key(processes, concurrency)
        for e in self.engines(rep, [OURS, "pgqueuer"]):
            if e in (OURS, BASELINE):
                args = ["drain", "--task", ASYNC_TASK, "--runs", str(self.a.jobs)]
                args += ["--processes", str(processes), "--concurrency", str(concurrency)]
                self.ours(e, bench, rep, *args, "--max-seconds", str(self.a.drain_seconds))
            else:
                self.peer(
                    e,
                    bench,
                    rep,
                    "drain",
                    jobs=self.a.jobs,
                    processes=processes,
                    concurrency=concurrency,
                    batch_size=pgqueuer_async_batch(concurrency),
                    max_seconds=self.a.drain_seconds,
                )

    def rss(self, rep: int) -> None:
        n = self.a.rss_jobs
        for e in self.engines(rep, [OURS, *PEERS]):
            if e in (BASELINE, "celery"):
                continue
            if e == OURS:
                args = ["drain", "--runs", str(n), "--concurrency", "16", "--max-seconds", "10"]
                self.ours(e, "rss", rep, *args, rss=True)
            else:
                self.peer(e, "rss", rep, "drain", jobs=n, concurrency=16, max_seconds=10)

    def latency(self, rep: int) -> None:
        """Every engine's worker on its defaults (PgQueuer: batch 10, no cap) but the peers
        that need a concurrency (Procrastinate, DBOS: 8, as before)."""
        n = self.a.latency_jobs
        for e in self.engines(rep, [OURS, *self.peers()]):
            if e in (OURS, BASELINE):
                self.ours(e, "latency", rep, "latency", "--runs", str(n))
            else:
                c = 0 if e in DEFAULT_PEERS else 8
                self.peer(e, "latency", rep, "latency", jobs=n, concurrency=c)

    def steps(self, rep: int) -> None:
        n = self.a.workflows
        for e in self.engines(rep, [OURS, "dbos"]):
            if e in (OURS, BASELINE):
                self.ours(e, "steps", rep, "steps", "--runs", str(n))
            else:
                self.peer(e, "steps", rep, "steps", jobs=n, concurrency=8)

    def pgbench(self, rep: int) -> None:
        self.record("pgbench", "pgbench", rep, pgbench(self.server, self.a.pgbench_seconds))

    def scale(self) -> None:
        args = ["scale", "--finished", str(self.a.finished), "--waiting", str(self.a.waiting)]
        for e in self.engines(0, [OURS]):
            self.ours(e, "scale", 0, *args)
        # Issue 47's row: enqueue and claim + complete with --history finished runs of a month
        # in the table against an empty one (bench/history.py; 10,000,000 on its own).
        history = ["--history", str(self.a.history), "--runs", str(self.a.history_runs)]
        for e in self.engines(0, [OURS]):
            # The fill writes about 10,000 runs a second here: its time on top of a measurement's.
            timeout = self.a.timeout + self.a.history / 5000
            rows = self.ours_rows(e, "history", *history, script="history.py", timeout=timeout)
            for value in rows:
                self.record(e, "history", 0, value)

    def flow(self) -> None:
        """bench/flow.py's rows (flow control on against off, in-process and as a worker drains;
        held back by one key)."""
        args = ["flow", "--runs", str(self.a.flow_runs), "--held", str(self.a.held)]
        args += ["--drain-runs", str(self.a.flow_drain_runs)]
        for e in self.engines(0, [OURS]):
            self.ours(e, "flow", 0, *args)

    def key_flow(self) -> None:
        """bench/key_flow.py's row (per-key rate limits against per-queue ones; enqueue with a
        debounce key against without)."""
        for e in self.engines(0, [OURS]):
            self.ours(e, "key_flow", 0, "key_flow", "--runs", str(self.a.flow_runs))


def check_code(row: dict[str, Any], root: Path) -> dict[str, Any]:
    """An error instead of the numbers when the driver or its worker imported tasks_engine
    from anywhere but `root` (e.g. the editable install instead of the baseline's tree)."""
    if "error" in row:
        return row
    want = str((root / "tasks_engine").resolve())
    got = {k: row[k] for k in ("code", "worker_code") if row.get(k)}
    wrong = {k: v for k, v in got.items() if v != want}
    if wrong or "code" not in got:
        return {"error": f"measured the wrong tree: {wrong or 'no code path'} (wanted {want})"}
    return row


# -- the physical limit ----------------------------------------------------------------------

PGBENCH_SCRIPT = """\
BEGIN;
INSERT INTO q (payload) VALUES ('{}');
UPDATE q SET status = 'running', claimed_at = now()
 WHERE id = (SELECT id FROM q WHERE status = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED);
COMMIT;
"""


def pgbench(server: str, seconds: int) -> dict[str, Any]:
    """pgbench, 8 clients: one INSERT and one SKIP LOCKED claim per transaction."""
    import psycopg

    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS bench_pgbench WITH (FORCE)")
        conn.execute("CREATE DATABASE bench_pgbench")
    with psycopg.connect(f"{server}/bench_pgbench", autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE q (id bigserial PRIMARY KEY, payload jsonb NOT NULL,"
            " status text NOT NULL DEFAULT 'queued', created_at timestamptz NOT NULL DEFAULT"
            " now(), claimed_at timestamptz)"
        )
        conn.execute("CREATE INDEX q_queued ON q (id) WHERE status = 'queued'")
    OUT.mkdir(exist_ok=True)
    script = OUT / "pgbench-claim.sql"
    script.write_text(PGBENCH_SCRIPT)
    host, port = server.rsplit("@", 1)[1].split(":")
    cmd = [pg_bin("pgbench"), "-n", "-c", "8", "-j", "2", "-T", str(seconds), "-f", str(script)]
    cmd += ["-h", host, "-p", port, "-U", "postgres", "bench_pgbench"]
    done = run(cmd, seconds + 60)
    for line in done.stdout.splitlines():
        if line.startswith("tps ="):
            return {"clients": 8, "tps": round(float(line.split()[2]), 1)}
    return {"error": tail(done.stderr) or tail(done.stdout)}


# -- the machine -----------------------------------------------------------------------------


def our_code() -> str:
    """The commit our numbers come from, and whether the engine's files differ from it."""
    commit = run(["git", "rev-parse", "--short", "HEAD"], 10).stdout.strip()
    dirty = run(["git", "status", "--porcelain", "tasks_engine"], 10).stdout.strip()
    return commit + (" + uncommitted changes in tasks_engine/" if dirty else "")


def machine(server: str) -> dict[str, Any]:
    import psycopg

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
    with psycopg.connect(f"{server}/postgres") as conn:
        pg = str(conn.execute("SHOW server_version").fetchall()[0][0])
        settings = {
            k: str(conn.execute(f"SHOW {k}").fetchall()[0][0])
            for k in ("fsync", "synchronous_commit", "wal_sync_method", "shared_buffers")
        }
    commit = our_code()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(int(mem) / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "postgresql": pg,
        "postgresql_settings": settings,
        "our_commit": commit,
    }


@contextlib.contextmanager
def baseline_tree(ref: str | None) -> Iterator[tuple[Path | None, str | None]]:
    """A `git worktree add --detach` of `ref` in a temporary directory (removed afterwards),
    and the commit it resolved to."""
    if ref is None:
        yield None, None
        return
    commit = run(["git", "rev-parse", "--verify", f"{ref}^{{commit}}"], 30)
    if commit.returncode:
        raise SystemExit(f"--baseline {ref}: not a commit ({tail(commit.stderr)})")
    sha = commit.stdout.strip()
    tmp = Path(tempfile.mkdtemp(prefix="bench-baseline-"))
    tree = tmp / "tree"
    added = run(["git", "worktree", "add", "--detach", str(tree), sha], 120)
    if added.returncode:
        raise SystemExit(f"git worktree add {ref}: {tail(added.stderr)}")
    log(f"baseline {ref} = {sha[:10]} in {tree}")
    try:
        yield tree, sha
    finally:
        run(["git", "worktree", "remove", "--force", str(tree)], 120)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--reps", type=int, default=3, help="repetitions of the short rows")
    p.add_argument(
        "--long-reps",
        type=int,
        default=None,
        help="repetitions of the drains outside the headline (concurrency 8, 16, 64);"
        " default 2, or 1 with --baseline (which doubles our rows)",
    )
    p.add_argument("--jobs", type=int, default=20_000, help="jobs per drain (ours, PgQueuer)")
    p.add_argument(
        "--slow-jobs",
        type=int,
        default=5000,
        help="jobs per drain for Procrastinate, DBOS and django-tasks-db (a few hundred/s)",
    )
    p.add_argument(
        "--drain-seconds",
        type=float,
        default=10,
        help="a drain is measured until its queue is empty or for this long, whichever is first",
    )
    p.add_argument("--enqueue-jobs", type=int, default=1000)
    p.add_argument("--latency-jobs", type=int, default=200)
    p.add_argument("--workflows", type=int, default=200, help="10-step workflows per steps run")
    p.add_argument("--rss-reps", type=int, default=1, help="repetitions of the RSS drain")
    p.add_argument("--rss-jobs", type=int, default=2000, help="jobs drained while sampling RSS")
    p.add_argument("--finished", type=int, default=1_000_000)
    p.add_argument("--waiting", type=int, default=100_000)
    p.add_argument(
        "--history",
        type=int,
        default=1_000_000,
        help="finished runs of bench/history.py's loaded table (issue 47 measures 10,000,000)",
    )
    p.add_argument("--history-runs", type=int, default=2000, help="bench/history.py's --runs")
    p.add_argument("--flow-runs", type=int, default=500, help="claims per flow-control round")
    p.add_argument(
        "--flow-drain-runs", type=int, default=5000, help="runs per flow-control worker drain"
    )
    p.add_argument("--held", type=int, default=100_000, help="runs held back by one key")
    p.add_argument("--pgbench-seconds", type=int, default=5)
    p.add_argument("--timeout", type=float, default=300, help="seconds per measurement")
    p.add_argument("--baseline", metavar="REF", help="also measure ours at this git ref")
    p.add_argument(
        "--quick",
        action="store_true",
        help="validate the harness: 2,000 jobs, 1 repetition, small scale rows, bench/out/quick",
    )
    p.add_argument("--out", type=Path, default=None, help="where results.md/.png/.json go")
    p.add_argument(
        "--only",
        action="append",
        choices=SECTIONS,
        default=None,
        help="run only these sections (repeatable; default: all); e.g. --only async for the"
        " async drain rows",
    )
    p.add_argument("--note", action="append", default=[], help="a line for results.md")
    p.add_argument(
        "--issue-rows",
        action="store_true",
        help="only the rows of issue 42's table: enqueue, pickup and the drains on every"
        " engine's defaults (ours, PgQueuer, Celery), 1 and 2 processes",
    )
    a = p.parse_args()
    if a.quick:
        a.reps = a.long_reps = 1
        a.jobs = a.slow_jobs = a.rss_jobs = 2000
        a.finished, a.waiting, a.held, a.flow_runs, a.pgbench_seconds = 20_000, 2_000, 2_000, 300, 3
        a.history, a.history_runs = 20_000, 500
        a.flow_drain_runs = 500
    if a.long_reps is None:
        a.long_reps = 1 if a.baseline else 2
    if a.out is None:
        a.out = OUT / "quick" if a.quick else OUT / "partial" if a.only else BENCH
    only = set(a.only or SECTIONS)
    started = time.monotonic()
    load_before = os.getloadavg()
    na = ensure_peers_venv()
    for what, why in na.items():
        log(f"n/a {what}: {why}")

    with baseline_tree(a.baseline) as (tree, sha):
        cluster = Cluster(fsync=True).init()
        cluster.start()
        server = f"postgres://postgres@127.0.0.1:{cluster.port}"
        log(f"throwaway PostgreSQL on port {cluster.port} (fsync on)")
        h = Harness(a, server, na, tree)
        try:
            info = machine(server)
            for rep in range(a.reps):
                log(f"repetition {rep + 1}/{a.reps}")
                if "enqueue" in only:
                    h.enqueue(rep)
                if "latency" in only:
                    h.latency(rep)
                if a.issue_rows:
                    for processes in (1, 2):
                        h.drain(rep, processes, None)
                    continue
                for processes, concurrency in SWEEP if "drain" in only else ():
                    if (processes, concurrency) in HEADLINE or rep < a.long_reps:
                        h.drain(rep, processes, concurrency)
                for processes, concurrency in ASYNC_SWEEP if "async" in only else ():
                    if rep < a.long_reps:
                        h.async_drain(rep, processes, concurrency)
                if "steps" in only:
                    h.steps(rep)
                if "pgbench" in only:
                    h.pgbench(rep)
                if rep < a.rss_reps and "rss" in only:
                    h.rss(rep)
            if "scale" in only and not a.issue_rows:
                h.scale()
            if "flow" in only and not a.issue_rows:
                h.flow()
                h.key_flow()
        finally:
            cluster.destroy()
    raw = {
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "args": {k: str(v) for k, v in vars(a).items()},
        "machine": info,
        "versions": versions(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "wall_seconds": round(time.monotonic() - started),
        "our_code_after": our_code(),
        "baseline": {"ref": a.baseline, "commit": sha} if a.baseline else None,
        "notes": a.note,
        "na": na,
        "results": h.results,
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "results.json").write_text(json.dumps(raw, indent=1) + "\n")
    py = str(PEERS_PY) if "matplotlib" not in na else sys.executable
    cmd = [py, str(BENCH / "report.py"), str(a.out / "results.json")]
    if a.out.resolve() == BENCH and not a.quick:
        cmd += ["--readme", str(ROOT / "README.md")]
    report = run(cmd, 120)
    sys.stdout.write(report.stdout)  # the issue table among it
    sys.stderr.write(report.stderr)
    log(f"done in {raw['wall_seconds']} s: {a.out / 'results.md'}")
    if report.returncode:
        raise SystemExit(report.returncode)


if __name__ == "__main__":
    main()
