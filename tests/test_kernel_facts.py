"""Kernel facts (polyfuse.stitch.facts): lowering records shared memory, registers and
synchronisation as data; Layer 3 packs from them, and they equal what ptxas reports."""

import sys
from pathlib import Path

import numpy as np
import pytest

import polyfuse
from polyfuse import examples, ops, te, zoo
from polyfuse.base.decision import DecisionKind
from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda
from polyfuse.poly.policy import STATIC_SMEM_LIMIT, gemm_tile_registers
from polyfuse.reference import evaluate
from polyfuse.stitch.facts import KernelFacts, SharedArray, pack_facts, shared_layout

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import suite  # noqa: E402

SUITE_SCALE = 512  # rows / 512; every reduced (shared-memory) axis keeps its full size
needs_compiler = pytest.mark.skipif(not available_compilers(), reason="no CUDA compiler")


def _check_against_reference(fn, inputs, outputs, seed=0):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(t.shape, dtype=np.float32) for t in inputs]
    want = evaluate(outputs, dict(zip(inputs, arrays, strict=True)))
    got = fn(*arrays, race_check="reverse")
    got = got if isinstance(got, tuple) else (got,)
    for g, w, t in zip(got, want, outputs, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=t.name)


def _packs_within_the_limit(fn):
    """Every pack made fits static shared memory; a refused one says why, typed."""
    for k in fn.kernels:
        assert k.facts.static_shared_bytes <= STATIC_SMEM_LIMIT, k.name
    refused = [d for d in fn.plan.packs if DecisionKind.FOOTPRINT in d.decision_kinds]
    assert refused, str(fn.plan)
    for d in refused:
        assert not d.packed and d.data["static_bytes"] > STATIC_SMEM_LIMIT
        assert f"{d.data['static_bytes']} B" in d.reason
    return refused


def test_three_softmaxes_of_float4_rows_pack_within_the_shared_memory_limit():
    """Each 8x4096 softmax keeps its row of exponentials in an ``__align__(16)`` shared array
    (20 KB with its scratch): two fit one block, three do not (issue 19, item 4; the text
    regex missed aligned arrays, packed all three and ptxas refused 60 KB)."""
    xs = [te.placeholder((8, 4096), name=f"x{i}") for i in range(3)]
    outs = [ops.softmax(x, name=f"s{i}") for i, x in enumerate(xs)]
    fn = polyfuse.compile(xs, outs, check_cuda="auto")
    assert len(fn.kernels) == 2, str(fn.plan)
    assert any(d.packed for d in fn.plan.packs)
    _packs_within_the_limit(fn)
    (pack,) = [k for k in fn.kernels if k.facts.parts == 2]
    assert pack.shared_bytes == 2 * fn.kernels[1 - fn.kernels.index(pack)].shared_bytes
    if fn.kernels[0].static_shared_bytes is not None:  # ptxas ran
        assert [k.shared_bytes for k in fn.kernels] == [k.static_shared_bytes for k in fn.kernels]
    _check_against_reference(fn, xs, outs)


def test_six_independent_matmuls_pack_within_the_shared_memory_limit():
    """Six 64x64x64 GEMMs (9.3 KB of shared tiles each, registers estimated by the tile
    model): packs stay within 48 KB (issue 19, item 4: ptxas refused 56.8 KB)."""
    ins, outs = [], []
    for i in range(6):
        a, b = te.placeholder((64, 64), name=f"a{i}"), te.placeholder((64, 64), name=f"b{i}")
        k = te.reduce_axis(64, name="k")
        outs.append(
            te.compute(
                (64, 64),
                lambda m, n, a=a, b=b, k=k: te.sum(a[m, k] * b[k, n], axis=k),
                name=f"c{i}",
            )
        )
        ins += [a, b]
    fn = polyfuse.compile(ins, outs, check_cuda="auto")
    assert len(fn.kernels) < 6 and any(d.packed for d in fn.plan.packs), str(fn.plan)
    _packs_within_the_limit(fn)
    for k in fn.kernels:
        assert k.facts.barriers and k.facts.registers is not None
        assert k.shared_bytes > 0  # the GEMM tiles (read 0 before facts)
    if fn.kernels[0].static_shared_bytes is not None:
        assert [k.shared_bytes for k in fn.kernels] == [k.static_shared_bytes for k in fn.kernels]
    _check_against_reference(fn, ins, outs)


def test_a_gemm_kernel_records_its_tiles_and_register_estimate():
    """The 4096^3 matmul: its shared tiles and the tile model's registers, from the IR."""
    a, b = te.placeholder((4096, 4096), name="a"), te.placeholder((4096, 4096), name="b")
    fn = polyfuse.compile([a, b], [ops.matmul(a, b, name="c")], check_cuda="auto")
    (k,) = fn.kernels
    assert k.shared_bytes > 8 * 1024 and k.facts.dynamic_shared_bytes == 0  # it read 0
    assert k.static_shared_bytes in (None, k.shared_bytes)  # ptxas agrees where it ran
    assert k.facts.barriers and not k.facts.shuffles
    (tile,) = [
        d for kp in fn.plan.kernel_plans for d in kp.layout if DecisionKind.GEMM_TILE in d.kinds
    ]
    _, _, tm, tn = *tile.data["block_tile"], *tile.data["micro_tile"]
    assert k.facts.registers == gemm_tile_registers(tm, tn)
    assert k.facts.async_copies == ("__pipeline_memcpy_async" in k.source)


def test_facts_round_trip_through_json_and_packs_concatenate_arrays():
    f = KernelFacts((SharedArray(12, 4), SharedArray(32, 16)), 64, 40, True, True)
    assert KernelFacts.from_json(f.to_json()) == f
    assert f.static_shared_bytes == 48 and f.shared_bytes == 112 and f.collective
    g = KernelFacts((SharedArray(16, 16),), 128)
    p = pack_facts([f, g])
    assert p.shared_arrays == f.shared_arrays + g.shared_arrays and p.parts == 2
    assert (p.static_shared_bytes, p.dynamic_shared_bytes, p.registers) == (64, 128, None)
    assert not KernelFacts().collective


@needs_compiler
def test_the_static_layout_is_the_one_ptxas_makes():
    """Each array at the next multiple of its alignment, in declaration order; the static
    arrays of a pack's device functions add up (they are not overlaid)."""
    cases = [
        [(3, 0)],
        [(3, 0), (8, 16)],
        [(8, 16), (3, 0)],
        [(3, 0), (8, 16), (5, 0)],
        [(7, 0)] * 2,
    ]
    src = []
    for j, decls in enumerate(cases):
        body = []
        for i, (n, al) in enumerate(decls):
            align = f"__align__({al}) " if al else ""
            body.append(f"__shared__ {align}float v{i}[{n}]; v{i}[threadIdx.x % {n}] = 1.0f;")
        total = " + ".join(f"v{i}[(threadIdx.x + 1) % {n}]" for i, (n, _) in enumerate(decls))
        src.append(
            f'extern "C" __global__ void k{j}(float* o) {{ {" ".join(body)} '
            f"__syncthreads(); o[threadIdx.x] = {total}; }}"
        )
    src.append(
        "__device__ __forceinline__ void p0(float* o) { __shared__ float a[3]; a[threadIdx.x % 3]"
        " = 1.0f; __syncthreads(); o[threadIdx.x] = a[(threadIdx.x + 1) % 3]; }\n"
        "__device__ __forceinline__ void p1(float* o) { __shared__ __align__(16) float b[4]; "
        "b[threadIdx.x % 4] = 1.0f; __syncthreads(); o[threadIdx.x] = b[(threadIdx.x + 1) % 4]; }\n"
        'extern "C" __global__ void pk(float* o) { if (blockIdx.x == 0) p0(o); else p1(o); }'
    )
    res = compile_cuda("\n".join(src), "sm_80").resources
    for j, decls in enumerate(cases):
        arrays = tuple(SharedArray(4 * n, al or 4) for n, al in decls)
        assert shared_layout(arrays) == res[f"k{j}"].shared_bytes, decls
    parts = [KernelFacts((SharedArray(12, 4),)), KernelFacts((SharedArray(16, 16),))]
    assert pack_facts(parts).static_shared_bytes == res["pk"].shared_bytes == 32


# ---------------------------------------------------------------- facts equal ptxas's report


def _graphs(kind: str):
    if kind == "examples":
        for name, ex in examples.EXAMPLES.items():
            i, o, _ = ex.build()
            yield name, i, o, {}
    elif kind == "suite":
        for name in suite.NAMES:
            i, o, _ = suite.build(name, SUITE_SCALE)
            yield name, i, o, {}
    else:
        for name in zoo.MODELS:
            m = zoo.build(name, "tiny")
            yield name, m.inputs, m.outputs, m.constants


def _facts_match_ptxas(kind: str) -> None:
    checked = 0
    for name, inputs, outputs, constants in _graphs(kind):
        fn = polyfuse.compile(inputs, outputs, constants=constants, check_cuda=True, name=name)
        binary = fn.cuda_binaries[fn.arch]
        launches = {lc.kernel: lc for lc in fn.launches}
        for k in fn.kernels:
            static = k.static_shared_bytes  # ptxas's report
            assert k.shared_bytes == static + launches[k.name].shared_bytes, (name, k.name)
            if binary.resources[k.function or k.name].barriers:
                assert k.facts.barriers, (name, k.name)
            checked += 1
    assert checked


@needs_compiler
@pytest.mark.parametrize("kind", ["examples", "suite"])
def test_shared_bytes_equal_ptxas_static_plus_dynamic(kind):
    _facts_match_ptxas(kind)


@needs_compiler
@pytest.mark.slow
def test_shared_bytes_equal_ptxas_static_plus_dynamic_zoo():
    _facts_match_ptxas("zoo")
