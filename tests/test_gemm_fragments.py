"""Register fragments of GEMM operands (issue 12, PPCG's register promotion): isl's decision,
the 4096³ kernel's kk loop reading registers only, and correctness at the edge cases.

The emulator tests of :mod:`tests.test_gemm_tiling` (matmul, batched matmul, conv with stride,
padding, dilation and groups, attention, in every race-check order) run these kernels too;
:func:`test_fragments_in_every_emulated_configuration` checks they do have fragments.
"""

from __future__ import annotations

import re

import islpy as isl
import numpy as np
import pytest

import polyfuse
from polyfuse import ops, te
from polyfuse.base.decision import DecisionKind
from polyfuse.poly.fragments import register_fragments
from polyfuse.poly.mapping import MappingConfig
from polyfuse.poly.model import Statement

ORDERS = (False, "reverse", "random")


def _fragment_notes(fn) -> list[str]:
    return [n for k in fn.kernels for n in k.notes if "register fragment" in n]


def _micro_tile(accesses: dict[str, str], accumulators: int = 4):
    """A 2x2 micro-tile (t + 4 ii per data dim) in k-tiles of 8, reading ``accesses``."""
    ctx = isl.Context()
    sched = isl.UnionMap(
        "[t0, t1] -> { U[d0, d1, r] -> [kt0, 2, 0, kk0, ii0, ii1, 0] : d0 = t0 + 4ii0 and "
        "d1 = t1 + 4ii1 and r = 8kt0 + kk0 and 0 <= ii0 < 2 and 0 <= ii1 < 2 and "
        "0 <= kk0 < 8 and 0 <= kt0 < 2 and 0 <= t0 < 4 and 0 <= t1 < 4 }",
        context=ctx,
    )
    update = Statement.__new__(Statement)
    object.__setattr__(update, "name", "U")
    ops_ = [(t, isl.Map(f"{{ U[d0, d1, r] -> {a} }}", context=ctx)) for t, a in accesses.items()]
    iters = ["kt0", "ph", "sub", "kk0", "ii0", "ii1", "pos"]
    return register_fragments(update, sched, iters, ["ii0", "ii1"], [2, 2], ops_, accumulators)


def test_isl_decides_fragments_from_footprint_and_reuse():
    frags, notes = _micro_tile(
        {"a": "a[d0, r]", "w": "w[r, d1]", "x": "x[d0 + d1, r]", "z": "z[d0, d1, r]"}
    )
    by = {f.tensor: f for f in frags}
    assert sorted(by) == ["a", "w"]
    assert by["a"].index_vars == ["ii0"] and by["a"].shape == [2] and by["a"].reads == 4
    assert by["w"].index_vars == ["ii1"] and by["w"].shape == [2]
    text = "\n".join(notes)
    assert "x: no register fragment (distinct micro-tile iterations read the same element)" in text
    assert "z: no register fragment (each of its 4 elements per kk step is read once" in text
    # the element is a function of the loop variables: a[t0 + 4 ii0, 8 kt0 + kk0]
    row, col = by["a"].element
    pt = isl.Set(
        "[t0, kt0, kk0, ii0] -> { : t0 = 1 and kt0 = 1 and kk0 = 2 and ii0 = 1 }",
        context=row.get_ctx(),
    )
    got = [e.intersect_params(pt.align_params(e.get_space())).max_val() for e in (row, col)]
    assert [str(g) for g in got] == ["5", "10"]


def test_fragments_respect_the_register_budget():
    frags, notes = _micro_tile({"a": "a[d0, r]", "w": "w[r, d1]"}, accumulators=125)
    assert [f.tensor for f in frags] == ["a"]  # 125 + 2 fits 128 floats, + 2 more does not
    assert "w: no register fragment (125 accumulators + 4 fragment floats exceed" in "\n".join(
        notes
    )


def _matmul_4096():
    a = te.placeholder((4096, 4096), name="a")
    w = te.placeholder((4096, 4096), name="w")
    return [a, w], [ops.matmul(a, w)]


def test_4096_matmul_kk_loop_reads_registers_only():
    ins, outs = _matmul_4096()
    fn = polyfuse.compile(inputs=ins, outputs=outs, arch="sm_80", check_cuda=False)
    (k,) = fn.kernels
    (tile,) = [r for r in fn.plan.kernel_plans[0].layout if DecisionKind.GEMM_TILE in r.kinds]
    tm, tn = tile.data["micro_tile"]
    assert tm * tn == 64  # 8x8 (or 4x16 ...) register micro-tiles, whichever the model ranks
    notes = "\n".join(_fragment_notes(fn))
    assert f"a: register fragment r_a_frag[{tm}] per kk step" in notes
    assert f"w: register fragment r_w_frag[{tn}] per kk step" in notes
    src = k.source
    assert f"float r_a_frag[{tm}];" in src and f"float r_w_frag[{tn}];" in src
    # the k-tile's steps: the loop over kk0 up to the k-tile that holds the update (the copy
    # loops over the tile's rows are named kk0 too)
    head = f"for (int kk0 = 0; (kk0 <= {tile.data['k_tile'] - 1});"
    loops = [src[m.start() :] for m in re.finditer(re.escape(head), src)]
    bodies = [seg[: seg.index("__syncthreads();")] for seg in loops]
    kk = next(b for b in bodies if "_acc[ii0][ii1][iv] = " in b)
    fma = [line for line in kk.splitlines() if "_acc[ii0][ii1][iv] = " in line]
    assert len(fma) == 1 and "s_a[" not in fma[0] and "s_w[" not in fma[0]
    assert re.search(r"\(r_a_frag\[ii0\] \* r_w_frag\[\(\(ii1 \* 4\) \+ iv\)\]\)", fma[0])
    # one shared read per fragment element: each load statement reads one tile element
    loads = [line for line in kk.splitlines() if "_frag[" in line and "= s_" in line]
    assert len(loads) == 2 and all(line.count("s_") == 1 for line in loads)


def test_fragments_in_every_emulated_configuration():
    a = te.placeholder((3, 37, 29), name="a")
    b = te.placeholder((3, 29, 45), name="b")
    cfg = MappingConfig(gemm_tile=(32, 32, 4, 2, 8))
    fn = polyfuse.compile(inputs=[a, b], outputs=[ops.matmul(a, b)], check_cuda=False, mapping=cfg)
    assert len(_fragment_notes(fn)) == 2
    # 2x4 micro-tiles whatever the cost model prefers at these small sizes (k-tiles: the
    # reduction's extent where shorter)
    small = MappingConfig(gemm_tile=(16, 128, 2, 4, 32))
    for stride, padding, dilation, groups in [(1, 1, 1, 1), (2, 1, 1, 1), (1, 2, 2, 1)]:
        x = te.placeholder((2, 4, 11, 13), name="x")
        w = te.placeholder((6, 4 // groups, 3, 3), name="w")
        y = ops.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)
        fn = polyfuse.compile(inputs=[x, w], outputs=[y], check_cuda=False, mapping=small)
        assert len(_fragment_notes(fn)) == 2, (stride, padding, dilation)
    # groups=2: each thread's micro-tile spans both groups, so every input element it reads
    # in one kk step is read once (no reuse); the weights still get a fragment.
    w = te.placeholder((6, 2, 3, 3), name="w")
    y = ops.conv2d(x, w, groups=2)
    fn = polyfuse.compile(inputs=[x, w], outputs=[y], check_cuda=False, mapping=small)
    notes = "\n".join(n for k in fn.kernels for n in k.notes)
    assert "x: no register fragment" in notes and "w: register fragment" in notes
    q, kk, v = (te.placeholder((2, 2, 20, 12), name=nm) for nm in "qkv")
    scores = ops.mul(ops.matmul(q, ops.transpose(kk, (0, 1, 3, 2))), 0.25)
    out = ops.matmul(ops.softmax(scores, axis=-1), v)
    fn = polyfuse.compile(inputs=[q, kk, v], outputs=[out], check_cuda=False, mapping=small)
    assert len(_fragment_notes(fn)) == 4  # both operands of both products


def test_scalar_fragment_of_a_one_row_micro_tile_is_correct():
    # TM = 1: the A operand's fragment is one register (indexed by no loop), reused TN times;
    # B's 4 elements are each read once per kk step, so B keeps reading shared memory.
    m, k, n = 19, 21, 45
    a, w = te.placeholder((m, k), name="a"), te.placeholder((k, n), name="w")
    cfg = MappingConfig(gemm_tile=(16, 32, 1, 4, 8))
    fn = polyfuse.compile(inputs=[a, w], outputs=[ops.matmul(a, w)], check_cuda=False, mapping=cfg)
    notes = "\n".join(n for kern in fn.kernels for n in kern.notes)
    assert "a: register fragment r_a_frag[1] per kk step (indexed by nothing)" in notes
    assert "w: no register fragment (each of its 4 elements" in notes
    src = fn.kernels[0].source
    assert "r_a_frag[0] = s_a[" in src and "(r_a_frag[0] * s_w[" in src
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n))]
    want = arrays[0].astype(np.float64) @ arrays[1]
    for order in ORDERS:
        got = fn(*arrays, device="emulate", race_check=order)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"order {order}")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_large_micro_tile_keeps_shared_reads_within_the_budget(arch):
    ins, outs = _matmul_4096()
    cfg = MappingConfig(gemm_tile=(128, 64, 16, 8, 8))  # 128 accumulators: no room left
    fn = polyfuse.compile(inputs=ins, outputs=outs, arch=arch, check_cuda=False, mapping=cfg)
    notes = "\n".join(n for k in fn.kernels for n in k.notes)
    assert "a: no register fragment (128 accumulators + 16 fragment floats exceed" in notes
    assert "_frag" not in fn.kernels[0].source
