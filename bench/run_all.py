"""Peer comparison (`make bench`): our engine against PgQueuer, Procrastinate, DBOS and
django-tasks-db on one throwaway PostgreSQL cluster (fsync on, every engine on its durable
defaults), alternating engines, N repetitions; then bench/report.py writes bench/results.md and
bench/results.png.

    .venv/bin/python bench/run_all.py                       # the full run (see results.md)
    .venv/bin/python bench/run_all.py --reps 1 --jobs 200 --quick   # smoke test

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
import signal
import subprocess
import sys
import threading
import time
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
# peer -> (driver script, modules that must import, distributions whose version we report)
PEERS: dict[str, tuple[str, list[str], list[str]]] = {
    "pgqueuer": ("drive_pgqueuer.py", ["pgqueuer", "asyncpg"], ["pgqueuer", "asyncpg"]),
    "procrastinate": ("drive_procrastinate.py", ["procrastinate"], ["procrastinate"]),
    "dbos": ("drive_dbos.py", ["dbos"], ["dbos", "SQLAlchemy"]),
    "django-tasks-db": ("drive_django_tasks_db.py", ["django_tasks_db"], ["django-tasks-db"]),
}
# Extra configuration, drain with one process only: PgQueuer on its own defaults (no cap).
PGQ_DEFAULTS = "pgqueuer (defaults)"


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
    def __init__(self, a: argparse.Namespace, server: str, na: dict[str, str]) -> None:
        self.a = a
        self.server = server
        self.na = na
        self.results: list[dict[str, Any]] = []
        self.failed: dict[tuple[str, str], int] = {}

    def engines(self, rep: int, names: list[str]) -> list[str]:
        """The run order of this repetition: rotated, so no engine always goes first."""
        names = [n for n in names if n == OURS or n.split(" ")[0] not in self.na]
        k = rep % len(names)
        return names[k:] + names[:k]

    def record(self, engine: str, bench: str, rep: int, value: dict[str, Any]) -> None:
        shown = value.get("error") or {
            k: v for k, v in value.items() if k not in ("bench", "peer", "mode", "seconds")
        }
        value = {**value, "engine": engine, "bench": bench, "rep": rep}
        self.results.append(value)
        log(f"{bench:<8} {engine:<20} rep {rep + 1}: {shown}")
        if "error" in value:
            self.failed[(engine, bench)] = self.failed.get((engine, bench), 0) + 1

    def skip(self, engine: str, bench: str) -> bool:
        return self.failed.get((engine, bench), 0) >= 2

    def ours(self, bench: str, rep: int, *args: str, rss: bool = False) -> None:
        if self.skip(OURS, bench):
            return
        cmd = [sys.executable, str(BENCH / "engine.py"), *args]
        env = {"BENCH_SERVER_URL": self.server}
        if rss:
            self.record(OURS, bench, rep, measure_ours_rss(cmd, self.a.timeout, env))
        else:
            self.record(OURS, bench, rep, measure(cmd, self.a.timeout, env))

    def peer(self, engine: str, bench: str, rep: int, mode: str, **opts: Any) -> None:
        if self.skip(engine, bench):
            return
        name = engine.split(" ")[0]
        db = "bench_" + name.replace("-", "_")
        cmd = [str(PEERS_PY), str(BENCH / "peers" / PEERS[name][0])]
        cmd += ["--dsn", f"{self.server}/{db}", "--mode", mode]
        for k, v in opts.items():
            cmd += [f"--{k.replace('_', '-')}", str(v)]
        self.record(engine, bench, rep, measure(cmd, self.a.timeout))

    # -- the benchmarks, one repetition each --

    def enqueue(self, rep: int) -> None:
        n = self.a.enqueue_jobs
        for e in self.engines(rep, [OURS, *PEERS]):
            if e == OURS:
                self.ours("enqueue", rep, "enqueue", "--runs", str(n))
            else:
                self.peer(e, "enqueue", rep, "enqueue", jobs=n)

    def drain(self, rep: int, processes: int, concurrency: int, bench: str) -> None:
        n = self.a.rss_jobs if bench == "rss" else self.a.jobs
        names = [OURS, *PEERS] + ([PGQ_DEFAULTS] if bench == "drain1" else [])
        for e in self.engines(rep, names):
            if e == OURS:
                args = ["drain", "--runs", str(n), "--concurrency", str(concurrency)]
                args += ["--processes", str(processes), "--max-seconds", str(self.a.drain_seconds)]
                self.ours(bench, rep, *args, rss=bench == "rss")
            else:
                c = 0 if e == PGQ_DEFAULTS else concurrency
                self.peer(
                    e,
                    bench,
                    rep,
                    "drain",
                    jobs=n,
                    processes=processes,
                    concurrency=c,
                    max_seconds=self.a.drain_seconds,
                )

    def latency(self, rep: int) -> None:
        n = self.a.latency_jobs
        for e in self.engines(rep, [OURS, *PEERS]):
            if e == OURS:
                self.ours("latency", rep, "latency", "--runs", str(n))
            else:
                self.peer(e, "latency", rep, "latency", jobs=n)

    def steps(self, rep: int) -> None:
        n = self.a.workflows
        for e in self.engines(rep, [OURS, "dbos"]):
            if e == OURS:
                self.ours("steps", rep, "steps", "--runs", str(n))
            else:
                self.peer(e, "steps", rep, "steps", jobs=n, concurrency=8)

    def pgbench(self, rep: int) -> None:
        self.record("pgbench", "pgbench", rep, pgbench(self.server, self.a.pgbench_seconds))

    def scale(self) -> None:
        args = ["scale", "--finished", str(self.a.finished), "--waiting", str(self.a.waiting)]
        self.ours("scale", 0, *args)


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
        pg = conn.execute("SHOW server_version").fetchone()[0]
        settings = {
            k: conn.execute(f"SHOW {k}").fetchone()[0]
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--jobs", type=int, default=5000, help="jobs per drain")
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
    p.add_argument("--pgbench-seconds", type=int, default=5)
    p.add_argument("--timeout", type=float, default=300, help="seconds per measurement")
    p.add_argument("--quick", action="store_true", help="small scale bench, short pgbench")
    p.add_argument("--out", type=Path, default=BENCH, help="where results.md/.png/.json go")
    p.add_argument("--note", action="append", default=[], help="a line for results.md")
    a = p.parse_args()
    if a.quick:
        a.finished, a.waiting, a.pgbench_seconds = 20_000, 2_000, 3
        a.rss_jobs = min(a.rss_jobs, a.jobs)
    started = time.monotonic()
    load_before = os.getloadavg()
    na = ensure_peers_venv()
    for what, why in na.items():
        log(f"n/a {what}: {why}")

    cluster = Cluster(fsync=True).init()
    cluster.start()
    server = f"postgres://postgres@127.0.0.1:{cluster.port}"
    log(f"throwaway PostgreSQL on port {cluster.port} (fsync on)")
    h = Harness(a, server, na)
    try:
        info = machine(server)
        for rep in range(a.reps):
            log(f"repetition {rep + 1}/{a.reps}")
            h.enqueue(rep)
            h.drain(rep, 1, 8, "drain1")
            h.drain(rep, 2, 8, "drain2")
            h.latency(rep)
            h.steps(rep)
            h.pgbench(rep)
            if rep < a.rss_reps:
                h.drain(rep, 1, 16, "rss")
        h.scale()
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
        "notes": a.note,
        "na": na,
        "results": h.results,
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "results.json").write_text(json.dumps(raw, indent=1) + "\n")
    py = str(PEERS_PY) if "matplotlib" not in na else sys.executable
    report = run([py, str(BENCH / "report.py"), str(a.out / "results.json")], 120)
    sys.stderr.write(report.stderr)
    log(f"done in {raw['wall_seconds']} s: {a.out / 'results.md'}")
    if report.returncode:
        raise SystemExit(report.returncode)


if __name__ == "__main__":
    main()
