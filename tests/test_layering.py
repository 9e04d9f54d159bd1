"""shared/DESIGN.md's layering, checked on the source: every package imports only the
workspace packages below it (and declares them in its pyproject.toml), and no package's
modules import each other in a cycle -- counting imports inside functions, which run later
but still make two modules depend on each other (``if TYPE_CHECKING:`` imports do not run
and are not counted). ``from pkg import name`` counts as importing the submodule that the
package's ``__init__`` takes ``name`` from (its lazy ``__getattr__`` table included)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {p.name.replace("-", "_"): p for p in (ROOT / "packages").iterdir() if p.is_dir()}
# DESIGN.md: attn-core at the bottom; vision and nlp on it; clip on both; train on top.
BELOW = {
    "attn_core": set(),
    "attn_vision": {"attn_core"},
    "attn_nlp": {"attn_core"},
    "attn_clip": {"attn_core", "attn_vision", "attn_nlp"},
    "attn_train": {"attn_core", "attn_vision", "attn_nlp", "attn_clip"},
}


def _modules(package: str) -> dict[str, Path]:
    src = PACKAGES[package] / "src" / package
    out = {}
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return isinstance(test, ast.Name | ast.Attribute) and ast.unparse(test).endswith(
        "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST, *, type_checking: bool) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth (functions, classes, ``try``), optionally
    leaving out ``if TYPE_CHECKING:`` blocks."""
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        if _is_type_checking(node) and not type_checking:
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return found


def _absolute(name: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = name.split(".")
    base = base if path.name == "__init__.py" else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _reexports(modules: dict[str, Path]) -> dict[str, dict[str, str]]:
    """For each package ``__init__``: the name -> the module it comes from."""
    out: dict[str, dict[str, str]] = {}
    for name, path in modules.items():
        if path.name != "__init__.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        table = out.setdefault(name, {})
        for node in _import_nodes(tree, type_checking=True):
            if isinstance(node, ast.ImportFrom):
                source = _absolute(name, path, node)
                for alias in node.names:
                    table[alias.asname or alias.name] = (
                        f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                    )
    return out


def _imports(name: str, path: Path, reexports: dict[str, dict[str, str]] | None = None) -> set[str]:
    """Absolute names of the modules ``path`` imports anywhere (relative imports resolved;
    ``from pkg import name`` also as the module ``pkg`` re-exports ``name`` from)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in _import_nodes(tree, type_checking=False):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
            continue
        mod = _absolute(name, path, node)
        found.add(mod)
        for alias in node.names:
            found.add(f"{mod}.{alias.name}")  # "from . import x"
            if reexports and alias.name in reexports.get(mod, {}):
                found.add(reexports[mod][alias.name])
    return found


@pytest.mark.parametrize("package", sorted(BELOW))
def test_imports_only_packages_below(package):
    allowed = BELOW[package] | {package}
    pyproject = (PACKAGES[package] / "pyproject.toml").read_text(encoding="utf-8")
    dependencies = re.search(r"^dependencies = \[(.*?)\]\s*$", pyproject, re.M | re.S).group(1)
    deps = set(re.findall(r'"([A-Za-z0-9_.-]+)', dependencies))
    for name, path in _modules(package).items():
        used = {m.split(".")[0] for m in _imports(name, path)}
        workspace = {m for m in used if m in PACKAGES}
        assert workspace <= allowed, f"{path.relative_to(ROOT)} imports {workspace - allowed}"
        undeclared = {m for m in workspace - {package} if m.replace("_", "-") not in deps}
        assert not undeclared, f"{path.relative_to(ROOT)}: {undeclared} not in pyproject.toml"


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (anywhere in its body). A package's
    ``__init__`` importing its submodules, and a module importing its parent package, are
    how packages work and are left out; a cycle between sibling modules is what the rule
    forbids."""
    modules = _modules(package)
    reexports = _reexports(modules)
    graph = {}
    for name, path in modules.items():
        edges = {m for m in _imports(name, path, reexports) if m in modules} - {name}
        graph[name] = {m for m in edges if not name.startswith(m + ".") and m != package}
    for name in graph:  # a package __init__ -> its own submodules
        if modules[name].name == "__init__.py":
            graph[name] = {m for m in graph[name] if not m.startswith(name + ".")}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) per strongly connected group of modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def connect(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = {stack.pop()}
            while node not in group:
                group.add(stack.pop())
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return [_cycle_in(graph, group) for group in groups]


def _cycle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    start = min(group)
    paths = {start: [start]}
    todo = [start]
    while todo:  # breadth-first, inside the group, back to start
        node = todo.pop(0)
        for nxt in sorted(graph[node] & group):
            if nxt == start:
                return paths[node] + [start]
            if nxt not in paths:
                paths[nxt] = paths[node] + [nxt]
                todo.append(nxt)
    raise AssertionError(f"no cycle in {group}")


@pytest.mark.parametrize("package", sorted(BELOW))
def test_no_import_cycle_between_modules(package):
    cycles = find_cycles(import_graph(package))
    assert not cycles, "import cycle(s): " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_cycle_finder_sees_function_body_imports_and_reexports(tmp_path):
    """The checker itself: a cycle through an import inside a function, and one through a
    name a package ``__init__`` re-exports, are both found."""
    graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}, "p.e": set()}
    assert find_cycles(graph) == [["p.a", "p.b", "p.c", "p.a"]]
    src = tmp_path / "p"
    src.mkdir()
    (src / "__init__.py").write_text("if TYPE_CHECKING:\n    from .b import thing\n")
    (src / "a.py").write_text("def f():\n    from p import thing\n")
    (src / "b.py").write_text("import os\n\ndef g():\n    from . import a\n")
    (src / "c.py").write_text("if TYPE_CHECKING:\n    from .a import f\n")
    modules = {"p": src / "__init__.py", **{f"p.{m}": src / f"{m}.py" for m in "abc"}}
    reexports = _reexports(modules)
    assert reexports == {"p": {"thing": "p.b"}}
    assert {m for m in _imports("p.a", modules["p.a"], reexports) if m in modules} == {"p", "p.b"}
    assert "p.a" in _imports("p.b", modules["p.b"], reexports)
    assert not {m for m in _imports("p.c", modules["p.c"], reexports) if m in modules}
