"""shared/DESIGN.md's layering, checked on the source: every package imports only the
workspace packages below it (and declares them in its pyproject.toml), and no package's
modules import each other in a cycle at import time."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {p.name.replace("-", "_"): p for p in (ROOT / "packages").iterdir() if p.is_dir()}
# DESIGN.md: attn-core at the bottom; vision and nlp on it; clip on vision; train on top.
BELOW = {
    "attn_core": set(),
    "attn_vision": {"attn_core"},
    "attn_nlp": {"attn_core"},
    "attn_clip": {"attn_core", "attn_vision"},
    "attn_train": {"attn_core", "attn_vision", "attn_nlp", "attn_clip"},
}


def _modules(package: str) -> dict[str, Path]:
    src = PACKAGES[package] / "src" / package
    out = {}
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, *, module_level_only: bool) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    tops = tree.body
    if module_level_only:  # what runs at import: skip function and class bodies
        tops = [t for t in tops if not isinstance(t, ast.FunctionDef | ast.ClassDef)]
    nodes = [n for top in tops for n in ast.walk(top)]
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base if is_pkg else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)  # "from . import x"
    return found


@pytest.mark.parametrize("package", sorted(BELOW))
def test_imports_only_packages_below(package):
    allowed = BELOW[package] | {package}
    pyproject = (PACKAGES[package] / "pyproject.toml").read_text(encoding="utf-8")
    dependencies = re.search(r"^dependencies = \[(.*?)\]\s*$", pyproject, re.M | re.S).group(1)
    deps = set(re.findall(r'"([A-Za-z0-9_.-]+)', dependencies))
    for name, path in _modules(package).items():
        used = {m.split(".")[0] for m in _imports(name, path, module_level_only=False)}
        workspace = {m for m in used if m in PACKAGES}
        assert workspace <= allowed, f"{path.relative_to(ROOT)} imports {workspace - allowed}"
        undeclared = {m for m in workspace - {package} if m.replace("_", "-") not in deps}
        assert not undeclared, f"{path.relative_to(ROOT)}: {undeclared} not in pyproject.toml"


@pytest.mark.parametrize("package", sorted(BELOW))
def test_no_import_cycle_between_modules(package):
    modules = _modules(package)
    graph = {
        name: {m for m in _imports(name, path, module_level_only=True) if m in modules} - {name}
        for name, path in modules.items()
    }
    # a package imports its submodules and they import it back (``from . import x``): that
    # is how packages work; a cycle between two sibling modules is what the rule forbids
    for name in graph:
        graph[name] = {m for m in graph[name] if not name.startswith(m + ".") and m != package}
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt) :] + [nxt] if nxt in stack else [node, nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
