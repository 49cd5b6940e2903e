"""The GPU runtime is a leaf: it imports, and a saved artifact loads, with the compiler blocked.

A subprocess installs a ``sys.meta_path`` finder that raises on ``islpy`` and on the compiler's
layers (``polyfuse.graph``, ``polyfuse.poly``, ``polyfuse.stitch``), then imports
``polyfuse.cuda.runtime`` and loads a saved artifact (``polyfuse.load``) and its metadata:
what a GPU machine without islpy does (``benchmarks/gpu.py --run``). The same check on a copy
of the package with one compiler import planted in the runtime fails, so the check sees what
it guards. The runtime's launch limits are its own constants, equal to the compiler's.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import polyfuse
from polyfuse import ops, te

ROOT = Path(__file__).resolve().parents[1]

#: what the runtime may import from outside the package (besides the standard library)
# ml_dtypes: numpy's bfloat16 (a bfloat16 buffer is a numpy array of that dtype)
RUNTIME_THIRD_PARTY = {"numpy", "ml_dtypes", "cuda", "pycuda"}
#: the caller's array frameworks, imported inside a function when the caller passes their arrays
CALLER_ARRAYS = {"torch", "cupy", "jax"}

BLOCKED_RUN = """
import importlib.abc, json, sys
BLOCKED = ("islpy", "polyfuse.graph", "polyfuse.poly", "polyfuse.stitch")

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ImportError(f"blocked import of {{name}}")
        return None

sys.meta_path.insert(0, Block())
{prefix}
import polyfuse.cuda.runtime as runtime
import polyfuse
g = polyfuse.load({path!r})
print(json.dumps({{
    "file": polyfuse.__file__,
    "metadata": g.metadata,
    "launches": [la.kernel for la in g.launches],
    "runtime": sorted(runtime.__all__),
    "loaded": sorted(m for m in sys.modules if m.startswith(("polyfuse", "islpy"))),
}}))
"""


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    """A small compiled graph saved without cubins (the source only: no NVRTC needed)."""
    x = te.placeholder((8, 16), name="x")
    y = ops.softmax(ops.relu(x), axis=1)
    fn = polyfuse.compile([x], [y], "sm_90", name="leaf")
    path = tmp_path_factory.mktemp("leaf") / "leaf.pfa"
    fn.save(path, archs=(), metadata={"purpose": "runtime leaf"})
    return path


def _run_blocked(path: Path, cwd: Path, prefix: str = "") -> subprocess.CompletedProcess:
    code = BLOCKED_RUN.format(path=str(path), prefix=prefix)
    env = dict(os.environ, PYTHONPATH="")
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True
    )


def _installed_copy(dest: Path) -> Path:
    """A copy of the package as a wheel would unpack it (the checkout's ``polyfuse/`` is the
    installed layout); returns the folder to put on sys.path."""
    site = dest / "site"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "polyfuse", site / "polyfuse", ignore=ignore)
    return site


def test_runtime_imports_and_artifact_loads_without_the_compiler(artifact, tmp_path):
    r = _run_blocked(artifact, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["metadata"] == {"purpose": "runtime leaf"}
    assert out["launches"] and {"Device", "DeviceProgram", "open_device"} <= set(out["runtime"])
    compiler = [m for m in out["loaded"] if m == "islpy" or m.startswith(
        ("polyfuse.graph", "polyfuse.poly", "polyfuse.stitch", "polyfuse.driver", "polyfuse.te",
         "polyfuse.ops", "polyfuse.cuda.codegen"))]  # fmt: skip
    assert compiler == []


def test_a_compiler_import_planted_in_the_runtime_is_caught(artifact, tmp_path):
    """The same run over a copy of the package whose runtime imports a compiler module (as
    ``cuda/runtime/device.py`` imported ``polyfuse.poly.policy`` for a launch limit) fails on
    the blocked import."""
    site = _installed_copy(tmp_path)
    device = site / "polyfuse" / "cuda" / "runtime" / "device.py"
    src = device.read_text()
    anchor = "from .limits import STATIC_SMEM_LIMIT\n"
    assert anchor in src
    planted = "from polyfuse.poly.policy import FLOAT_BYTES\n"
    device.write_text(src.replace(anchor, anchor + planted))
    prefix = f"sys.path.insert(0, {str(site)!r})"
    r = _run_blocked(artifact, tmp_path, prefix)
    assert r.returncode != 0
    assert "blocked import of polyfuse.poly" in r.stderr
    # without the plant the copy runs: the failure is the planted import's, not the copy's
    device.write_text(src)
    r = _run_blocked(artifact, tmp_path, prefix)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["file"].startswith(str(site))


def test_runtime_imports_only_numpy_the_driver_bindings_and_itself():
    """Every import of every runtime module, inside functions too: the standard library,
    numpy, the driver bindings (cuda-bindings, pycuda), ``polyfuse.base`` and the runtime;
    and inside a function, the array framework of the caller's arrays."""
    folder = ROOT / "polyfuse" / "cuda" / "runtime"
    bad = []
    for f in sorted(folder.glob("*.py")):
        tree = ast.parse(f.read_text())
        in_functions = {
            id(n)
            for fn in ast.walk(tree)
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
            for n in ast.walk(fn)
        }
        for n in ast.walk(tree):
            if isinstance(n, ast.Import):
                names = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom) and not n.level:
                names = [n.module or ""]
            else:
                continue  # relative: the runtime itself
            for name in names:
                top = name.split(".")[0]
                if top == "polyfuse":
                    ok = name.startswith(("polyfuse.base.", "polyfuse.cuda.runtime"))
                else:
                    ok = top in sys.stdlib_module_names or top in RUNTIME_THIRD_PARTY
                    ok = ok or (top in CALLER_ARRAYS and id(n) in in_functions)
                if not ok:
                    bad.append(f"{f.name}: {name}")
    assert bad == []


def test_runtime_launch_limits_equal_the_compilers():
    from polyfuse.cuda.runtime import limits
    from polyfuse.poly import policy

    assert limits.STATIC_SMEM_LIMIT == policy.STATIC_SMEM_LIMIT
    assert limits.MAX_THREADS_PER_BLOCK == policy.MAX_THREADS_PER_BLOCK
