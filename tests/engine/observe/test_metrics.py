"""Prometheus metrics: a real worker's /metrics over HTTP, the Django view, the leader's gauge."""

from __future__ import annotations

import functools
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from django.core.management import CommandError, call_command
from django.test import Client, override_settings

import tasks_engine
from tasks_engine import testing
from tasks_engine.models import WorkflowRun
from tasks_engine.observe import metrics
from tests.helpers import FakeClock, drain, wait_for


def _free_port(count: int = 1) -> int:
    """A port free now, with the `count - 1` ports after it free too (supervised workers serve
    on consecutive ports)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if all(_is_free(port + i) for i in range(1, count)):
            return port


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _value(text: str, series: str) -> float | None:
    """The value of one exposition line, `name{labels}` written as Prometheus sorts labels."""
    m = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else None


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200
        return resp.read().decode()


def _scrape_if_up(port: int) -> str:
    """`_scrape`, or "" while the worker is still starting and nothing listens on the port."""
    try:
        return _scrape(port)
    except ConnectionRefusedError:
        return ""
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionRefusedError):
            return ""
        raise


@pytest.mark.process
@pytest.mark.django_db(transaction=True)
def test_a_worker_serves_its_counters_over_http(workers) -> None:
    for n in range(3):
        tasks_engine.enqueue("three_steps", {"n": n})
    tasks_engine.enqueue("fatal")
    tasks_engine.enqueue("observe_fact_timeout")  # stays waiting: the leader's gauge counts it
    port = _free_port()
    w = workers("--metrics-port", str(port), "--concurrency", "2", "--poll-interval", "0.1")
    wait_for(
        lambda: (
            WorkflowRun.objects.filter(status__in=["completed", "failed", "waiting"]).count() == 5
        ),
        what="runs finished",
    )

    def finished() -> str | None:
        text = _scrape(port)
        done = _value(text, 'tasks_runs_finished_total{status="completed",task="three_steps"}')
        return text if done == 3 else None

    text = wait_for(finished, what="counters scraped")
    assert _value(text, 'tasks_runs_finished_total{status="failed",task="fatal"}') == 1
    steps = 'tasks_steps_total{kind="function",status="completed",task="three_steps"}'
    assert _value(text, steps) == 9
    assert _value(text, 'tasks_steps_total{kind="function",status="failed",task="fatal"}') == 1
    assert _value(text, 'tasks_step_duration_seconds_count{task="three_steps"}') == 9
    assert _value(text, 'tasks_step_duration_seconds_bucket{le="+Inf",task="three_steps"}') == 9
    assert _value(text, 'tasks_claim_delay_seconds_count{queue="default"}') == 5
    assert _value(text, "tasks_worker_slots_busy") == 0
    # The maintenance leader's metrics-run-counts service sets the gauge, every 15 s and at
    # once when a worker is elected. w ran that first round before its runs got anywhere, so
    # rather than wait 15 s for its next one: w stops gracefully (resigning), and the worker
    # started next leads at once and serves the gauge.
    w.send(15)
    assert w.wait(30) == 0
    port = _free_port()
    nxt = workers("--metrics-port", str(port), "--poll-interval", "0.1")
    wait_for(
        lambda: _value(_scrape_if_up(port), 'tasks_runs{queue="default",status="waiting"}') == 1,
        what="the new leader's tasks_runs gauge",
    )
    nxt.send(15)
    assert nxt.wait(30) == 0


@pytest.mark.process
@pytest.mark.django_db(transaction=True)
def test_supervised_workers_serve_on_consecutive_ports(workers) -> None:
    port = _free_port(2)
    w = workers(
        "--processes", "2", "--concurrency", "2", "--metrics-port", str(port),
        "--poll-interval", "0.2",
    )  # fmt: skip
    for p in (port, port + 1):
        try:
            text = wait_for(functools.partial(_try_scrape, p), 60, f"metrics on port {p}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{w.log()}") from None
        assert "# TYPE tasks_runs_finished_total counter" in text
    w.send(15)
    assert w.wait(60) == 0


def _try_scrape(port: int) -> str | None:
    try:
        return _scrape(port)
    except OSError:
        return None


@pytest.mark.django_db
def test_a_bad_or_taken_metrics_port_is_a_one_line_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as bad:
        call_command("runworker", "--metrics-port", "70000")
    assert bad.value.code != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "must be a TCP port (1-65535), got '70000'" in err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            call_command("runworker", "--metrics-port", str(port))
    assert not metrics.enabled()  # nothing started


def test_the_worker_metrics_server_answers_head_like_get() -> None:
    """The worker's own server (it has no token: loopback by default) answered HEAD with 405."""
    port = _free_port()
    server = metrics.serve(port)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as got:
            body, kind = got.read(), got.headers["Content-Type"]
        head = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(head, timeout=5) as answered:
            assert (answered.status, answered.headers["Content-Type"]) == (200, kind)
            assert answered.read() == b""
            assert int(answered.headers["Content-Length"]) > 0 and body
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Metrics on in this process, without registering them globally (other tests stay off)."""
    monkeypatch.setattr(metrics, "_enabled", True)
    yield
    metrics.RUNS.clear()


def _samples(metric: object, name: str) -> dict[tuple[str, ...], float]:
    return {
        tuple(s.labels.values()): s.value
        for family in metric.collect()  # type: ignore[attr-defined]
        for s in family.samples
        if s.name == name
    }


@pytest.mark.django_db
def test_the_leader_service_sets_the_runs_gauge(recording: None) -> None:
    from tasks_engine.services import registry

    assert "metrics-run-counts" in {s.name for s in registry.registered()}
    with testing.WorkflowTester() as t:
        waiting = t.start("observe_fact_timeout")
        t.run_until_idle()
        t.start("noop", {"n": 1})
        t.start("noop", {"n": 2}, queue="io")
        assert t.get_run(waiting).status == "waiting"
    assert metrics.refresh_run_counts() == 3
    assert _samples(metrics.RUNS, "tasks_runs") == {
        ("default", "waiting"): 1,
        ("default", "pending"): 1,
        ("io", "pending"): 1,
    }


@pytest.mark.django_db
def test_claim_delay_is_measured_from_when_the_run_was_due(recording: None) -> None:
    before = _samples(metrics.CLAIM_DELAY, "tasks_claim_delay_seconds_sum").get(("default",), 0)
    with testing.WorkflowTester() as t:
        t.start("noop", {"n": 1})
        t.advance(90)  # due for 90 s before anything claims it
        runs = [c.run for c in tasks_engine.transitions.claim_runs("w", [("noop", 1)], None, 1, 30)]
        metrics.record_claims(runs)
    after = _samples(metrics.CLAIM_DELAY, "tasks_claim_delay_seconds_sum")[("default",)]
    assert after - before == 90


@pytest.mark.django_db
def test_the_view_counts_runs_now() -> None:
    with testing.WorkflowTester() as t:
        t.start("noop", {"n": 1})
        t.start("noop", {"n": 2})
        done = t.start("noop", {"n": 3}, queue="io")
        t.run_to_completion(done)
        t.start("noop", {"n": 4}, queue="io")
    resp = Client().get("/metrics/")
    assert resp.status_code == 200
    assert resp["Content-Type"].startswith("text/plain")
    text = resp.content.decode()
    # t.run_to_completion ran every due run: one more enqueue per queue left them pending
    assert _value(text, 'tasks_runs{queue="io",status="pending"}') == 1
    assert _value(text, 'tasks_runs{queue="default",status="pending"}') is None
    assert "tasks_runs_finished_total" not in text  # worker counters live in the workers
    assert Client().post("/metrics/").status_code == 405


@pytest.mark.django_db
def test_head_answers_like_get_without_a_body() -> None:
    """A probe or a monitor that checks the endpoint with HEAD got 405."""
    tasks_engine.enqueue("noop", {"n": 1})
    get = Client().get("/metrics/")
    head = Client().head("/metrics/")
    assert (head.status_code, head["Content-Type"]) == (200, get["Content-Type"])
    assert head.content == b"" and get.content
    with override_settings(TASKS_ENGINE={"METRICS_TOKEN": "s3cret"}):
        sent = Client().head("/metrics/", headers={"Authorization": "Bearer s3cret"})
        assert (sent.status_code, sent.content) == (200, b"")


@pytest.mark.django_db
def test_the_view_can_require_a_bearer_token() -> None:
    with override_settings(TASKS_ENGINE={"METRICS_TOKEN": "s3cret"}):
        for refused in (
            Client().get("/metrics/"),
            Client().get("/metrics/", headers={"Authorization": "Bearer nope"}),
            Client().head("/metrics/"),
        ):
            assert refused.status_code == 401
            # RFC 7235: a 401 names the scheme that would be accepted
            assert refused["WWW-Authenticate"] == "Bearer"
        ok = Client().get("/metrics/", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert b"# TYPE tasks_runs gauge" in ok.content


@pytest.mark.django_db
@pytest.mark.parametrize("header", ["bearer s3cret", "BEARER s3cret", "Bearer  s3cret"])
def test_the_bearer_scheme_is_case_insensitive(header: str) -> None:
    """RFC 7235: the scheme is case-insensitive, and one or more spaces separate it from the
    token (`curl -H 'authorization: bearer ...'` got 401: an outside audit)."""
    with override_settings(TASKS_ENGINE={"METRICS_TOKEN": "s3cret"}):
        assert Client().get("/metrics/", headers={"Authorization": header}).status_code == 200
        for wrong in ("Basic s3cret", "Bearers3cret", "s3cret", "Bearer s3cre", "Bearer"):
            sent = Client().get("/metrics/", headers={"Authorization": wrong})
            assert sent.status_code == 401, wrong


def _steps_since(before: dict[tuple[str, ...], float]) -> dict[tuple[str, ...], float]:
    """tasks_steps_total{task,kind,status} counted since `before` (the counters are global)."""
    now = _samples(metrics.STEPS, "tasks_steps_total")
    return {k: v - before.get(k, 0) for k, v in now.items() if v != before.get(k, 0)}


@pytest.mark.django_db
def test_every_step_kind_is_counted_once_by_the_claim_that_ends_it(recording: None) -> None:
    steps = _samples(metrics.STEPS, "tasks_steps_total")
    durations = _samples(metrics.STEP_DURATION, "tasks_step_duration_seconds_count")
    with testing.WorkflowTester() as t:
        run = t.start("observe_acquire", {"plan_id": 7})
        t.run_until_idle()  # submit, then the fact wait parks the run: not counted yet
        assert _steps_since(steps) == {("observe_acquire", "function", "completed"): 1}
        t.signal(run, "download-done", {"size": 3})
        # claim 2 takes the fact, copies and parks on the sleep; claim 3 (a week later)
        # replays both waits and completes the sleep: each wait counted once, when it ended
        assert t.run_to_completion(run).status == "completed"
        timed_out = t.start("observe_fact_timeout")
        assert t.run_to_completion(timed_out).output == "timed out"
        child = t.start("parent", {"value": 2})
        assert t.run_to_completion(child).output == {"child": {"double": 4}}
        refused = t.start("parent_catches", {"value": 3, "fail": True})
        assert t.run_to_completion(refused).output == "caught: child refused 3"
    assert _steps_since(steps) == {
        ("observe_acquire", "function", "completed"): 3,
        ("observe_acquire", "fact_wait", "completed"): 1,
        ("observe_acquire", "sleep", "completed"): 1,
        ("observe_fact_timeout", "fact_wait", "failed"): 1,
        ("parent", "child", "completed"): 1,
        ("parent_catches", "child", "failed"): 1,
    }
    counts = _samples(metrics.STEP_DURATION, "tasks_step_duration_seconds_count")
    assert counts[("observe_acquire",)] - durations.get(("observe_acquire",), 0) == 5
    assert counts[("parent",)] - durations.get(("parent",), 0) == 1


@pytest.mark.django_db
def test_a_wait_ended_by_the_runs_deadline_is_counted_aborted(recording: None) -> None:
    # The claim that fails the run for its deadline does so before replay: the sleep it had
    # armed is observed there, once (an outside audit found it counted nowhere).
    steps = _samples(metrics.STEPS, "tasks_steps_total")
    finished = _samples(metrics.RUNS_FINISHED, "tasks_runs_finished_total")
    with testing.WorkflowTester() as t:
        run = t.start("deadline_sleeper")
        assert t.run_to_completion(run).status == "failed"
    assert _steps_since(steps) == {
        ("deadline_sleeper", "function", "completed"): 1,
        ("deadline_sleeper", "sleep", "aborted"): 1,
    }
    now = _samples(metrics.RUNS_FINISHED, "tasks_runs_finished_total")
    key = ("deadline_sleeper", "failed")
    assert now[key] - finished.get(key, 0) == 1


@pytest.mark.django_db
def test_a_completion_that_a_cancel_beat_is_counted_canceled(
    recording: None, fake_clock: FakeClock
) -> None:
    # The cancel commits after the handler's last look at it: the completion's write ends the
    # run canceled (test_promises.py), and the counter says so, not "completed".
    finished = _samples(metrics.RUNS_FINISHED, "tasks_runs_finished_total")
    rid = tasks_engine.enqueue("canceled_as_it_returns").run_id
    drain(fake_clock, horizon=0)
    assert WorkflowRun.objects.get(pk=rid).status == "canceled"
    now = _samples(metrics.RUNS_FINISHED, "tasks_runs_finished_total")
    moved = {k: v - finished.get(k, 0) for k, v in now.items() if v != finished.get(k, 0)}
    assert moved == {("canceled_as_it_returns", "canceled"): 1}
