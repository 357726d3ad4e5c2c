"""Behind PgBouncer in transaction mode, for real: a throwaway cluster, Debian's pgbouncer on
its own port in front of it (tests/pgbouncer.py), and real `runworker` and `runrelay`
processes whose every engine connection goes through the pooler. Enqueue, claims, steps, a
child run, fact waits and the outbox all work; LISTEN goes to LISTEN_URL (direct) or is not
used at all (polling); no session SET and no prepared statement is relied on (PgBouncer 1.18
keeps none). `manage.py check` refuses prepared statements through the pooler."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.helpers import ROOT
from tests.pgbouncer import Bouncer
from tests.pgcluster import Cluster

pytestmark = pytest.mark.postgres_only("a PostgreSQL cluster behind PgBouncer")

DB = "umt_pool"


@pytest.fixture(scope="module")
def pooled() -> Iterator[tuple[Cluster, Bouncer]]:
    # timezone UTC: Django would SET TIME ZONE on every new connection otherwise (a session SET)
    # log_statement: the test reads what the server was sent
    cluster = Cluster(fsync=False, settings={"timezone": "'UTC'", "log_statement": "'all'"})
    cluster.init()
    cluster.start()
    bouncer: Bouncer | None = None
    try:
        cluster.wait_ready()
        cluster.createdb(DB)
        bouncer = Bouncer(cluster, DB).start()
        manage({"DATABASE_URL": cluster.url(DB)}, "migrate", "--noinput")
        yield cluster, bouncer
    finally:
        if bouncer is not None:
            bouncer.stop()
        cluster.destroy()


def env_for(cluster: Cluster, bouncer: Bouncer, *, listen: bool) -> dict[str, str]:
    env = {"DATABASE_URL": bouncer.url(), "DATABASE_TRANSACTION_POOLER": "1"}
    if listen:
        env["TASKS_LISTEN_URL"] = cluster.url(DB)
    return env


def manage(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", **env},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    if check:
        assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done


def start(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def inspect(env: dict[str, str], run_id: str) -> dict[str, Any]:
    return json.loads(manage(env, "tasks", "inspect", run_id, "--json").stdout)


def wait_status(env: dict[str, str], run_id: str, status: str, timeout: float = 60) -> dict:
    end = time.monotonic() + timeout
    while True:
        view = inspect(env, run_id)
        if view["status"] == status or time.monotonic() > end:
            return view
        time.sleep(0.3)


def enqueue(env: dict[str, str], task: str, data: dict[str, Any]) -> str:
    out = manage(env, "tasks", "enqueue", task, "--input", json.dumps(data), "--json").stdout
    return str(json.loads(out)["run_id"])


def server_log(cluster: Cluster) -> str:
    return cluster.log.read_text(errors="replace")


def assert_nothing_session_bound(sent: str, *, listen: bool) -> None:
    """What a transaction pooler would mix up between clients never reached the server:
    session-level SETs, named (prepared) statements, and LISTEN but on LISTEN_URL."""
    assert "idle_in_transaction_session_timeout" not in sent
    assert "plan_cache_mode" not in sent
    assert "execute _pg" not in sent  # psycopg's prepared statements are named _pg3_N
    assert ("LISTEN " in sent) is listen


def test_check_refuses_prepared_statements_through_the_pooler(
    pooled: tuple[Cluster, Bouncer],
) -> None:
    cluster, bouncer = pooled
    env = env_for(cluster, bouncer, listen=True)
    assert manage(env, "check").returncode == 0
    bad = manage({**env, "TASKS_PREPARED_STATEMENTS": "1"}, "check", check=False)
    assert bad.returncode != 0 and "tasks_engine.E020" in bad.stderr
    polling = manage(env_for(cluster, bouncer, listen=False), "check")
    assert "tasks_engine.W022" in polling.stderr


@pytest.mark.parametrize("listen", [True, False], ids=["listen-url", "polling"])
def test_runs_steps_waits_children_and_the_outbox_work_through_pgbouncer(
    pooled: tuple[Cluster, Bouncer], listen: bool
) -> None:
    cluster, bouncer = pooled
    env = env_for(cluster, bouncer, listen=listen)
    marker = 7 if listen else 8  # the cluster is shared by both cases: tell their runs apart
    log_from = len(server_log(cluster))
    procs = [
        start(env, "runworker", "--concurrency", "4", "--poll-interval", "0.2"),
        start(env, "runrelay", "--poll-interval", "0.2"),
    ]
    try:
        steps = enqueue(env, "three_steps", {"n": 3})
        waiter = enqueue(env, "fact_waiter", {"count": 2})
        parent = enqueue(env, "parent", {"value": 21})
        assert wait_status(env, waiter, "waiting")["status"] == "waiting"
        for i in range(2):
            manage(env, "tasks", "signal", waiter, "item", "--payload", json.dumps({"i": i}))
        manage(
            env,
            "shell",
            "-c",
            f"from outbox import publish; publish('test.enqueue_noop', {{'n': {marker}}})",
        )

        assert wait_status(env, steps, "completed")["status"] == "completed"
        assert wait_status(env, waiter, "completed")["output"] == [{"i": 0}, {"i": 1}]
        assert wait_status(env, parent, "completed")["output"] == {"child": {"double": 42}}
        end = time.monotonic() + 60
        while time.monotonic() < end:
            listed = json.loads(manage(env, "tasks", "list", "--task", "noop", "--json").stdout)
            runs = [r for r in listed if r["input"] == {"n": marker}]
            if runs and runs[0]["status"] == "completed":
                break
            time.sleep(0.3)
        assert len(runs) == 1 and runs[0]["status"] == "completed"
    finally:
        for p in procs:
            p.terminate()
        errors = [p.communicate(timeout=60)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errors
    for err in errors:
        assert "prepared statement" not in err and "Traceback" not in err, err
    assert_nothing_session_bound(server_log(cluster)[log_from:], listen=listen)


# -- the pooler without the documented settings --------------------------------------------------

UNDECLARED_SETTINGS = ("DISABLE_SERVER_SIDE_CURSORS", "PREPARED_STATEMENTS")


def undeclared(bouncer: Bouncer) -> dict[str, str]:
    """Through the pooler, but configured as for a direct connection (prepared statements on)."""
    return {"DATABASE_URL": bouncer.url(), "DATABASE_TRANSACTION_POOLER": "0"}


def names_the_settings(text: str) -> bool:
    return all(s in text for s in UNDECLARED_SETTINGS) and "poolers.md" in text


@contextlib.contextmanager
def statements_left_on_every_server_connection(bouncer: Bouncer, n: int = 40) -> Iterator[None]:
    """What other clients leave behind through a transaction pooler: psycopg's first prepared
    statement names on every server connection of the pool (one open transaction per server
    connection, so each lands on another)."""
    conns = [psycopg.connect(bouncer.url()) for _ in range(bouncer.pool_size)]
    try:
        for c in conns:
            for i in range(n):
                c.execute(f"PREPARE _pg3_{i} AS SELECT 1")
        for c in conns:
            c.commit()
        yield
    finally:
        for c in conns:
            c.execute("DEALLOCATE ALL")  # each lands on some server connection: all, together
        for c in conns:
            c.commit()
            c.close()


def test_check_sees_an_undeclared_pooler(pooled: tuple[Cluster, Bouncer]) -> None:
    cluster, bouncer = pooled
    found = manage(undeclared(bouncer), "check", "--database", "default", check=False)
    assert found.returncode != 0 and "tasks_engine.E027" in found.stderr, found.stderr
    assert names_the_settings(found.stderr), found.stderr
    direct = manage({"DATABASE_URL": cluster.url(DB)}, "check", "--database", "default")
    assert "E027" not in direct.stderr
    declared = manage(env_for(cluster, bouncer, listen=True), "check", "--database", "default")
    assert "E027" not in declared.stderr


def test_a_worker_refuses_to_start_behind_an_undeclared_pooler(
    pooled: tuple[Cluster, Bouncer],
) -> None:
    """One clear line and exit 1 at start-up, not 'database unavailable' retried for ever."""
    _, bouncer = pooled
    with statements_left_on_every_server_connection(bouncer):
        done = subprocess.run(
            [sys.executable, "manage.py", "runworker", "--poll-interval", "0.2"],
            cwd=ROOT,
            env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", **undeclared(bouncer)},
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "tasks_engine.E027" in done.stderr and names_the_settings(done.stderr), done.stderr
    assert "database unavailable" not in done.stdout + done.stderr


def test_a_worker_that_meets_a_lost_prepared_statement_stops_naming_the_settings(
    pooled: tuple[Cluster, Bouncer],
) -> None:
    """At run time: the pooler is declared, but prepared statements were left on with the
    system checks skipped (E020 silenced), so nothing at start-up refuses them. The first
    statement that meets another client's prepared statement is logged once as the
    misconfiguration it is, and the worker exits 1 instead of retrying for ever."""
    cluster, bouncer = pooled
    env = {**env_for(cluster, bouncer, listen=True), "TASKS_PREPARED_STATEMENTS": "1"}
    with statements_left_on_every_server_connection(bouncer):
        done = subprocess.run(
            [sys.executable, "manage.py", "runworker", "--skip-checks", "--poll-interval", "0.2"],
            cwd=ROOT,
            env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", **env},
            capture_output=True,
            text=True,
            timeout=30,
        )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    [line] = [x for x in out.splitlines() if "misconfigured for a transaction pooler" in x]
    assert "already exists" in line and names_the_settings(line), line
    assert "database unavailable" not in out, out[-3000:]


def test_enqueue_through_an_undeclared_pooler_names_the_settings(
    pooled: tuple[Cluster, Bouncer],
) -> None:
    _, bouncer = pooled
    code = (
        "import tasks_engine\n"
        "from django.db import ProgrammingError\n"
        "try:\n"
        "    tasks_engine.enqueue('noop', {'n': 99})\n"
        "except ProgrammingError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    with statements_left_on_every_server_connection(bouncer):
        out = manage(undeclared(bouncer), "shell", "-c", code).stdout.strip().splitlines()[-1]
        cli = manage(
            undeclared(bouncer), "tasks", "enqueue", "noop", "--input", '{"n": 98}', check=False
        )
    assert out.startswith("TransactionPoolerError") and names_the_settings(out), out
    assert 'prepared statement "_pg3_0" already exists' in out, out
    assert cli.returncode == 1 and cli.stderr.count("\n") == 1, cli.stderr
    assert cli.stderr.startswith("CommandError: prepared statement"), cli.stderr
    assert names_the_settings(cli.stderr), cli.stderr


@pytest.mark.django_db(transaction=True)
def test_a_worker_thread_meeting_a_lost_prepared_statement_flags_a_misconfiguration() -> None:
    """At run time (a pooler the start-up probe missed: one that hands out its server
    connections round-robin), the first worker thread to meet the error logs one line that
    names the settings, not 'database unavailable', and flags the worker to stop (exit 1)."""
    from django.db import ProgrammingError, connection

    from tasks_engine.db import outages

    with connection.cursor() as cur:  # the server's own error, as a pooler brings it about
        cur.execute("PREPARE umt_twice AS SELECT 1")
        with pytest.raises(ProgrammingError) as raised:
            cur.execute("PREPARE umt_twice AS SELECT 1")
    lines: list[tuple[str, str, dict[str, Any]]] = []

    class Log:
        def error(self, event: str, **kw: Any) -> None:
            lines.append(("error", event, kw))

        def warning(self, event: str, **kw: Any) -> None:
            lines.append(("warning", event, kw))

    outages.misconfigured.clear()
    try:
        for where in ("slot", "claim", "heartbeat"):
            outages.Outage(Log(), where).failed(raised.value)
        assert outages.misconfigured.is_set()
    finally:
        outages.misconfigured.clear()
    [(level, event, kw)] = lines
    assert (level, event) == ("error", "database misconfigured for a transaction pooler")
    assert "already exists" in kw["error"] and names_the_settings(kw["error"]), kw
