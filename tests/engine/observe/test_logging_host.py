"""The engine's logging respects the host project: structlog is configured by the engine only
when the host has not configured it and has not opted out (TASKS_ENGINE["CONFIGURE_LOGGING"]);
its events are records of the standard library's `tasks_engine` logger, which Django's LOGGING
routes and filters (docs/logging.md, whose example runs here as written); with no LOGGING the
engine prints them itself. In every case the engine's own events reach the output with secrets
redacted.

Each case starts a fresh interpreter: structlog's configuration is process-global, and what is
under test is what `django.setup()` does to it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.one_db("logging configuration in fresh interpreters")

PROBE = """
import json, sys, django, structlog
django.setup()
from tasks_engine.observe.logs import get_logger, redact_secrets
config = structlog.get_config()
get_logger(run_id="r1").info("login", password="hunter2-pw", dsn="postgres://u:dsn-pw@db/x")
sys.stderr.flush()
print(json.dumps({
    "configured": structlog.is_configured(),
    "engine_chain": redact_secrets in config["processors"],
    "host_marker": any(getattr(p, "__name__", "") == "host_marker" for p in config["processors"]),
}))
"""


def probe(tmp_path: Path, settings_body: str) -> tuple[dict[str, bool], str]:
    """Start Django with the test settings plus `settings_body`, log one event with secrets
    through the engine's logger; return structlog's state and everything the process logged."""
    (tmp_path / "hostsettings.py").write_text(
        "from tests.settings import *  # noqa\n" + textwrap.dedent(settings_body)
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "hostsettings",
        "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}",
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    *logged, last = done.stdout.strip().splitlines()
    return json.loads(last), "\n".join([*logged, done.stderr])


def assert_redacted(output: str) -> None:
    assert "login" in output, output
    assert "hunter2-pw" not in output and "dsn-pw" not in output, output
    assert "[redacted]" in output, output


def test_by_default_the_engine_configures_structlog_with_redaction(tmp_path: Path) -> None:
    state, stderr = probe(tmp_path, "")
    assert state == {"configured": True, "engine_chain": True, "host_marker": False}
    line = json.loads(next(x for x in stderr.splitlines() if '"login"' in x))
    assert line["run_id"] == "r1" and line["password"] == "[redacted]"
    assert line["dsn"] == "postgres://u:[redacted]@db/x"


def test_a_host_that_configured_structlog_keeps_its_configuration(tmp_path: Path) -> None:
    state, stderr = probe(
        tmp_path,
        """
        import sys, structlog

        def host_marker(logger, method, event_dict):
            event_dict["host"] = "yes"
            return event_dict

        structlog.configure(
            processors=[host_marker, structlog.processors.KeyValueRenderer(sort_keys=True)],
            logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        )
        """,
    )
    assert state == {"configured": True, "engine_chain": False, "host_marker": True}
    line = next(x for x in stderr.splitlines() if "login" in x)
    assert "host='yes'" in line  # the host's processors and renderer, not the engine's JSON
    assert not line.startswith("{")
    assert_redacted(line)


def test_configure_logging_false_leaves_structlog_unconfigured(tmp_path: Path) -> None:
    state, stderr = probe(
        tmp_path,
        """
        TASKS_ENGINE = {**TASKS_ENGINE, "CONFIGURE_LOGGING": False}
        """,
    )
    assert state == {"configured": False, "engine_chain": False, "host_marker": False}
    assert_redacted(next(x for x in stderr.splitlines() if "login" in x))


def test_the_documented_logging_example_writes_json_lines_to_its_handler(
    tmp_path: Path,
) -> None:
    page = (ROOT / "docs" / "logging.md").read_text()
    code = page.split("```python\n", 1)[1].split("```", 1)[0]
    assert "JSONFormatter" in code and "engine.log" in code
    state, stderr = probe(tmp_path, code)
    assert state["configured"] and state["engine_chain"]
    assert "login" not in stderr
    (line,) = (tmp_path / "engine.log").read_text().splitlines()
    event = json.loads(line)
    assert event["logger"] == "tasks_engine" and event["level"] == "info"
    assert event["event"] == "login" and "timestamp" in event
    assert event["password"] == "[redacted]" and event["run_id"] == "r1"


LOGGING_NOTHING = """
LOGGING = {"version": 1, "disable_existing_loggers": False}
"""


def test_with_no_logging_configured_the_engine_prints_json_lines_itself(tmp_path: Path) -> None:
    """startproject's settings: nothing would print an INFO record of `tasks_engine` (Django's
    default LOGGING has handlers for `django` only), so the engine adds its stderr handler."""
    state, stderr = probe(tmp_path, LOGGING_NOTHING)
    assert state["configured"] and state["engine_chain"]
    (line,) = [x for x in stderr.splitlines() if '"login"' in x]  # one line, not two
    event = json.loads(line)
    assert event["logger"] == "tasks_engine" and event["level"] == "info"
    assert event["run_id"] == "r1" and event["password"] == "[redacted]"


HANDLER_ON_TASKS_ENGINE = """
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(levelname)s %(name)s %(message)s"}},
    "handlers": {
        "file": {"class": "logging.FileHandler", "filename": "engine.log", "formatter": "plain"},
    },
    "loggers": {"tasks_engine": {"handlers": ["file"], "level": "INFO", "propagate": False}},
}
"""


def test_a_handler_on_the_tasks_engine_logger_in_logging_receives_the_events(
    tmp_path: Path,
) -> None:
    _, stderr = probe(tmp_path, HANDLER_ON_TASKS_ENGINE)
    assert "login" not in stderr  # the project's handler has it, and only that one
    (line,) = (tmp_path / "engine.log").read_text().splitlines()
    level, name, message = line.split(" ", 2)
    assert (level, name) == ("INFO", "tasks_engine")
    event = json.loads(message)  # a plain formatter prints the event as one JSON object
    assert event["event"] == "login" and event["run_id"] == "r1"
    assert_redacted(line)


def test_logging_filters_the_engine_events_by_level(tmp_path: Path) -> None:
    settings = HANDLER_ON_TASKS_ENGINE.replace('"level": "INFO"', '"level": "WARNING"')
    _, stderr = probe(tmp_path, settings)
    assert (tmp_path / "engine.log").read_text() == ""
    assert "login" not in stderr


ROOT_PLAIN_CONSOLE = """
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "INFO"},
}
"""


def test_log_json_to_stderr_prints_bare_json_lines_beside_a_projects_root_handler(
    tmp_path: Path,
) -> None:
    _, stderr = probe(tmp_path, ROOT_PLAIN_CONSOLE)
    (line,) = [x for x in stderr.splitlines() if '"login"' in x]
    assert line.startswith("INFO tasks_engine {")  # the project's root handler and format

    settings = ROOT_PLAIN_CONSOLE + 'TASKS_ENGINE = {**TASKS_ENGINE, "LOG_JSON_TO_STDERR": True}\n'
    _, stderr = probe(tmp_path, settings)
    (line,) = [x for x in stderr.splitlines() if '"login"' in x]  # not the root handler's too
    assert json.loads(line)["logger"] == "tasks_engine"
    assert_redacted(line)
