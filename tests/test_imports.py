"""The package's import graph: no circle, and no module importing another's private names.

The graph counts every import a module makes (at the top, under TYPE_CHECKING, inside a
function): a circle through any of them is a circle a reader has to hold in their head. Checked
on the source with `ast` (no import is executed); `from a import b` where `a.b` is a module is an
edge to `a.b` alone, so that a package's `__init__` is not counted for the modules it holds."""

from __future__ import annotations

import ast
from pathlib import Path

import sessionlog

ROOT = Path(sessionlog.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, list[str], int]]:
    """(module imported, the names taken from it, line) for each import statement of `name`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            names = [alias.name for alias in node.names]
            submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            if len(submodules) == len(names):
                found += [(module, [], node.lineno) for module in submodules]
            else:
                found.append((target, names, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        graph[name] = {target for target, _, _ in _imports(name, path, modules) if target in modules}
        graph[name].discard(name)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_checker_finds_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_the_package_is_in_an_import_circle() -> None:
    graph = _graph()
    assert len(graph) > 50 and graph["sessionlog.core.reducer"]  # the whole package was read
    found = circles(graph)
    assert not found, "import circles: " + "; ".join(
        " -> ".join(f"{module} ({', '.join(sorted(graph[module] & set(circle)))})" for module in circle)
        for circle in found
    )


def test_no_module_imports_another_modules_private_names() -> None:
    """A name starting with `_` is its module's own: another module that needs it needs a public
    name (the core's rules took the reducer's `_keys`, `_reserve`, `_running` ..., the runtime
    the commit pipeline's `_first_non_json`)."""
    modules = _modules()
    taken = [
        f"{name}:{line} takes {target}.{private}"
        for name, path in modules.items()
        for target, names, line in _imports(name, path, modules)
        if target.startswith("sessionlog")
        for private in names
        if private.startswith("_") and not private.startswith("__")
    ]
    assert taken == []
    # and the rules reach the reducer's state through public names only
    for rules in ("entries", "records"):
        text = (ROOT / "core" / f"{rules}.py").read_text()
        assert "reducer._" not in text, f"core/{rules}.py reaches into the reducer's private names"
