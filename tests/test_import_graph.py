"""The package's import graph has no cycle and follows the layer table, counting imports inside
functions too.

A lazy import inside a function hides a cycle from Python but not from a reader: layers then
depend on each other both ways (the compiled graph on the visualizer, the visualizer on the
driver). This walks every module of every package under ``polyfuse/``.

The layer table (DESIGN.md "Layout"): ``polyfuse.base`` imports no layer; ``graph`` → ``poly``
→ ``stitch`` → ``cuda``, each importing only what sits before it and base; the facade (every
other ``polyfuse`` module) sits above all and no layer imports it. The GPU runtime
(``polyfuse.cuda.runtime``) is a leaf: it imports base and itself only (numpy and the driver
bindings outside the package, ``tests/test_runtime_leaf.py``), so a saved artifact runs without
the compiler; the emulator (``polyfuse.cuda.emulator``) imports base, the runtime's launch
records and itself, not code generation or the toolchain (``polyfuse.cuda.codegen``,
``polyfuse.cuda.toolchain``), which sit in the ``cuda`` layer.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    inits = ROOT.glob("polyfuse/**/__init__.py")
    for pkg in sorted(".".join(i.parent.relative_to(ROOT).parts) for i in inits):
        # find_spec locates a package without running its __init__ (polyfuse.torch imports
        # torch, an optional dependency the README's test command does not install)
        spec = importlib.util.find_spec(pkg)
        assert spec is not None and spec.submodule_search_locations, pkg
        for f in Path(list(spec.submodule_search_locations)[0]).glob("*.py"):
            mods[pkg if f.stem == "__init__" else f"{pkg}.{f.stem}"] = f
    return mods


def import_graph(sources: dict[str, str] | None = None) -> dict[str, set[str]]:
    """Module → the package modules it imports anywhere in its source. ``from P import x``
    points at ``P.x`` when that is a module, else at ``P``. ``sources``: module → source text
    to read instead of its file (a planted import)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        is_pkg = path.stem == "__init__"
        text = (sources or {}).get(name) or path.read_text()
        for n in ast.walk(ast.parse(text)):
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


#: Each layer and the layers its modules may import (itself included).
LAYERS: dict[str, set[str]] = {
    "base": {"base"},
    "graph": {"base", "graph"},
    "poly": {"base", "graph", "poly"},
    "stitch": {"base", "graph", "poly", "stitch"},
    "cuda": {"base", "graph", "poly", "stitch", "cuda", "runtime"},
    "emulator": {"base", "runtime", "emulator"},
    "runtime": {"base", "runtime"},
    "facade": {"base", "graph", "poly", "stitch", "cuda", "emulator", "runtime", "facade"},
}


def layer_of(module: str) -> str:
    """The layer of a ``polyfuse`` module: its folder below ``polyfuse`` (the runtime and the
    emulator apart from the rest of ``cuda``: codegen and the toolchain), else the facade."""
    parts = module.split(".")
    if parts[1:3] in (["cuda", "runtime"], ["cuda", "emulator"]):
        return parts[2]
    if len(parts) > 1 and parts[1] in LAYERS and parts[1] != "facade":
        return parts[1]
    return "facade"


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import of ``graph`` the layer table forbids, as ``"importer -> imported
    (layer -> layer)"``."""
    out = []
    for mod in sorted(graph):
        for dep in sorted(graph[mod]):
            a, b = layer_of(mod), layer_of(dep)
            if b not in LAYERS[a]:
                out.append(f"{mod} -> {dep} ({a} -> {b})")
    return out


def test_layer_check_catches_planted_violations():
    """The checker itself, on a synthetic graph: a layer importing the facade, a lower layer
    importing a higher one and base importing a layer are caught; the allowed directions
    are not."""
    graph = {
        "polyfuse.poly.mapping": {"polyfuse.graph.expr", "polyfuse.base.errors"},
        "polyfuse.stitch.parallel": {"polyfuse.compiled", "polyfuse.poly.device"},
        "polyfuse.poly.timing": {"polyfuse.cuda.codegen.kernel_ast"},
        "polyfuse.base.store": {"polyfuse.graph.expr"},
        "polyfuse.driver": {"polyfuse.cuda.toolchain.compiler", "polyfuse.base.settings"},
        "polyfuse.cuda.toolchain.compiler": {"polyfuse.base.store", "polyfuse.cuda.runtime.launch"},
        "polyfuse.cuda.runtime.device": {
            "polyfuse.cuda.toolchain.compiler",
            "polyfuse.base.errors",
        },
        "polyfuse.cuda.runtime.program": {"polyfuse.poly.policy", "polyfuse.cuda.runtime.launch"},
        "polyfuse.cuda.emulator.build": {"polyfuse.cuda.toolchain.toolkit", "polyfuse.base.store"},
        "polyfuse.cuda.emulator.server": {"polyfuse.cuda.runtime.launch"},
    }
    assert layer_violations(graph) == [
        "polyfuse.base.store -> polyfuse.graph.expr (base -> graph)",
        "polyfuse.cuda.emulator.build -> polyfuse.cuda.toolchain.toolkit (emulator -> cuda)",
        "polyfuse.cuda.runtime.device -> polyfuse.cuda.toolchain.compiler (runtime -> cuda)",
        "polyfuse.cuda.runtime.program -> polyfuse.poly.policy (runtime -> poly)",
        "polyfuse.poly.timing -> polyfuse.cuda.codegen.kernel_ast (poly -> cuda)",
        "polyfuse.stitch.parallel -> polyfuse.compiled (stitch -> facade)",
    ]


def test_layer_check_catches_a_violation_planted_in_the_source():
    """A lazy import of the facade planted inside a function of a layer module (parsed, not
    run) is caught: the graph counts imports inside functions."""
    import textwrap

    mods = _modules()
    src = mods["polyfuse.poly.mapping"].read_text() + textwrap.dedent("""

        def _planted():
            from polyfuse.compiled import CompiledGraph
            return CompiledGraph
        """)
    graph = import_graph({"polyfuse.poly.mapping": src})
    assert "polyfuse.compiled" in graph["polyfuse.poly.mapping"]
    assert (
        "polyfuse.poly.mapping -> polyfuse.compiled (poly -> facade)" in layer_violations(graph)
    )


def test_package_imports_follow_the_layer_table():
    bad = layer_violations(import_graph())
    assert bad == [], "imports the layer table forbids:\n" + "\n".join(bad)


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
