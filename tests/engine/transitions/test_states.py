"""The transition table, its functions and the docs agree; nothing else writes run rows.

The table and the code cannot drift apart: `transitions/` is read with `ast` to find every
function that writes a run status (an SQL `SET status = '...'` on the run table, an INSERT of
a run, an ORM `WorkflowRun....update(status=...)`), and what each function calls.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks_engine import states, transitions
from tasks_engine.states import RunStatus

pytestmark = pytest.mark.one_db("reads the transition table and the code with ast")

ROOT = Path(__file__).resolve().parents[3]
TRANSITIONS_DIR = ROOT / "tasks_engine" / "transitions"

# Writers the table does not name and no function it names calls in the source: why not.
# (None today: the writes the worker's group commit carries are reached from complete_run.)
INDIRECT: dict[str, str] = {}

_STATUS = "(" + "|".join(RunStatus.values) + ")"
# status = 'x', or status = CASE WHEN ... THEN 'x' ELSE 'y' END (each branch a status written)
SET_STATUS = re.compile(
    r"(?:^|SET|,)\s*status\s*=\s*(?:'" + _STATUS + r"'|(CASE\b.*?\bEND))",
    re.IGNORECASE | re.DOTALL,
)
CASE_BRANCH = re.compile(r"(?:THEN|ELSE)\s+'" + _STATUS + "'", re.IGNORECASE)
RUN_TABLES = {"RUN", "tasks_engine_workflowrun"}  # as an f-string names it, and in .sql files
UPDATE_TABLE = re.compile(r"UPDATE\s+\{?(\w+)\}?", re.IGNORECASE)
INSERT_RUN = re.compile(r"INSERT\s+INTO\s+(?:\{RUN\}|tasks_engine_workflowrun\b)", re.IGNORECASE)
QUERY_FILES = sorted((ROOT / "tasks_engine" / "db" / "queries").glob("*.sql"))
assert QUERY_FILES, "the named queries moved: tests/engine/transitions/test_states.py reads them"
QUERY_HEADER = re.compile(r"^-- (\w+) --\n", re.MULTILINE)


def edges() -> Iterator[tuple[str, str, states.Edge]]:
    yield "start", RunStatus.PENDING, states.START
    for (src, dst), edge in states.TRANSITIONS.items():
        yield src, dst, edge


def _text(node: ast.expr) -> str | None:
    """A string literal's text; an f-string's with each `{NAME}` kept as written."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name):
                parts.append("{" + value.value.id + "}")
            else:
                parts.append("{...}")
        return "".join(parts)
    return None


def _sql_writes(text: str) -> set[str]:
    """Run statuses an SQL text sets: `status = 'x'` after SET or a comma (not in a WHERE),
    unless the nearest UPDATE before it is of another table than the run's."""
    found = set()
    for match in SET_STATUS.finditer(text):
        updates = UPDATE_TABLE.findall(text[: match.start()])
        if not updates or updates[-1] in RUN_TABLES:  # a bare assignment list: _cas_run's
            if match.group(1):
                found.add(match.group(1).lower())
            else:
                found.update(s.lower() for s in CASE_BRANCH.findall(match.group(2)))
    if INSERT_RUN.search(text):
        found.add(RunStatus.PENDING)  # a new run starts pending
    return found


def _orm_writes(call: ast.Call) -> set[str]:
    """`WorkflowRun.objects....update(status=...)`: the status it sets."""
    if not (isinstance(call.func, ast.Attribute) and call.func.attr == "update"):
        return set()
    root: ast.expr = call.func
    while isinstance(root, ast.Attribute | ast.Call):
        root = root.value if isinstance(root, ast.Attribute) else root.func
    if not (isinstance(root, ast.Name) and root.id == "WorkflowRun"):
        return set()
    found = set()
    for kw in call.keywords:
        if kw.arg == "status":
            if isinstance(kw.value, ast.Constant):
                found.add(str(kw.value.value))
            elif isinstance(kw.value, ast.Attribute):  # RunStatus.PENDING
                found.add(RunStatus[kw.value.attr].value)
    return found


def named_queries() -> dict[str, str]:
    """Every named query (`sql.query(name)`), the texts of all dialects together."""
    found: dict[str, str] = {}
    for path in QUERY_FILES:
        parts = QUERY_HEADER.split(path.read_text())  # ["", name, body, name, body, ...]
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            found[name] = found.get(name, "") + "\n" + body
    return found


def read_transitions() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Per top-level function of transitions/: the run statuses it writes itself (in its
    literals, or in the named queries it reads), and the functions of transitions/ it calls."""
    queries = named_queries()
    writes: dict[str, set[str]] = {}
    calls: dict[str, set[str]] = {}
    for path in sorted(TRANSITIONS_DIR.glob("*.py")):
        for fn in ast.parse(path.read_text()).body:
            if not isinstance(fn, ast.FunctionDef):
                continue
            w, c = writes.setdefault(fn.name, set()), calls.setdefault(fn.name, set())
            pieces: set[int] = set()  # an f-string's literal parts, read with the f-string
            for node in ast.walk(fn):  # breadth first: an f-string before its parts
                if isinstance(node, ast.JoinedStr):
                    pieces.update(id(v) for v in node.values)
                if id(node) in pieces:
                    continue
                if isinstance(node, ast.expr) and (text := _text(node)) is not None:
                    w |= _sql_writes(text)
                if isinstance(node, ast.Call):
                    w |= _orm_writes(node)
                    f = node.func
                    if isinstance(f, ast.Name) and f.id == "query" and node.args:
                        name = _text(node.args[0])
                        w |= _sql_writes(queries[name]) if name in queries else set()
                    c.add(f.id if isinstance(f, ast.Name) else getattr(f, "attr", ""))
    for name in calls:
        calls[name] &= set(writes)
    return writes, calls


def _reachable(calls: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for g in calls.get(todo.pop(), set()):
            if g not in seen:
                seen.add(g)
                todo.append(g)
    return seen


def test_every_edge_has_a_function_in_transitions() -> None:
    for src, dst, edge in edges():
        for fn in edge.functions.split(", "):
            assert callable(getattr(transitions, fn, None)), f"{src}->{dst} ({edge.cause}): {fn}"


def test_every_edge_s_functions_write_its_target_status() -> None:
    writes, calls = read_transitions()
    wrong = []
    for src, dst, edge in edges():
        for fn in edge.functions.split(", "):
            written = set().union(*(writes[g] for g in _reachable(calls, fn)))
            if dst not in written:
                wrong.append(f"{src}->{dst}: {fn} writes {sorted(written) or 'no status'}")
    assert wrong == []


def test_every_function_writing_a_run_status_is_in_the_table() -> None:
    """A writer is named on an edge into the status it writes, or is a helper that such a
    function calls, or is listed in INDIRECT with the reason."""
    writes, calls = read_transitions()
    named: dict[str, set[str]] = {}
    for _, dst, edge in edges():
        for fn in edge.functions.split(", "):
            named.setdefault(dst, set()).update(_reachable(calls, fn))
    missing = [
        f"{fn} writes {status} but no edge into {status} names it or a caller of it"
        for fn, statuses in sorted(writes.items())
        for status in sorted(statuses)
        if fn not in named.get(status, set()) and fn not in INDIRECT
    ]
    assert missing == []
    covered = [fn for fn in INDIRECT if all(fn in named.get(st, ()) for st in writes.get(fn, ()))]
    assert covered == [], "INDIRECT lists a function the table covers (or that writes nothing)"


def test_the_reader_finds_status_writes() -> None:
    """The reader on made-up code: SET on the run table and a bare assignment list count, a
    WHERE, a step table's SET and a parameter do not."""
    assert _sql_writes("UPDATE {RUN} SET status = 'failed' WHERE status = 'running'") == {"failed"}
    assert _sql_writes("status = 'waiting', lease_token = NULL") == {"waiting"}
    assert _sql_writes("UPDATE {STEP} SET status = 'failed' WHERE id = %s") == set()
    case = "UPDATE {RUN} SET status = CASE WHEN x IS NULL THEN 'completed' ELSE 'canceled' END"
    assert _sql_writes(case) == {"completed", "canceled"}
    assert _sql_writes("UPDATE {RUN} SET status = %s") == set()
    assert _sql_writes("UPDATE tasks_engine_workflowrun r SET status = 'completed'") == {
        "completed"
    }
    assert _sql_writes("UPDATE tasks_engine_stepattempt s SET status = 'completed'") == set()
    assert _sql_writes("INSERT INTO {RUN} (id, status) VALUES (%s, 'pending')") == {"pending"}
    call = ast.parse('WorkflowRun.objects.filter(pk=1).update(status="canceled")').body[0]
    other = ast.parse('StepAttempt.objects.filter(pk=1).update(status="abandoned")').body[0]
    assert isinstance(call, ast.Expr) and isinstance(call.value, ast.Call)
    assert isinstance(other, ast.Expr) and isinstance(other.value, ast.Call)
    assert _orm_writes(call.value) == {"canceled"}
    assert _orm_writes(other.value) == set()


def test_every_status_is_reachable_or_initial() -> None:
    targets = {dst for (_, dst) in states.TRANSITIONS} | {states.RunStatus.PENDING}
    assert targets == set(states.RunStatus)


def test_every_unfinished_status_has_a_way_out() -> None:
    sources = {src for (src, _) in states.TRANSITIONS}
    assert set(states.ACTIVE) <= sources


def test_docs_are_generated_from_the_table() -> None:
    doc = (ROOT / "docs" / "state_machine.md").read_text()
    assert states.mermaid() in doc
    assert states.leaving_table() in doc


# Writers of run rows outside transitions/, and why they may.
OTHER_RUN_WRITERS = {
    "tasks_engine/services/retention.py": (
        "deletes finished runs and unlinks their children: it changes no run's status"
    ),
}
RUN_ROW_WRITE = re.compile(
    r"\b(?:UPDATE|INSERT\s+INTO|DELETE\s+FROM)\s+(?:\{RUN\}|\"?tasks_engine_workflowrun\b)",
    re.IGNORECASE,
)
ORM_WRITES = {"update", "create", "bulk_create", "bulk_update", "delete", "get_or_create",
              "update_or_create", "save"}  # fmt: skip


def run_row_writes(path: Path) -> list[str]:
    """Each statement of a module that writes run rows, whatever columns: an SQL text (a
    literal, an f-string with `{RUN}`, a named query) that UPDATEs, INSERTs into or DELETEs
    from the run table, or an ORM write on `WorkflowRun` (its manager's chain, or an
    instance's `save()` where the module names the model)."""
    queries = named_queries()
    tree = ast.parse(path.read_text())
    names_model = any(isinstance(n, ast.Name) and n.id == "WorkflowRun" for n in ast.walk(tree))
    found = []
    pieces: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            pieces.update(id(v) for v in node.values)
        if id(node) in pieces:
            continue
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.expr) and (text := _text(node)) and RUN_ROW_WRITE.search(text):
            found.append(f"{where}: {RUN_ROW_WRITE.search(text).group(0)}")  # type: ignore[union-attr]
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id == "query" and node.args:
            name = _text(node.args[0])
            if name in queries and RUN_ROW_WRITE.search(queries[name]):
                found.append(f"{where}: named query {name}")
        if isinstance(f, ast.Attribute) and f.attr in ORM_WRITES:
            root: ast.expr = f
            while isinstance(root, ast.Attribute | ast.Call):
                root = root.value if isinstance(root, ast.Attribute) else root.func
            on_model = isinstance(root, ast.Name) and root.id == "WorkflowRun"
            if on_model or (f.attr == "save" and names_model and _names_a_run(f.value)):
                found.append(f"{where}: WorkflowRun {f.attr}()")
    return sorted(found, key=lambda f: int(f.split(":")[1]))


def _names_a_run(value: ast.expr) -> bool:
    """`run.save()`, `self.run.save()`: an instance the module calls a run."""
    name = value.attr if isinstance(value, ast.Attribute) else getattr(value, "id", "")
    return "run" in name.lower()


def outside_transitions() -> Iterator[Path]:
    for package in ("tasks_engine", "outbox", "umt"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if "transitions" not in path.parts and "migrations" not in path.parts:
                yield path


def test_only_transitions_writes_run_rows() -> None:
    """One writer: no module outside transitions/ writes a run row (a status or any other
    column: the dead-worker reap's lease expiry once did, from workers.py) except those
    OTHER_RUN_WRITERS names."""
    offenders = []
    for path in outside_transitions():
        if str(path.relative_to(ROOT)) not in OTHER_RUN_WRITERS:
            offenders += [f"{path.relative_to(ROOT).parent}/{f}" for f in run_row_writes(path)]
    assert offenders == []


def test_the_one_writer_guard_sees_every_kind_of_write(tmp_path: Path) -> None:
    """The guard reads statements, not lines: each of these writes is found, wherever its
    table and verb stand; reads and other tables are not."""
    module = tmp_path / "sample.py"
    module.write_text(
        'RUN = "x"\n'
        "def reap(cur, dead):\n"
        '    cur.execute(f"""UPDATE {RUN}\n'
        "        SET available_at = now()\n"
        '        WHERE id = %s""", dead)\n'
        "def prune(cur):\n"
        '    cur.execute("DELETE FROM tasks_engine_workflowrun WHERE id = 1")\n'
        "def orm(WorkflowRun, run):\n"
        "    WorkflowRun.objects.filter(pk=1).update(priority=3)\n"
        "    run.save()\n"
        "def reads(cur, WorkflowRun):\n"
        "    cur.execute(f\"SELECT * FROM {RUN} WHERE status = 'running'\")\n"
        '    cur.execute("UPDATE tasks_engine_worker SET x = 1")\n'
        "    WorkflowRun.objects.filter(pk=1).count()\n"
    )
    found = run_row_writes(module)
    assert [f.split(": ", 1)[1] for f in found] == [
        "UPDATE {RUN}",
        "DELETE FROM tasks_engine_workflowrun",
        "WorkflowRun update()",
        "WorkflowRun save()",
    ], found
