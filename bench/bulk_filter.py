"""cancel-matching and retry-matching on 100,000 matching runs, through the CLI
(`manage.py tasks cancel-matching --tag ... --json`), with as many runs next to them that the
filter leaves alone: every statement the command sends is timed (a Django execute wrapper: the
time the client waits, so at least the server's), its progress lines on stderr are counted and
its count checked against the table.

    DATABASE_URL=postgres://... python bench/bulk_filter.py [--runs 100000] [--others 100000]

Prints one JSON line per command: seconds, batches (progress lines), the count it reported and
the count in the table, the longest statement (ms, and its first words) and the slowest batch.
Deletes the bench's runs (task bench_noop) first and last.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

CHUNK = 5000


class StatementClock:
    """The longest statement seen, and how long each progress step took."""

    def __init__(self) -> None:
        self.count = 0
        self.longest = 0.0
        self.longest_sql = ""

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, ctx: Any):
        start = time.perf_counter()
        try:
            return execute(sql, params, many, ctx)
        finally:
            took = time.perf_counter() - start
            self.count += 1
            if took > self.longest:
                self.longest, self.longest_sql = took, " ".join(sql.split())[:120]


class Progress(io.StringIO):
    """stderr of the command: each progress line timed as it is written."""

    def __init__(self) -> None:
        super().__init__()
        self.stamps: list[float] = []

    def write(self, s: str) -> int:
        if "matching runs so far" in s:
            self.stamps.append(time.perf_counter())
        return super().write(s)


@contextmanager
def timed_statements() -> Iterator[StatementClock]:
    from django.db import connection

    clock = StatementClock()
    with connection.execute_wrapper(clock):
        yield clock


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=100_000, help="runs the filter matches")
    p.add_argument("--others", type=int, default=100_000, help="runs it does not match")
    a = p.parse_args()
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    from tasks_engine import enqueue_many
    from tasks_engine.models import WorkflowRun

    bench_runs = WorkflowRun.objects.filter(task_name="bench_noop")
    bench_runs.delete()
    for tag, n in (("bulk", a.runs), ("other", a.others)):
        for start in range(0, n, CHUNK):
            enqueue_many("bench_noop", [{}] * min(CHUNK, n - start), tags={"bench": tag})
    if connection.vendor == "postgresql":
        with connection.cursor() as c:
            c.execute("ANALYZE tasks_engine_workflowrun")

    def command(*args: str, expect_status: str, key: str) -> None:
        out, err = io.StringIO(), Progress()
        start = time.perf_counter()
        with timed_statements() as clock:
            call_command("tasks", *args, "--tag", "bench=bulk", "--json", stdout=out, stderr=err)
        seconds = time.perf_counter() - start
        steps = [b - a for a, b in zip([start, *err.stamps], err.stamps, strict=False)]
        reported = json.loads(out.getvalue())[key]
        in_table = bench_runs.filter(tags__bench="bulk", status=expect_status).count()
        untouched = bench_runs.filter(tags__bench="other", status="pending").count()
        print(
            json.dumps(
                {
                    "bench": f"tasks {args[0]}",
                    "database": connection.vendor,
                    "matching": a.runs,
                    "others": a.others,
                    "seconds": round(seconds, 2),
                    "progress_lines": len(err.stamps),
                    "count_reported": reported,
                    f"{expect_status}_in_table": in_table,
                    "others_untouched": untouched == a.others,
                    "statements": clock.count,
                    "longest_statement_ms": round(clock.longest * 1000, 1),
                    "longest_statement": clock.longest_sql,
                    "slowest_batch_ms": round(max(steps) * 1000, 1) if steps else None,
                }
            ),
            flush=True,
        )

    command("cancel-matching", "--reason", "bench", expect_status="canceled", key="canceled")
    command("retry-matching", "--status", "canceled", expect_status="pending", key="retried")
    bench_runs.delete()


if __name__ == "__main__":
    main()
