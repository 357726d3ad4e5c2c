"""Bad arguments to runworker and tasks: one line on stderr, a non-zero exit, nothing written.

Run in this process through call_command, as manage.py would run them; one case in
tests/process/test_workers.py runs manage.py itself and checks what it prints and its exit code.
"""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from tasks_engine.models import WorkflowRun

pytestmark = [pytest.mark.django_db, pytest.mark.one_db("argument errors of the commands")]


def run_as_manage_py(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """The exit code and stderr manage.py would give: an argparse error writes its line and
    exits; a CommandError, which call_command raises, is what manage.py prints as
    `CommandError: <message>` and exits with (BaseCommand.run_from_argv)."""
    try:
        call_command(*args)
    except SystemExit as exc:
        return exit_status(exc.code), capsys.readouterr().err
    except CommandError as exc:
        return exc.returncode, capsys.readouterr().err + f"CommandError: {exc}\n"
    return 0, capsys.readouterr().err


def exit_status(code: object) -> int:
    """What the process would exit with, for a SystemExit carrying `code`."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


@pytest.mark.timeout(60)  # a runworker that took its arguments would run until stopped
@pytest.mark.parametrize(
    "args",
    [
        ["runworker", "--task", "nope@1"],
        ["runworker", "--task", "nope"],
        ["runworker", "--concurrency", "0"],
        ["runworker", "--prefetch", "-1"],
        ["runworker", "--lease-seconds", "abc"],
        ["runworker", "--bogus"],
        ["tasks", "enqueue", "noop", "--input", "{bad json"],
        ["tasks", "enqueue", "nope"],
        ["tasks", "enqueue", "noop", "--input", '{"n": "x"}'],
        ["tasks", "signal", "00000000-0000-0000-0000-000000000001", "x"],
        ["tasks", "cancel", "not-a-uuid"],
        ["tasks", "inspect"],
        ["tasks", "bogus"],
        ["tasks", "prune", "--older-than", "-1"],
    ],
)
def test_bad_worker_arguments_fail_with_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    code, stderr = run_as_manage_py(capsys, *args)
    assert code != 0
    lines = [x for x in stderr.strip().splitlines() if x]
    assert len(lines) == 1, stderr
    assert WorkflowRun.objects.count() == 0
