"""Whole-model fusion counts (benchmarks/fusion_models.py, ``fusion.py --models``) and the
per-tensor global bytes they read (:attr:`polyfuse.cuda.codegen.kernel_ast.Kernel.tensor_bytes`).

Fast: tiny zoo models and small graphs, compiled without the CUDA check; no emulation.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import polyfuse
from polyfuse import ops, te, zoo
from polyfuse.cache import CompileCache
from polyfuse.graph.expr import IterVar

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))


def _sums(k) -> tuple[int, int]:
    return sum(r for r, _ in k.tensor_bytes.values()), sum(w for _, w in k.tensor_bytes.values())


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) for n in ("bert_base", "resnet50")]
)  # whole models: 9-11 s each
def test_tensor_bytes_sum_to_kernel_bytes_fresh_and_cached(name, tmp_path):
    """Every kernel's per-tensor bytes add up to its isl totals, whether it was generated,
    reused within the compile or served by the disk cache (the entry keeps them, renamed)."""
    m = zoo.build(name, "tiny", weights="zeros")
    for cache in (None, CompileCache(tmp_path), CompileCache(tmp_path)):
        fn = polyfuse.compile(
            m.inputs, m.outputs, constants=m.constants, check_cuda=False, cache=cache
        )
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


# --------------------------------------------------------------------------- the benchmark

import fusion_models  # noqa: E402


def _compile(inputs, outputs):
    return polyfuse.compile(inputs, outputs, check_cuda=False)


def test_layout_only_kernel_between_two_matmuls_is_detected():
    """matmul -> transpose -> matmul: the transpose folds into the second GEMM's operand
    load (issue 24 item 1), so no kernel only moves data. When the transpose is also a graph
    output whose producer has another reader, it must stay a kernel, and that kernel (one
    read through permuted subscripts) is the one layout-only kernel; the GEMMs are not."""
    a = te.placeholder((64, 32), name="a")
    w1 = te.placeholder((32, 48), name="w1")
    w2 = te.placeholder((64, 16), name="w2")
    y = ops.matmul(ops.transpose(ops.matmul(a, w1)), w2)  # (48, 64) @ (64, 16)
    fn = _compile([a, w1, w2], [y])
    assert fusion_models.layout_kernels(fn) == ([], []) and len(fn.kernels) == 2
    h = ops.matmul(a, w1)
    t = ops.transpose(h)
    fn = _compile([a, w1, w2], [ops.matmul(t, w2), t, ops.relu(h)])
    prims = fusion_models.kernel_prims(fn)
    whole, parts = fusion_models.layout_kernels(fn)
    by_name = {k.name: ps for k, ps in zip(fn.kernels, prims, strict=True)}
    transposes = [n for n, ps in by_name.items() if any(p.startswith("transpose") for p in ps)]
    assert transposes, "the transpose runs in no kernel"
    for n, ps in by_name.items():
        only_transpose = all(p.startswith("transpose") for p in ps)
        assert (n in whole) == only_transpose, (n, ps)
    assert len(whole) == 1 and set(whole) <= {p.split("/")[-1] for p in parts} | set(parts)


def test_fused_elementwise_kernel_is_not_layout_only():
    """relu(x * 2 + b) is one kernel of arithmetic: not layout-only. A concat (index-only
    where between two reads) only moves data."""
    x = te.placeholder((128, 64), name="x")
    b = te.placeholder((128, 64), name="b")
    fn = _compile([x, b], [ops.relu(ops.add(ops.mul(x, 2.0), b))])
    assert len(fn.kernels) == 1
    assert fusion_models.layout_kernels(fn) == ([], [])
    fn = _compile([x, b], [ops.concat([x, b], axis=0)])
    assert fusion_models.layout_kernels(fn)[0] == [fn.kernels[0].name]


def test_moves_data_only_expressions():
    x = te.placeholder((8, 4), name="x")
    i, j = IterVar("i", 0, 8), IterVar("j", 0, 4)  # the data axes of a compute body
    read = x[i, j]
    assert fusion_models.moves_data_only(read)
    assert not fusion_models.moves_data_only(read * 2.0)
    assert not fusion_models.moves_data_only(te.cast(read, "int32"))
    assert fusion_models.moves_data_only(te.where(i < 4, x[i, j], x[i - 4, j]))
    assert not fusion_models.moves_data_only(te.where(read > 0.0, read, 0.0))  # relu
    assert not fusion_models.moves_data_only(te.where(i < 4, read, 0.0))  # a constant fill


def test_boundary_rereads_are_intermediate():
    """An input read by two kernels: once compulsory, the second read intermediate."""
    x = te.placeholder((256, 256), name="x")
    w = te.placeholder((256, 256), name="w")
    y = ops.matmul(x, w)
    z = ops.add(ops.matmul(y, w), x)
    fn = _compile([x, w], [z])
    s = fusion_models.byte_split(fn)
    assert s["compulsory"] + s["intermediate"] == s["global"] == fn.global_bytes()
    assert s["compulsory"] == s["boundary_sizes"] == 3 * 4 * 256 * 256  # x, w, z once
    assert s["boundary_rereads"] >= 4 * 256 * 256  # w read again by the second product


@pytest.mark.slow  # five tiny models compiled and benchmarked: ~7 s
def test_benchmark_on_tiny_zoo_models(tmp_path, capsys):
    """``fusion.py --models`` on two tiny zoo models: the table, the JSON and consistent
    counts (launches >= functions, compulsory + intermediate == global)."""
    import fusion

    out = tmp_path / "m.json"
    rc = fusion.main(
        [
            "--models",
            "bert_base",
            "deepfm",
            "--size",
            "tiny",
            "--no-inductor",
            "--json",
            str(out),
            "-q",
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "bert_base" in text and "Inductor (CPU) launches" in text
    doc = json.loads(out.read_text())
    assert doc["meta"]["inductor_skipped"] == "--no-inductor"
    for name in ("bert_base", "deepfm"):
        p = doc["models"][name]["polyfuse"]
        b = p["bytes"]
        assert p["launches"] >= p["functions"] >= 1
        assert b["compulsory"] + b["intermediate"] == b["global"] and p["bytes_consistent"]
        assert b["compulsory"] <= b["boundary_sizes"]
        assert 0 <= p["layout_only"] <= p["launches"] and p["layout_parts"] >= p["layout_only"]
    bert = doc["models"]["bert_base"]["polyfuse"]
    assert bert["layout_only"] == 0  # reshapes/transposes fold into access relations (issue 24)


def test_count_wrapper_counts_cpp_and_library_calls():
    code = '''
cpp_fused_add_0 = async_compile.cpp_pybinding(['const float*', 'float*'], r"""...""")
cpp_fused_relu_1 = async_compile.cpp_pybinding(['float*'], r"""...""")
class Runner:
    def call(self, args):
        buf0 = empty_strided_cpu((16, 32), (32, 1), torch.float32)
        extern_kernels.mm(reinterpret_tensor(arg0_1, (16, 32), (32, 1), 0), arg1_1, out=buf0)
        cpp_fused_add_0(buf0, arg2_1)
        buf2 = torch.ops.mkldnn._convolution_pointwise.default(buf0, arg3_1)
        cpp_fused_add_0(buf2, arg2_1)
        cpp_fused_relu_1(buf2)
        assert_size_stride(buf2, (16, 32), (32, 1))
        return (buf2, )
'''
    assert fusion_models.count_wrapper(code) == {
        "cpp_kernels": 2,
        "cpp_launches": 3,
        "library_launches": 2,
    }


@pytest.mark.extra  # needs PyTorch
@pytest.mark.slow
def test_inductor_counts_on_a_tiny_model():
    """torch.compile of tiny DeepFM on the CPU: Inductor's kernels counted from its code."""
    pytest.importorskip("torch")
    r = fusion_models.measure_inductor("deepfm", "tiny")
    assert r["launches"] == r["cpp_launches"] + r["library_launches"] > 0
    assert r["cpp_launches"] >= r["cpp_kernels"] >= 1
