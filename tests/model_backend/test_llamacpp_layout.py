"""The llama.cpp wrapper's layout: `dgchat.model_backend.llamacpp` is the only code that imports
`ctypes` or `llama_cpp`, and each of its modules imports on its own (in a fresh interpreter, without
the package's __init__ having loaded its siblings first), so the modules form layers, not a knot."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import dgchat
import pytest

PACKAGE_ROOT = Path(dgchat.__file__).resolve().parent  # the repository root is the dgchat package
WRAPPER = PACKAGE_ROOT / "model_backend" / "llamacpp"
LOW_LEVEL = ("ctypes", "llama_cpp")
# not dgchat's code: tests (they may poke at llama.cpp directly), build and tool output
SKIPPED_DIRS = {"tests", "__pycache__", "build", "dist", "runs"}


def _python_files() -> list[Path]:
    found = []
    for folder, dirs, files in os.walk(PACKAGE_ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS and not d.endswith(".egg-info")]
        found.extend(Path(folder) / f for f in files if f.endswith(".py"))
    return sorted(found)


def _low_level_imports(path: Path) -> list[str]:
    """`import ctypes`, `from llama_cpp import x`, ... anywhere in the file (functions included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        hits.extend(f"{path.relative_to(PACKAGE_ROOT)}:{node.lineno}: {name}" for name in names
                    if name.split(".")[0] in LOW_LEVEL)
    return hits


def test_only_the_wrapper_imports_ctypes_or_llama_cpp() -> None:
    files = _python_files()
    assert len(files) > 50 and any(p.is_relative_to(WRAPPER) for p in files)  # the walk found the package
    outside = [hit for p in files if not p.is_relative_to(WRAPPER) for hit in _low_level_imports(p)]
    assert outside == [], "only model_backend/llamacpp/ may import ctypes or llama_cpp:\n" + "\n".join(outside)
    # and the check itself sees an import where there is one
    assert any(_low_level_imports(p) for p in WRAPPER.glob("*.py"))


def _submodules() -> list[str]:
    return sorted(p.stem for p in WRAPPER.glob("*.py") if p.stem != "__init__")


# Registers the package as an empty namespace first, so its __init__ (which imports every module)
# does not run: the module under test must import exactly what it needs, in its own order.
_IMPORT_ALONE = """
import importlib, sys, types
import dgchat.model_backend as mb
pkg = types.ModuleType("dgchat.model_backend.llamacpp")
pkg.__path__ = [mb.__path__[0] + "/llamacpp"]
sys.modules[pkg.__name__] = pkg
importlib.import_module("dgchat.model_backend.llamacpp." + sys.argv[1])
"""


@pytest.mark.parametrize("name", _submodules())
def test_each_wrapper_module_imports_on_its_own(name: str) -> None:
    res = subprocess.run([sys.executable, "-c", _IMPORT_ALONE, name], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def test_the_package_exports_what_callers_use() -> None:
    code = ("from dgchat.model_backend import llamacpp; "
            "missing = [n for n in llamacpp.__all__ if not hasattr(llamacpp, n)]; "
            "assert not missing, missing; print(len(llamacpp.__all__))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert int(res.stdout) >= 30
