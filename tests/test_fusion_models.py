"""Whole-model fusion counts (benchmarks/fusion_models.py, ``fusion.py --models``) and the
per-tensor global bytes they read (:attr:`polyfuse.cuda.kernel_ast.Kernel.tensor_bytes`).

Fast: tiny zoo models and small graphs, compiled without the CUDA check; no emulation.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import polyfuse
from polyfuse import ops, te, zoo
from polyfuse.cache import CompileCache

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))


def _sums(k) -> tuple[int, int]:
    return sum(r for r, _ in k.tensor_bytes.values()), sum(w for _, w in k.tensor_bytes.values())


@pytest.mark.parametrize("name", ["bert_base", "resnet50"])
def test_tensor_bytes_sum_to_kernel_bytes_fresh_and_cached(name, tmp_path):
    """Every kernel's per-tensor bytes add up to its isl totals, whether it was generated,
    reused within the compile or served by the disk cache (the entry keeps them, renamed)."""
    m = zoo.build(name, "tiny", weights="zeros")
    for cache in (None, CompileCache(tmp_path), CompileCache(tmp_path)):
        fn = polyfuse.compile(m.inputs, m.outputs, constants=m.constants, check_cuda=False,
                              cache=cache)  # fmt: skip
        params = [{p.tensor for p in k.params if p.tensor} for k in fn.kernels]
        for k, ps in zip(fn.kernels, params, strict=True):
            assert k.tensor_bytes, k.name
            assert _sums(k) == (k.bytes_read, k.bytes_written), k.name
            assert set(k.tensor_bytes) <= ps, k.name  # named by this compile's tensors


def test_tensor_bytes_of_a_pack_count_a_shared_input_once():
    """Two branches reading one input, packed into one launch (Layer 3): the input's bytes
    are its distinct elements once, and the per-tensor bytes still sum to the kernel's."""
    x = te.placeholder((256, 512), name="x")
    a = ops.reduce_sum(ops.exp(x), axis=1)
    b = ops.reduce_max(ops.tanh(x), axis=1)
    fn = polyfuse.compile([x], [a, b], check_cuda=False)
    (k,) = fn.kernels
    assert k.name.startswith("pk") and len(k.micrographs) == 2  # a Layer 3 pack
    assert _sums(k) == (k.bytes_read, k.bytes_written)
    assert k.tensor_bytes[fn.plan.graph.ident(x)][0] == 4 * 256 * 512
