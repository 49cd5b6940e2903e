"""The package's import graph has no cycle, counting imports inside functions too.

A lazy import inside a function hides a cycle from Python but not from a reader: layers then
depend on each other both ways (the compiled graph on the visualizer, the visualizer on the
driver). This walks every module of every package listed in pyproject.toml.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, Path]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mods: dict[str, Path] = {}
    for pkg in config["tool"]["setuptools"]["packages"]:
        # find_spec locates a package without running its __init__ (polyfuse.torch imports
        # torch, an optional dependency the README's test command does not install)
        spec = importlib.util.find_spec(pkg)
        assert spec is not None and spec.submodule_search_locations, pkg
        for f in Path(list(spec.submodule_search_locations)[0]).glob("*.py"):
            mods[pkg if f.stem == "__init__" else f"{pkg}.{f.stem}"] = f
    return mods


def import_graph() -> dict[str, set[str]]:
    """Module → the package modules it imports anywhere in its source. ``from P import x``
    points at ``P.x`` when that is a module, else at ``P``."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        is_pkg = path.stem == "__init__"
        for n in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(n, ast.Import):
                targets = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                mod = n.module or ""
                if n.level:
                    parts = name.split(".")
                    base = ".".join(parts[: len(parts) - n.level + is_pkg])
                    mod = f"{base}.{mod}" if mod else base
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod for a in n.names]
            graph[name].update(t for t in targets if t in mods and t != name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (as a path that returns to its start), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def dfs(u: str) -> list[str] | None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                return stack[stack.index(v) :] + [v]
            if v not in state and (found := dfs(v)):
                return found
        stack.pop()
        state[u] = 2
        return None

    for u in sorted(graph):
        if u not in state and (found := dfs(u)):
            return found
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_graph_sees_lazy_and_relative_imports():
    g = import_graph()
    assert "polyfuse.viz" in g["polyfuse.compiled"]  # inside CompiledGraph.visualize
    assert "polyfuse.cuda.runtime.driver" in g["polyfuse.cuda.runtime.pycuda_driver"]  # relative


def test_package_import_graph_has_no_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_split_modules_keep_their_public_import_paths():
    """cuda/emulator.py and polyfuse/batch.py were split; their public names still import."""
    import polyfuse.batch as batch
    import polyfuse.cuda.emulator as emulator

    for mod in (batch, emulator):
        missing = [n for n in mod.__all__ if not hasattr(mod, n)]
        assert missing == [], f"{mod.__name__} lost {missing}"
    assert set(emulator.__all__) >= {"Emulator", "EmulatedModule", "KernelSignature", "prepass"}
