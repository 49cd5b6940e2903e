"""The tensor-core kernel as kernel IR (issue 21, last item): the fills, the k-step and the
epilogue are nodes (:mod:`polyfuse.cuda.codegen.lower_mma_fills`,
:mod:`polyfuse.cuda.codegen.lower_mma_steps`, :mod:`polyfuse.cuda.codegen.lower_mma`) and the
kernel's source is the one printer's (:func:`polyfuse.cuda.codegen.printer.print_ir`) of its
:class:`KernelIR`. Before, the body was C text lines (a ``KFunction`` of hand text) and
``Kernel.body`` a two-node summary."""

from __future__ import annotations

import numpy as np
import pytest
from test_tensorize import _matmul
from test_tensorize_pipeline import ODD_ALIGNED, _compile

import polyfuse
from polyfuse.cuda.codegen import lower_mma
from polyfuse.cuda.codegen.c_text import c_index
from polyfuse.cuda.codegen.kernel_arith import mul
from polyfuse.cuda.codegen.kernel_ast import (
    KChunkCopy,
    KFor,
    KGuardedCopy,
    KIf,
    KLdmatrix,
    KMma,
    KRegisters,
    KStmt,
    KVar,
    nodes_of,
)
from polyfuse.cuda.codegen.kernel_function import print_function
from polyfuse.cuda.codegen.lower_facts import kernel_facts
from polyfuse.cuda.codegen.lower_mma_chunk_dst import chunk_destination, chunk_step
from polyfuse.cuda.codegen.lower_mma_fills import TileFill, chunk_fill, scalar_fill
from polyfuse.cuda.codegen.printer import _Emitter, print_ir
from polyfuse.graph.dtypes import numpy_dtype, tolerance
from polyfuse.poly.mapping import MappingConfig
from polyfuse.poly.swizzle import SharedLayout
from polyfuse.poly.tensorize import MmaOperand


def _tile(aligned: bool) -> TileFill:
    """A 16-row, k-innermost bf16 tile of ``a[64][40]`` (row ``pf_m0 + r``, column ``k``),
    32 k deep, 64 threads; ``aligned``: rows unpadded (else padded by 8 elements)."""
    op = MmaOperand("a", (64, 40), (((1, 0, 0), 0), ((0, 0, 1), 0)), 0, True)
    return TileFill(op, SharedLayout(16, 32, 32, pad=0 if aligned else 8), "s_a", "a", 16,
                    32, KVar("pf_m0"), 63, 39, (0, 0), 64, "bfloat16")  # fmt: skip


def _lines(nodes) -> list[str]:
    return [ln.strip() for ln in _Emitter({})(list(nodes), 0)]


def test_a_chunk_fill_is_nodes_printed_by_the_printer():
    """16 rows x 4 chunks = 64 chunks, one per thread: a loop of one cp.async chunk each, its
    zero-fill count clamped to the chunk, the offset of a chunk outside the array 0."""
    (loop,) = chunk_fill(_tile(True), "pf_k0", "pf_ws")
    assert isinstance(loop, KFor) and loop.unroll
    (copy,) = nodes_of([loop], KChunkCopy)
    assert copy.dst.name == "s_a" and copy.src.name == "a"
    lines = _lines([loop])
    assert lines[:2] == ["#pragma unroll", "for (int pf_u = 0; (pf_u < 1); pf_u += 1) {"]
    assert "int pf_n = ((pf_r <= 63) ? (40 - pf_k) : 0);" in lines
    assert "pf_n = ((pf_n < 0) ? 0 : ((pf_n > 8) ? 8 : pf_n));" in lines
    assert lines[-2].startswith("pf_cp_async16(&s_a[((pf_ws * ")
    assert lines[-2].endswith(", &a[((pf_n > 0) ? ((pf_r * 40) + pf_k) : 0)], (2 * pf_n));")


def test_a_scalar_fill_is_a_guarded_copy_node():
    """The scalar fill of the same tile (one element per thread and step): a guarded copy,
    zero outside the array, the k guard dropped where the k-tile lies inside."""
    (loop,) = scalar_fill(_tile(False), "pf_k0", None, k_inside=True)
    (copy,) = nodes_of([loop], KGuardedCopy)
    assert copy.temp == "pf_v" and copy.dtype == "bfloat16"
    lines = _lines([loop])
    assert "__nv_bfloat16 pf_v = __float2bfloat16_rn(0.0f);" in lines
    assert "if ((pf_r <= 63)) pf_v = a[((pf_r * 40) + pf_k)];" in lines


def test_the_tensor_core_kernel_is_its_ir_printed(monkeypatch):
    """The kernel's body holds the ldmatrix, mma and cp.async nodes, the accumulators as
    registers and the epilogue as statements with their stores under the bounds test; its
    source is exactly :func:`print_ir` of the IR it was lowered to (caught at
    :func:`kernel_of`), and the kernel still matches the reference."""
    seen = []

    def spy(ir, facts, notes=()):
        seen.append(ir)
        return kernel_of(ir, facts, notes)

    kernel_of = lower_mma.kernel_of
    monkeypatch.setattr(lower_mma, "kernel_of", spy)
    inputs, out, arrays, want = _matmul("bfloat16", *ODD_ALIGNED)
    fn = _compile(inputs, out, 3, buffers=2, tile=(64, 64, 2, 2))  # warps of 2x4 mma tiles
    (k,) = fn.kernels
    (ir,) = seen
    assert list(ir.body) == k.body
    assert nodes_of(k.body, KLdmatrix) and nodes_of(k.body, KChunkCopy)
    mmas = nodes_of(k.body, KMma)
    assert mmas and all(m.acc.name == "pf_acc" and len(m.acc.index) == 2 for m in mmas)
    assert [r.shape for r in nodes_of(k.body, KRegisters) if r.name == "pf_acc"] == [(2, 4, 4)]
    (guard,) = [n for n in nodes_of(k.body, KIf) if nodes_of(n.then, KStmt)]
    assert all(s.stores for s in nodes_of(guard.then, KStmt))
    # the facts read from the IR: two static 3-stage tiles of 64x32 bf16 (swizzled, no
    # padding), the barrier, the mma and the cp.async chunks; the cost model's work estimate
    # (every mma counted) and the tile model's registers
    assert k.facts == kernel_facts(ir, k.facts.registers, k.facts.work)
    assert k.facts.work is not None and k.facts.work.mix.mma > 0
    assert k.facts.registers == fn.plan.mapped[0].tiling.registers
    assert [(a.bytes, a.align) for a in k.facts.shared_arrays] == [(3 * 64 * 32 * 2, 16)] * 2
    assert k.facts.barriers and k.facts.mma and k.facts.async_copies
    assert k.facts.dynamic_shared_bytes == 0
    printed = print_ir(ir)
    assert (k.canonical or k.printed) == printed
    if k.canonical is None:
        assert k.source == print_function(printed, k.name)
    got = fn(*arrays, device="emulate")
    assert tolerance("bfloat16").allclose(got, want.astype(numpy_dtype("bfloat16")))
    assert not np.isnan(got.astype(np.float32)).any()


def test_the_vocabulary_added_for_the_tensor_core_kernel():
    """Nested sums are flattened (C adds left to right: the layout offset after a stage's
    base reads as one sum, compiled to the same SASS as before); a rolled loop prints
    ``#pragma unroll 1``; a register array may carry a note."""
    from polyfuse.cuda.codegen.kernel_arith import add, cmp
    from polyfuse.cuda.codegen.kernel_ast import KInt, KOp

    a, b, c = KVar("a"), KVar("b"), KVar("c")
    assert add(a, add(b, c)) == KOp("+", (a, b, c))
    assert add(add(a, 1), b, 2) == KOp("+", (a, b, KInt(3)))
    rolled = KFor("pf_kt", KInt(0), cmp("<", "pf_kt", 3), 1, (), rolled=True)
    assert _lines([rolled])[0] == "#pragma unroll 1"
    regs = KRegisters("pf_fa", "unsigned", (2, 4), "fragment", note="two fragment buffers")
    assert _lines([regs]) == ["unsigned pf_fa[2][4];  // two fragment buffers"]


def test_lets_and_register_arrays_are_checked_against_the_generated_names():
    """A let or a register array the kernel declares under a name a tensor could have is an
    internal error (it could shadow the tensor's C name); the tensor-core kernel's own
    ``pf_`` names pass."""
    import pytest

    from polyfuse.cuda.codegen.declared import check_declared
    from polyfuse.cuda.codegen.kernel_ast import KernelIR, KInt, KLet

    def ir(*body):
        return KernelIR("k", (), (), tuple(body), ())

    check_declared(ir(KLet("pf_lane", KInt(0)), KRegisters("pf_acc", "float", (2,))))
    with pytest.raises(AssertionError, match=r"variables \['x'\]"):
        check_declared(ir(KLet("x", KInt(0))))
    with pytest.raises(AssertionError, match=r"variables \['acc'\]"):
        check_declared(ir(KRegisters("acc", "float", (2,))))


def _eval(x, **env) -> int:
    """C's integer semantics on non-negative values are Python's."""
    return eval(c_index(x).replace("/", "//"), env)  # noqa: S307


@pytest.mark.parametrize(
    "block_k, pad, threads, stepped", [(32, 0, 64, True), (32, 8, 64, True), (64, 0, 32, False)]
)
def test_a_threads_chunks_go_through_one_pointer_where_the_layout_steps_evenly(
    block_k, pad, threads, stepped
):
    """64 rows x 4 chunks of a 32-deep k-innermost tile (swizzled, or padded rows): with 64
    threads each thread's 4 chunks lie in one chunk column, 16 rows apart; the destination is
    one pointer per k-tile plus ``pf_u`` times the step, the same element as the chunk's own
    (row, column) destination for every thread and chunk. 64-deep rows of 8 chunks over 32
    threads: a thread's chunks change column, so the per-chunk form stays."""
    op = MmaOperand("a", (64, 80), (((1, 0, 0), 0), ((0, 0, 1), 0)), 0, True)
    lay = SharedLayout(64, block_k, block_k, pad=pad)
    f = TileFill(op, lay, "s_a", "a", 64, block_k, KVar("pf_m0"), 63, 79, (0, 0), threads,
                 "bfloat16")  # fmt: skip
    first, dst = chunk_destination(f, "pf_ws")
    assert (chunk_step(f) is not None) == stepped == bool(first)
    if not stepped:
        assert dst == f.dst("pf_ws", "pf_t", mul(8, "pf_q"), True)
        return
    t0, ptr = (n.value for n in first)
    assert dst.name == "pf_dst"
    per_row = block_k // 8
    for tid in range(threads):
        env = {"pf_tid": tid, "pf_ws": 1, "s_a": 0}
        base = _eval(ptr, pf_t0=_eval(t0, **env), **env)
        for u in range(64 * per_row // threads):
            c = tid + u * threads
            row, col = c % 8 + c // (8 * per_row) * 8, 8 * (c // 8 % per_row)
            want = f.layout.offset(row, col) + f.elements
            assert base + _eval(dst.index[0], pf_u=u) == want, (tid, u)


def test_a_k_outside_tf32_fragment_loads_through_a_second_pointer():
    """A tf32 ``a @ b`` with ``b`` stored k-by-n: lane l's second B register is 4 k further,
    whose XOR bit differs, so it is loaded through a second stage pointer (``pf_sb4``, its
    lane offset ``pf_lb4``) and every fragment load is a pointer plus a constant. Before:
    ``pf_sb[pf_db + ...]``, an address per load in SASS (sm_90: 137 others per 64 HMMA)."""
    inputs, out, arrays, want = _matmul("float32", 67, 40, 200)
    cfg = MappingConfig(allow_tf32=True)
    fn = polyfuse.compile(inputs, [out], check_cuda=False, mapping=cfg)
    (k,) = fn.kernels
    assert "pf_db" not in k.source and "const int pf_lb4 = " in k.source
    assert "pf_sb4 = (s_b + (pf_rs * " in k.source and "__float_as_uint(pf_sb4[" in k.source
    got = fn(*arrays, device="emulate", race_check=True)
    assert np.allclose(got, want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
