"""Finding runs by tag at 1,000,000 runs on PostgreSQL: `list_runs(tags=...)` and the admin's
`tag:K=V` search, each as EXPLAIN ANALYZE of the statements it sends (the server's execution
time, planning included) and as the wall time of the call (the admin: the whole runs-list page).

    DATABASE_URL=postgres://... python bench/tags_lookup.py [--runs 1000000] [--keep]

The runs are written by SQL (a copy of one enqueued run per row, in chunks of 100,000), newest
first by created_at, with tags spread as a real table has them: 10% without tags; `customer`
one of 1,000 values (0.1% each); `team` media on 30% of them (a common pair); `incident` on 10
runs only (a rare pair). Prints one JSON line per lookup: matches, the slowest statement's
execution + planning ms (median of 5), its plan's top node, and the call's median ms.
--keep leaves the runs in the table for a second run (it then skips writing them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

CHUNK = 100_000
REPEAT = 5
TAGS_SQL = """
CASE WHEN n %% 10 = 9 THEN NULL ELSE jsonb_strip_nulls(jsonb_build_object(
    'customer', (n %% 1000)::text,
    'team', CASE WHEN n %% 10 < 3 THEN 'media' ELSE 'ops' END,
    'incident', CASE WHEN n %% 100000 = 4242 THEN 'disk-full' END))
END"""


def write_runs(total: int) -> None:
    from django.db import connection, transaction

    from tasks_engine import enqueue

    template = enqueue("bench_noop").run_id
    with connection.cursor() as c:
        c.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_name = 'tasks_engine_workflowrun' ORDER BY ordinal_position"
        )
        columns = [r[0] for r in c.fetchall()]
    made = {
        "id": "gen_random_uuid()",
        "created_at": "now() - n * interval '1 second'",
        "updated_at": "now() - n * interval '1 second'",
        "available_at": "now() - n * interval '1 second'",
        "tags": TAGS_SQL,
        # Most of a big table has finished; a pending million would be a claim bench.
        "status": "CASE WHEN n %% 50 = 0 THEN 'failed' ELSE 'completed' END",
        "finished_at": "now() - n * interval '1 second'",
    }
    select = ", ".join(made.get(col, f"t.{col}") for col in columns)
    for start in range(0, total, CHUNK):
        with transaction.atomic(), connection.cursor() as c:
            c.execute(
                f"INSERT INTO tasks_engine_workflowrun ({', '.join(columns)})"
                f" SELECT {select} FROM tasks_engine_workflowrun t,"
                " generate_series(%s, %s) AS n WHERE t.id = %s",
                [start + 1, min(start + CHUNK, total), template],
            )
    with connection.cursor() as c:
        c.execute("DELETE FROM tasks_engine_workflowrun WHERE id = %s", [template])
        c.execute("VACUUM ANALYZE tasks_engine_workflowrun")


def explain_ms(sql: str) -> tuple[float, str]:
    """Execution + planning ms of one statement (EXPLAIN ANALYZE), and its plan's top node."""
    from django.db import connection

    with connection.cursor() as c:
        c.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")
        plan = c.fetchone()[0]
    plan = plan if isinstance(plan, list) else json.loads(plan)
    top = plan[0]
    return top["Execution Time"] + top["Planning Time"], describe(top["Plan"])


def describe(node: dict[str, Any]) -> str:
    """The plan's nodes down to the first scan: "Limit > Sort > Bitmap Heap Scan(run_tags)"."""
    parts = []
    while True:
        name = node["Node Type"]
        if "Index Name" in node:
            name += f"({node['Index Name']})"
        parts.append(name)
        if "Scan" in node["Node Type"] or not node.get("Plans"):
            return " > ".join(parts)
        node = node["Plans"][0]


def measure(call: Callable[[], Any], about: Callable[[str], bool]) -> dict[str, Any]:
    """`call` REPEAT times: its median wall ms, and its slowest statement among those `about`
    picks (EXPLAIN ANALYZE of each, median of REPEAT)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    call()  # warm: caches, the plan's statistics, the admin's templates
    walls = []
    for _ in range(REPEAT):
        start = time.perf_counter()
        call()
        walls.append((time.perf_counter() - start) * 1000)
    with CaptureQueriesContext(connection) as seen:
        call()
    statements = [q["sql"] for q in seen.captured_queries if about(q["sql"])]
    slowest = (0.0, "", "")
    for sql in statements:
        ms = statistics.median(explain_ms(sql)[0] for _ in range(REPEAT))
        if ms > slowest[0]:
            slowest = (ms, explain_ms(sql)[1], sql)
    return {
        "statements": len(statements),
        "slowest_statement_ms": round(slowest[0], 2),
        "plan": slowest[1],
        "call_ms": round(statistics.median(walls), 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=1_000_000)
    p.add_argument("--keep", action="store_true", help="keep the runs for the next run")
    a = p.parse_args()
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    call_command("migrate", verbosity=0)
    from tasks_engine import list_runs
    from tasks_engine.models import WorkflowRun

    if connection.vendor != "postgresql":
        raise SystemExit("this bench measures the PostgreSQL index: DATABASE_URL=postgres://...")
    runs = WorkflowRun.objects.filter(task_name="bench_noop")
    if runs.count() != a.runs:
        runs.delete()
        write_runs(a.runs)
    user = User.objects.filter(username="bench-tags").first() or User.objects.create_superuser(
        "bench-tags", "bench@example.com", "bench"
    )
    client = Client(HTTP_HOST="localhost")
    client.force_login(user)

    def tagged(sql: str) -> bool:
        # Not the paginator's EXPLAIN (its estimate past the count cap: planning only).
        return '"tags"' in sql and "tasks_engine_workflowrun" in sql and sql[:7] != "EXPLAIN"

    cases = [
        {"customer": "42"},
        {"team": "media"},
        {"incident": "disk-full"},
        {"customer": "42", "team": "media"},
    ]
    for tags in cases:
        matches = runs.filter(tags__contains=tags).count()

        def listed(tags: dict[str, str] = tags) -> None:
            list_runs(tags=tags)

        row = measure(listed, tagged)
        print(json.dumps({"lookup": "list_runs", "tags": tags, "matches": matches, **row}))
        query = " ".join(f"tag:{k}={v}" for k, v in tags.items())

        def page(query: str = query) -> None:
            got = client.get("/admin/tasks_engine/workflowrun/", {"q": query})
            assert got.status_code == 200, got.status_code

        row = measure(page, tagged)
        print(json.dumps({"lookup": "admin list", "q": query, "matches": matches, **row}))
    if not a.keep:
        runs.delete()
        user.delete()


if __name__ == "__main__":
    main()
