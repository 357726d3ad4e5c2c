"""The engine's logging respects the host project: structlog is configured by the engine only
when the host has not configured it and has not opted out (TASKS_ENGINE["CONFIGURE_LOGGING"]);
the documented LOGGING recipe (docs/logging.md) routes the engine's events through the standard
library. In every case the engine's own events reach the output with secrets redacted.

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


def test_the_documented_logging_recipe_routes_engine_events_through_the_stdlib(
    tmp_path: Path,
) -> None:
    recipe = (ROOT / "docs" / "logging.md").read_text()
    code = recipe.split("```python\n", 1)[1].split("```", 1)[0]
    assert "CONFIGURE_LOGGING" in code
    state, stderr = probe(tmp_path, code)
    assert state["configured"] and state["engine_chain"]  # the recipe's chain holds it
    line = json.loads(next(x for x in stderr.splitlines() if '"login"' in x))
    assert line["logger"] == "tasks_engine" and line["level"] == "info"
    assert line["password"] == "[redacted]" and line["run_id"] == "r1"
