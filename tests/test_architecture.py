"""docs/ARCHITECTURE.md, kept true: who may import whom, no import cycles, few imports inside functions.

Read from the source with `ast` (nothing is imported), so a rule broken anywhere in the package fails here.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent  # the repository root is the `dgchat` package
SKIP_DIRS = {"tests", "engine", "assets", "docs", ".git", ".venv", "__pycache__", "build", "dist"}

# One line per layer of docs/ARCHITECTURE.md: a top-level part of the package and the parts it may import.
# `dgchat` is the package itself (its __init__: the version).
FOUNDATION = {"dgchat", "paths", "toml_files", "toml_write", "terminal_text"}
MAY_IMPORT: dict[str, set[str]] = {
    "dgchat": set(),
    "paths": set(),
    "toml_files": set(),
    "toml_write": set(),
    "terminal_text": set(),
    "model_backend": FOUNDATION,
    "recording": FOUNDATION | {"model_backend"},
    "convert": FOUNDATION | {"model_backend"},
    "npc": FOUNDATION | {"model_backend"},
    "hub": FOUNDATION | {"model_backend", "convert", "npc"},
    "server": FOUNDATION | {"model_backend", "npc", "recording"},
    "remote": FOUNDATION | {"model_backend", "npc", "recording"},
    "config": FOUNDATION | {"model_backend", "hub"},
    "commands": FOUNDATION | {"model_backend", "recording", "convert", "npc", "hub", "server", "remote", "config"},
    "app": FOUNDATION | {"model_backend", "recording", "npc", "hub", "remote", "config", "convert"},
    "cli": FOUNDATION | {"model_backend", "hub", "commands", "app", "config"},
    "__main__": {"cli"},
}
MAX_IMPORTS_IN_FUNCTIONS = 20  # issue 32 asked <= 40; 14 at the move


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the dgchat module imported
    line: int
    in_function: bool
    commented: bool  # a comment on the line or the line above says why


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in SKIP_DIRS or any(p.startswith(".") for p in rel.parts):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(["dgchat", *parts])] = path
    return found


MODULES = _modules()


def _targets(module: str, node: ast.Import | ast.ImportFrom, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = module.split(".")[: None if is_package else -1]
            base = base[: len(base) - (node.level - 1)]
            name = ".".join(base + ([node.module] if node.module else []))
        else:
            name = node.module or ""
        names = [f"{name}.{a.name}" if f"{name}.{a.name}" in MODULES else name for a in node.names]
    out = []
    for name in names:
        while name and name not in MODULES:  # `import dgchat.a.b.Thing` -> the module dgchat.a.b
            name = name.rpartition(".")[0]
        if name.startswith("dgchat"):
            out.append(name)
    return out


def _is_type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def _imports() -> list[Import]:
    found: list[Import] = []
    for module, path in MODULES.items():
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        is_package = path.name == "__init__.py"

        def visit(node: ast.AST, in_function: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _is_type_checking(child):
                    continue  # typing only: never runs
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    visit(child, True)
                elif isinstance(child, (ast.Import, ast.ImportFrom)):
                    around = " ".join(lines[max(0, child.lineno - 2): child.end_lineno])
                    for target in _targets(module, child, is_package):
                        found.append(Import(module, target, child.lineno, in_function, "#" in around))
                else:
                    visit(child, in_function)

        visit(ast.parse(source), False)
    return found


IMPORTS = _imports()


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "dgchat"


def test_the_rules_see_the_package() -> None:
    assert {"dgchat.model_backend", "dgchat.app.app", "dgchat.cli"} <= set(MODULES)
    assert len(IMPORTS) > 500


def test_no_import_cycle_at_run_time() -> None:
    """Counting imports inside functions too: those run, so a cycle through them is still a cycle."""
    graph: dict[str, set[str]] = defaultdict(set)
    for imp in IMPORTS:
        if imp.target != imp.module:
            graph[imp.module].add(imp.target)
    cycles = _strongly_connected(graph)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in cycles)


def test_layers() -> None:
    wrong = sorted({f"{imp.module} imports {imp.target} (line {imp.line})" for imp in IMPORTS
                    if _part(imp.module) != _part(imp.target)
                    and _part(imp.target) not in MAY_IMPORT.get(_part(imp.module), set())})
    assert not wrong, "\n".join(wrong)
    assert set(MAY_IMPORT) >= {_part(m) for m in MODULES}, "a new top-level part needs its row in MAY_IMPORT"


def test_imports_inside_functions_are_few_and_say_why() -> None:
    inside = [imp for imp in IMPORTS if imp.in_function]
    statements = {(imp.module, imp.line) for imp in inside}  # `from a import b, c` is one import
    assert len(statements) <= MAX_IMPORTS_IN_FUNCTIONS, f"{len(statements)} dgchat imports inside functions"
    silent = [f"{imp.module}:{imp.line} {imp.target}" for imp in inside if not imp.commented]
    assert not silent, "an import inside a function needs a comment saying why:\n" + "\n".join(silent)


@pytest.mark.parametrize("folder", ["server", "npc", "remote", "commands", "app", "hub", "recording"])
def test_no_engine_is_typed_any(folder: str) -> None:
    """Engines are typed against model_backend's Engine protocol, so a reader sees which calls are used."""
    loose = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.arg) and "engine" in node.arg.lower():
                annotation = node.annotation
            elif isinstance(node, ast.AnnAssign) and "engine" in ast.unparse(node.target).lower():
                annotation = node.annotation
            else:
                continue
            if annotation is not None and ast.unparse(annotation) in {"Any", "Any | None", "'Any'"}:
                loose.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not loose, "engines typed Any: " + ", ".join(loose)


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative (the graph has hundreds of nodes)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    counter = 0
    for root in list(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found
