"""tasks_engine's modules import one another without a cycle.

The graph is read from the source with `ast`: every import a module makes, at its top and
inside functions, of another tasks_engine module. Imports under `if TYPE_CHECKING:` are left
out: they never run, and a type-level loop is inherent (a workflow takes a context whose steps
start workflows). An import inside a function is an edge like any other; the only ones
allowed to close a loop are listed in LAZY_ON_PURPOSE with the reason they must be lazy,
and the few outside the author's side not broken yet in KNOWN_CYCLES.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.one_db("reads the source with ast")

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "tasks_engine"

# (importer, imported) -> why the import waits until it is called.
LAZY_ON_PURPOSE = {
    ("tasks_engine", "tasks_engine.engine"): (
        "the package's public API is import-safe before apps load; the engine needs the models"
    ),
    ("tasks_engine", "tasks_engine.runtime.context"): "the same, for TaskContext",
    ("tasks_engine.definitions", "tasks_engine.engine"): (
        "definitions is imported with the package, before apps load (@workflow in models-free "
        "modules); Workflow.enqueue reaches the engine, which needs the models, when called"
    ),
}

# Imports that close a cycle outside the workflow author's side, not broken yet: why, and
# who breaks them. Listed by the import that closes the loop (not by the modules in it), so
# that modules may move inside it; when one is gone, remove it here.
KNOWN_CYCLES = {
    ("tasks_engine.transitions.claim_mode", "tasks_engine.transitions.flow_claims"): (
        "issue 13, hot path: flow control's maintenance calls the guarded claim's helpers"
    ),
    ("tasks_engine.transitions.claims", "tasks_engine.transitions.flow_claims"): (
        "issue 13, hot path: the claim hands keyed runs to the guarded claim, which builds on it"
    ),
    ("tasks_engine.admin", "tasks_engine.admin.schedule_pages"): (
        "the admin package registers its submodules' admins, which import its helpers"
    ),
    ("tasks_engine.admin", "tasks_engine.admin.worker_pages"): "the same",
}


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    where: str  # "path:line (top-level|function-level)"
    lazy: bool


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, in_function: bool = False) -> Iterator[tuple[ast.stmt, bool]]:
    """Every import statement that can run, and whether it sits inside a function."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, in_function
        elif isinstance(node, ast.If) and _type_checking(node):
            for branch in node.orelse:
                yield from _imports(ast.Module(body=[branch], type_ignores=[]), in_function)
        else:
            nested = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            yield from _imports(node, in_function or nested)


def edges(known: dict[str, Path]) -> list[Edge]:
    found = []
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node, lazy in _imports(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parent, *([node.module] if node.module else [])])
                for alias in node.names:  # `from . import clock` imports the module clock
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in known else base)
            else:
                assert isinstance(node, ast.Import)
                targets = [alias.name for alias in node.names]
            kind = "function-level" if lazy else "top-level"
            where = f"{path.relative_to(ROOT)}:{node.lineno} ({kind})"
            found += [Edge(name, t, where, lazy) for t in targets if t in known and t != name]
    return found


def cycles(graph: dict[str, dict[str, Edge]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def a_loop(graph: dict[str, dict[str, Edge]], component: list[str]) -> list[Edge]:
    """One loop through the component, as the imports that make it."""
    members, start = set(component), component[0]
    path: list[Edge] = []
    seen: set[str] = set()

    def walk(v: str) -> bool:
        for w, edge in sorted(graph[v].items()):
            if w not in members or (w != start and w in seen):
                continue
            seen.add(w)
            path.append(edge)
            if w == start or walk(w):
                return True
            path.pop()
        return False

    walk(start)
    return path


def runtime_graph() -> dict[str, dict[str, Edge]]:
    graph: dict[str, dict[str, Edge]] = {}
    for edge in edges(modules()):
        pair = (edge.importer, edge.imported)
        if pair not in LAZY_ON_PURPOSE and pair not in KNOWN_CYCLES:
            graph.setdefault(edge.importer, {}).setdefault(edge.imported, edge)
    return graph


def test_no_import_cycle_among_tasks_engine_modules() -> None:
    graph = runtime_graph()
    problems = []
    for component in cycles(graph):
        loop = a_loop(graph, component)
        names = " -> ".join([e.importer for e in loop] + [loop[0].importer])
        problems.append(
            f"among {', '.join(component)}, for one: {names}\n"
            + "\n".join(f"    {e.where}" for e in loop)
        )
    assert not problems, "import cycles:\n" + "\n".join(problems)


def test_the_listed_imports_still_exist() -> None:
    """A listed import that is gone must leave its list, so that it cannot come back unseen."""
    pairs = {(e.importer, e.imported) for e in edges(modules())}
    assert [p for p in [*LAZY_ON_PURPOSE, *KNOWN_CYCLES] if p not in pairs] == []


def test_each_lazy_import_is_inside_a_function() -> None:
    by_pair = {(e.importer, e.imported): e for e in edges(modules())}
    for pair in LAZY_ON_PURPOSE:
        edge = by_pair[pair]
        assert edge.lazy, f"{edge.where}: listed as lazy on purpose but imported at the top"


def test_the_reader_sees_a_loop() -> None:
    """The reader and the cycle finder on a made-up graph: a function-level import closing a
    loop is found and named."""
    tree = ast.parse("from . import b\n\ndef f():\n    from .c import x\n")
    imports = [(type(n).__name__, lazy) for n, lazy in _imports(tree)]
    assert imports == [("ImportFrom", False), ("ImportFrom", True)]
    e = {
        ("a", "b"): Edge("a", "b", "a.py:1 (top-level)", False),
        ("b", "a"): Edge("b", "a", "b.py:4 (function-level)", True),
    }
    graph = {"a": {"b": e["a", "b"]}, "b": {"a": e["b", "a"]}, "c": {}}
    assert cycles(graph) == [["a", "b"]]
    assert [x.where for x in a_loop(graph, ["a", "b"])] == [
        "a.py:1 (top-level)",
        "b.py:4 (function-level)",
    ]


def test_the_rooms_keep_their_layer_contract() -> None:
    """pyproject.toml's [tool.importlinter] contracts: the rooms of tasks_engine top to bottom
    (each imports only rooms below it, every room listed), the engine alone, and the outbox
    and UMT on the engine's surface. Checked as `make lint` checks them, so that CI fails on a
    violation too."""
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
