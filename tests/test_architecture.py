"""The layout's promises, checked: no import circle anywhere in the package (imports inside functions
count; `if TYPE_CHECKING:` blocks do not, they never run), and the HTTP package's helpers stay a leaf."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "veritas_watch"


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def import_graph() -> dict[str, set[str]]:
    modules = module_names()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for node in ast.walk(tree)
                       if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                       for n in ast.walk(node)}
        deps: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("veritas_watch"):
                targets = [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names if alias.name.startswith("veritas_watch")]
            else:
                continue
            deps |= {t for t in map(resolve, targets) if t is not None and t != name}
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_anywhere() -> None:
    graph = import_graph()
    assert "veritas_watch.http.app" in graph and graph["veritas_watch.daemon"], "the graph was not read"
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_http_helpers_and_access_are_leaves_of_the_http_package() -> None:
    graph = import_graph()
    for leaf in ("veritas_watch.http.requests", "veritas_watch.http.access"):
        assert not {d for d in graph[leaf] if d.startswith("veritas_watch.http.") and d != "veritas_watch.http.access"}
    assert not any(d.startswith("veritas_watch.http") for d in graph["veritas_watch.status"])


def test_the_http_package_reaches_the_daemon_only_through_its_protocols() -> None:
    """Not even for type checking: the routes see `http/port.py`'s `Served`, which `daemon.Running` implements."""
    for path in (PACKAGE / "http").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            assert not [n for n in names if n == "veritas_watch.daemon"], f"{path.name} imports the daemon"
    assert not import_graph()["veritas_watch.http.port"], "http/port.py is a leaf"
