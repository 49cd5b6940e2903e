"""Layer 3 packing and dedup on the kernel IR (issue 21, item 3).

A pack is a :class:`KDispatch` node holding each part's printed function; the printer is given
each part's block and thread index (no text substitution), and dedup keys on a structural hash
of the canonical record, not on renamed text.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import polyfuse
from polyfuse import ops, te
from polyfuse.cuda.codegen.dedup import structural_hash
from polyfuse.cuda.codegen.kernel_dispatch import KDispatch, dispatch_of, print_dispatch
from polyfuse.cuda.codegen.kernel_function import PART_BLOCK, PART_THREAD, print_function
from polyfuse.cuda.codegen.layer3 import part_shape
from polyfuse.cuda.codegen.pack import pack_kernels
from polyfuse.cuda.codegen.printer import PRELUDE
from polyfuse.cuda.emulator import Emulator
from polyfuse.cuda.runtime.launch import Launch
from polyfuse.stitch.parallel import pack_layout

ROOT = Path(__file__).resolve().parents[1]


def _two_kernels(y_shape: tuple[int, int]):
    """A row sum (a collective kernel: shuffles) and an independent elementwise kernel, each
    launched alone (Layer 3 off), with their inputs."""
    x = te.placeholder((64, 512), name="x")
    y = te.placeholder(y_shape, name="y")
    r = ops.reduce_sum(x, axis=1, name="rsum")
    z = te.compute(y_shape, lambda i, j: y[i, j] * 2.0 + 1.0, name="z")
    fn = polyfuse.compile([x, y], [r, z], check_cuda=False, pack=False)
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((64, 512)).astype(np.float32)
    ys = rng.standard_normal(y_shape).astype(np.float32)
    return fn.kernels, {"x": xs, "y": ys}, {"rsum": xs.sum(axis=1), "z": ys * 2 + 1}


@pytest.mark.parametrize(
    "y_shape, kind",
    [((96, 128), "split"), ((2, 32), "fold")],  # z: 256 or 64 threads beside 128
)
def test_pack_built_from_ir_parts_runs_like_numpy(y_shape, kind):
    kernels, inputs, want = _two_kernels(y_shape)
    lay = pack_layout([part_shape(k) for k in kernels])
    assert not isinstance(lay, str), lay
    packed = pack_kernels("pk_t", kernels, lay.block, lay.ranges)
    d = dispatch_of(packed)
    assert isinstance(d, KDispatch) and packed.body == [d]
    red, ew = d.parts
    assert not red.local_thread  # a part with shuffles keeps its block's thread index
    assert red.function.own_thread_index and not ew.function.own_thread_index  # its combine
    with pytest.raises(AssertionError, match="reads threadIdx.x"):
        print_function(red.function, "pk_t_p0", PART_BLOCK, PART_THREAD)
    assert ew.local_thread and (ew.threads > d.block if kind == "split" else ew.fold > 1)
    # every part printed by the printer with its indices as parameters, under the pack's name
    for i, (p, k) in enumerate(zip(d.parts, kernels, strict=True)):
        thread = PART_THREAD if p.local_thread else "threadIdx.x"
        assert print_function(p.function, f"pk_t_p{i}", PART_BLOCK, thread) in packed.source
        assert p.function == k.printed and p.body == tuple(k.body)
    assert packed.source == print_dispatch(d, "pk_t")
    assert "blockIdx.x" not in packed.source.split('extern "C"')[0]  # only the dispatcher's
    assert f"int _t = {PART_THREAD};" in packed.source  # the folded/split part's own index

    buffers = {
        p.name: inputs[p.tensor].copy()
        if p.tensor in inputs
        else np.zeros(want[p.tensor].shape, np.float32)
        for p in packed.params
    }
    module = Emulator().load(PRELUDE + packed.source)
    launch = Launch(
        "pk_t",
        packed.grid,
        packed.block,
        tuple(p.name for p in packed.params),
        packed.dynamic_shared_bytes,
    )
    module.run([launch], buffers, order="reverse")
    by_tensor = {p.tensor: buffers[p.name] for p in packed.params}
    np.testing.assert_allclose(by_tensor["rsum"], want["rsum"], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(by_tensor["z"], want["z"])


def test_layers_dedup_by_structural_hash_one_constant_apart_do_not():
    """Two layers of the same structure on different tensors hash alike (tensor parameters by
    position, kernel names not hashed); a layer with one constant changed does not; packs of
    alike parts in the same layout hash alike, in another order not."""
    x1, x2, x3 = (te.placeholder((32, 256), name=f"x{i}") for i in (1, 2, 3))

    def layer(x, k: float, name: str):
        return ops.reduce_sum(te.compute((32, 256), lambda i, j: x[i, j] * k, name=name), axis=1)

    a, b = layer(x1, 2.0, "a2"), layer(x2, 2.0, "b2")  # two layers of one structure
    c, d = layer(x2, 3.0, "c3"), layer(x3, 3.0, "d3")  # one constant changed
    fn = polyfuse.compile([x1, x2, x3], [a, b, c, d], check_cuda=False, pack=False)
    ka, kb, kc, kd = sorted(fn.kernels, key=lambda k: k.micrographs[0])
    ha, hb, hc, hd = (structural_hash(k) for k in (ka, kb, kc, kd))
    assert ha is not None and ha == hb != hc == hd
    assert ka.function == kb.function != kc.function  # the table keys on the hash
    assert fn.cuda_source.count('extern "C" __global__') == 2  # each distinct function once
    assert ka.printed != kb.printed  # their own texts differ (real names) ...
    assert ka.canonical == kb.canonical  # ... their canonical records do not

    def pack(name, parts):
        lay = pack_layout([part_shape(k) for k in parts])
        assert not isinstance(lay, str)
        return pack_kernels(name, parts, lay.block, lay.ranges)

    assert structural_hash(pack("p0", [ka, kc])) == structural_hash(pack("p1", [kb, kd]))
    assert structural_hash(pack("p2", [kc, ka])) != structural_hash(pack("p0", [ka, kc]))
    # b and c read the same buffer, passed once: another structure than a and d's
    assert structural_hash(pack("p3", [kb, kc])) != structural_hash(pack("p4", [ka, kd]))

    xs = np.random.default_rng(1).standard_normal((3, 32, 256)).astype(np.float32)
    got = fn(xs[0], xs[1], xs[2], device="emulate")
    for r, x, k in zip(got, (xs[0], xs[1], xs[1], xs[2]), (2, 2, 3, 3), strict=True):
        np.testing.assert_allclose(r, (x * k).sum(axis=1), rtol=1e-4, atol=1e-4)


def _imports_re(path: Path) -> bool:
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Import) and any(a.name == "re" for a in n.names):
            return True
        if isinstance(n, ast.ImportFrom) and n.module == "re":
            return True
    return False


def test_no_regex_in_packing_and_dedup():
    """Packing and dedup read typed records only: no ``re`` in stitch/, cuda/pack*,
    cuda/dedup* (nor in the dispatch node and function printer they use), and the namer has
    no identifier rewriting for them."""
    files = [
        *(ROOT / "polyfuse" / "stitch").glob("*.py"),
        *(ROOT / "polyfuse" / "cuda" / "codegen").glob("pack*.py"),
        *(ROOT / "polyfuse" / "cuda" / "codegen").glob("dedup*.py"),
        ROOT / "polyfuse" / "cuda" / "codegen" / "kernel_dispatch.py",
        ROOT / "polyfuse" / "cuda" / "codegen" / "kernel_function.py",
        ROOT / "polyfuse" / "cuda" / "codegen" / "layer3.py",
    ]
    assert len(files) >= 7
    assert [f.name for f in files if _imports_re(f)] == []
    from polyfuse.cuda.codegen import namer

    for rewriter in ("rename_identifiers", "instantiate", "rename_canonical"):
        assert not hasattr(namer, rewriter), rewriter
