"""Before/after tests of the lowering passes on small hand-built kernel IRs (issue 11)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import polyfuse
from polyfuse import te
from polyfuse.cuda.codegen.kernel_ast import (
    KAlloc,
    KBarrier,
    KCombine,
    KernelIR,
    KFor,
    KIf,
    KInt,
    KMark,
    KOp,
    KParam,
    KStmt,
    KVar,
    MemSpace,
    Scope,
)
from polyfuse.cuda.codegen.lower_barriers import barrier_scope, insert_barriers
from polyfuse.cuda.codegen.lower_buffers import STATIC_SMEM_LIMIT, BufferPlacement, alloc_buffers
from polyfuse.cuda.codegen.lower_combines import lower_combines
from polyfuse.cuda.codegen.lower_dtypes import assign_dtypes
from polyfuse.cuda.codegen.printer import emit_kernel


def _ir(threads: int = 64, reduction: bool = False, body=None) -> KernelIR:
    body = body or (KStmt("S0", (KVar("t0"),)),)
    return KernelIR(
        "k", (("b0", 4),), (("t0", threads),), tuple(body), ("mg",), reduction=reduction
    )


def _two_parts() -> tuple:
    loop = KFor("c0", KInt(0), KOp("<", (KVar("c0"), KInt(8))), 1, [KStmt("S1", (KVar("c0"),))])
    return (
        KMark("part:red", [KStmt("S0", (KVar("t0"),))]),
        KMark("part:use", [loop]),
    )


def test_alloc_buffers_params_tiles_registers():
    before = _ir()
    places = [
        BufferPlacement("x", MemSpace.GLOBAL, read_only=True),
        BufferPlacement("t", MemSpace.SHARED, box=((KVar("b0"), 16),)),
        BufferPlacement("y", MemSpace.GLOBAL, register_copy=True),
        BufferPlacement("a_acc", MemSpace.REGISTER),
    ]
    after = alloc_buffers(before, places, ["x", "y", "t"])
    assert before.params == () and before.allocs == ()  # a new IR, the old one untouched
    assert [(p.name, p.ctype) for p in after.params] == [("x", "const"), ("y", "")]
    assert after.allocs == (
        KAlloc("s_t", MemSpace.SHARED, "", (16,), None, (KVar("b0"),)),
        KAlloc("r_y", MemSpace.REGISTER, "", ()),
        KAlloc("r_a_acc", MemSpace.REGISTER, "", ()),
    )
    assert after.dynamic_smem_bytes == 0


def test_alloc_buffers_goes_dynamic_beyond_the_static_limit():
    big = STATIC_SMEM_LIMIT // 4  # floats: with the scratch per thread it no longer fits
    places = [
        BufferPlacement("t", MemSpace.SHARED, box=((KInt(0), big),)),
        BufferPlacement("u", MemSpace.SHARED, box=((KInt(0), 8),), smem_offset=big),
    ]
    after = alloc_buffers(_ir(body=(KMark("empty", []),)), places, ["t", "u"])
    assert [a.offset for a in after.allocs] == [0, big]
    assert after.dynamic_smem_bytes == (big + 8) * 4
    src = emit_kernel(assign_dtypes(after), [], {}, {}).source
    assert "extern __shared__ float pf_smem[];" in src
    assert f"float* s_u = pf_smem + {big};" in src


def test_lower_combines_warp_and_block():
    base = alloc_buffers(_ir(), [BufferPlacement("r", MemSpace.REGISTER)], [])
    assert lower_combines(base, "y", 1, 1, {"S0": "s"}) is base  # one lane: nothing
    warp = lower_combines(base, "y", 32, 1, {"S0": "s"})
    assert [c.scope for c in warp.combines] == [Scope.WARP]
    assert [a.name for a in warp.allocs] == ["pf_scratch", "r_r"]  # before the registers
    assert warp.allocs[0].shape == (1,)
    block = lower_combines(base, "x", 4, 16, {"S0": "s"})
    assert block.combines[0].scope is Scope.BLOCK and block.allocs[0].shape == (64,)
    assert base.combines == () and len(base.allocs) == 1


def test_lower_combines_wraps_the_final_statement_in_a_body_node():
    # before: the final statement of reduction s among other statements; after: that
    # statement (each instance) stands in a KCombine node, the others as they were
    final = KStmt("S1", (KVar("t0"),))
    loop = KFor("c0", KInt(0), KOp("<", (KVar("c0"), KInt(2))), 1, [final])
    before = _ir(body=(KStmt("S0", (KVar("t0"),)), loop, KStmt("S2", (KVar("t0"),))))
    after = lower_combines(before, "y", 64, 1, {"S1": "s"})
    assert before.combines == () and before.body[1].body == (final,)
    combine = KCombine("y", 64, 1, Scope.BLOCK, "pf_scratch", "s", (final,))
    assert after.body == (before.body[0], replace(loop, body=(combine,)), before.body[2])
    assert after.combines == (combine,)
    text = str(after)
    assert "combine y s lanes=64 kept=1 block scratch=pf_scratch\n      S1(t0)" in text
    assert "combine" not in str(before)


def test_insert_barriers_before_every_part_but_the_first():
    tiles = [BufferPlacement("t", MemSpace.SHARED, box=((KInt(0), 8),))]
    before = alloc_buffers(_ir(reduction=True, body=_two_parts()), tiles, [])
    after = insert_barriers(before, barrier_scope("y", 8))
    assert not isinstance(before.body[1], KBarrier)
    assert [type(n).__name__ for n in after.body] == ["KMark", "KBarrier", "KMark"]
    assert after.body[1] == KBarrier(Scope.WARP, "use reads what earlier parts wrote")
    assert insert_barriers(before, barrier_scope("x", 8)).body[1].scope is Scope.BLOCK
    assert "barrier warp  // use reads" in str(after)


def test_barrier_of_a_lane_guarded_part_stands_before_the_guard():
    # isl hoists a lane guard over a whole part when only some lanes have work in it (a 1x8
    # column total with runs of 4: `if (l0 <= 1) { part:mg1 ... }`); a barrier inside the
    # guard would leave the other lanes out (a divergent __syncthreads)
    red, use = _two_parts()
    guarded = KIf(KOp("<=", (KVar("t0"), KInt(1))), [use])
    tiles = [BufferPlacement("t", MemSpace.SHARED, box=((KInt(0), 8),))]
    before = alloc_buffers(_ir(reduction=True, body=(red, guarded)), tiles, [])
    after = insert_barriers(before, Scope.BLOCK)
    assert [type(n).__name__ for n in after.body] == ["KMark", "KBarrier", "KIf"]
    assert after.body[1].note == "use reads what earlier parts wrote"
    assert not any(isinstance(n, KBarrier) for n in after.body[2].then)


def test_a_part_under_nested_lane_guards_gets_one_barrier_before_the_outer_guard():
    """isl's guards ``if (l0 <= 1) { part:mg1; if (l0 == 0) { part:mg2 } }`` (fuzz seed
    770052: a column total, a 4x2 product and a broadcast stitched into one kernel): mg2's
    barrier stands before the outer guard only. Before: a second one inside ``l0 <= 1``, a
    divergent __syncthreads (the emulator: 62 threads exited while 2 wait)."""
    red, use = _two_parts()
    (uses,) = use.body
    third = KMark("part:more", [uses])
    t0 = KVar("t0")
    nested = KIf(KOp("<=", (t0, KInt(1))), [use, KIf(KOp("==", (t0, KInt(0))), [third])])
    tiles = [BufferPlacement("t", MemSpace.SHARED, box=((KInt(0), 8),))]
    before = alloc_buffers(_ir(reduction=True, body=(red, nested)), tiles, [])
    after = insert_barriers(before, Scope.BLOCK)
    assert [type(n).__name__ for n in after.body] == ["KMark", "KBarrier", "KIf", "KBarrier",
                                                       "KIf"]  # fmt: skip
    assert [n.note for n in after.body if isinstance(n, KBarrier)] == [
        "use reads what earlier parts wrote", "more reads what earlier parts wrote"]
    inner = after.body[4].then
    assert [type(n).__name__ for n in inner] == ["KIf"], inner
    assert not any(isinstance(n, KBarrier) for n in inner[0].then), inner


def test_parts_under_a_guard_nested_in_a_guard_get_their_barriers_outside_both():
    """isl's guards ``if (l0 <= 1) { part:a; if (l0 == 0) { part:b; part:c } }`` (ONNX fuzz
    seed 16535: two argmaxes, a tile, a trilu and a transpose of a 1x2 uint8 stitched into one
    kernel): each part leads its own chain of guards, its barrier before the outermost.
    Before: c's barrier stood inside ``l0 <= 1`` (62 threads exited while 2 waited)."""
    red, use = _two_parts()
    (uses,) = use.body
    b, c = KMark("part:b", [uses]), KMark("part:c", [uses])
    t0 = KVar("t0")
    outer, inner = KOp("<=", (t0, KInt(1))), KOp("==", (t0, KInt(0)))
    nested = KIf(outer, [use, KIf(inner, [b, c])])
    tiles = [BufferPlacement("t", MemSpace.SHARED, box=((KInt(0), 8),))]
    before = alloc_buffers(_ir(reduction=True, body=(red, nested)), tiles, [])
    after = insert_barriers(before, Scope.BLOCK)
    kinds = [type(n).__name__ for n in after.body]
    assert kinds == ["KMark", "KBarrier", "KIf", "KBarrier", "KIf", "KBarrier", "KIf"], kinds
    assert [n.note for n in after.body if isinstance(n, KBarrier)] == [
        f"{p} reads what earlier parts wrote" for p in ("use", "b", "c")]
    for guard, part in zip(after.body[4::2], (b, c), strict=True):
        assert guard.cond == outer and guard.then == (KIf(inner, [part]),)
    assert not any(isinstance(n, KBarrier) for g in after.body[2::2] for n in g.then)


def test_the_fuzz_graph_of_nested_guards_runs_without_a_divergent_barrier():
    """The graph of fuzz seed 770052, shrunk: correct on the emulator (before: "divergent
    __syncthreads in block (0,0,0)")."""
    x0 = te.placeholder((4, 1), name="x0")
    b1 = te.compute((4, 1), lambda i, j: x0[i, j] + x0[i, j], name="b1")
    k0, k1 = te.reduce_axis(4, name="k0"), te.reduce_axis(1, name="k1")
    r4 = te.compute((1, 1), lambda i, j: te.sum(b1[k0, k1], axis=[k0, k1]), name="r4")
    x6 = te.placeholder((2, 1), name="x6")
    k = te.reduce_axis(1, name="k")
    m7 = te.compute((4, 2), lambda i, j: te.sum(b1[i, k] * x6[j, k], axis=k), name="m7")
    x8 = te.placeholder((1,), name="x8")
    b9 = te.compute((4, 1), lambda i, j: x8[0] + b1[i, j], name="b9")
    fn = polyfuse.compile([x0, x6, x8], [r4, m7, b9], check_cuda=False)
    rng = np.random.default_rng(0)
    a0, a6, a8 = (rng.standard_normal(s).astype(np.float32) for s in ((4, 1), (2, 1), (1,)))
    got = fn(a0, a6, a8, device="emulate", race_check=True)
    want = [np.full((1, 1), 2 * a0.sum()), (2 * a0) @ a6.T, a8[0] + 2 * a0]
    for g, w in zip(got, want, strict=True):
        assert np.allclose(g, w, rtol=1e-5, atol=1e-6), (g, w)
    for kern in fn.kernels:  # no barrier under a lane guard
        assert not re.search(r"if \(\(l0 <= 1\)\) \{\n\s*__syncthreads", kern.source)


def test_no_barrier_without_shared_tiles_or_outside_reductions():
    two = _two_parts()
    plain = alloc_buffers(_ir(body=two), [BufferPlacement("t", MemSpace.SHARED)], [])
    assert insert_barriers(plain, Scope.BLOCK) is plain
    red = lower_combines(_ir(reduction=True, body=two), "x", 4, 16, {})
    assert insert_barriers(red, Scope.BLOCK) is red  # the combine scratch is no tile


def test_assign_dtypes_fills_undecided_types_only():
    before = _ir().with_(
        params=(KParam("x", "const", "x"), KParam("y", "", "y"), KParam("n", "int")),
        allocs=(
            KAlloc("r_a", MemSpace.REGISTER, "", ()),
            KAlloc("r_i", MemSpace.REGISTER, "int32", ()),
        ),
    )
    after = assign_dtypes(before)
    assert [p.ctype for p in after.params] == ["const float*", "float*", "int"]
    assert [a.dtype for a in after.allocs] == ["float32", "int32"]
    assert before.allocs[0].dtype == ""


def test_printer_writes_barriers_from_the_ir():
    ir = _ir(body=(KBarrier(Scope.BLOCK, "why"), KBarrier(Scope.WARP)))
    src = emit_kernel(ir, [], {}, {}).source
    assert "  __syncthreads();  // why\n  __syncwarp();\n" in src


#: What a printer module must not contain (regular expressions): each is a lowering decision,
#: made by a pass.
PRINTER_DECISIONS = (
    "STATIC_SMEM_LIMIT",  # static or dynamic shared memory: lower_buffers
    "smem_floats",
    "gemm_tile_budget",
    r"polyfuse\.poly\.policy",  # budgets and thresholds
    "parts_seen",  # barriers between parts: lower_barriers
    r"\bKBarrier\(",  # a barrier node made while printing
    r"\bKAlloc\(",  # a buffer allocated while printing
    "insert_barriers",
    "warp_rows",
    r"\.strategy",  # the combine: lower_combines
    "ReductionKernel",
    "GemmKernel",  # a GEMM printer reads the lowered IR, not the mapping
    r"\.promotions",
    "maps_of",  # const parameters: lower_buffers
    r'"const float\*"',  # element types: lower_dtypes
    r'"float\*"',
    "_CTYPE = {",
    "import islpy",
)


def printer_decisions(text: str) -> list[str]:
    """The decisions a printer module's code (docstrings and the prelude left out) makes."""
    code = re.sub(r'"""(.|\n)*?"""', "", text)
    return [d for d in PRINTER_DECISIONS if re.search(d, code)]


#: the code generation package's folder
CODEGEN = Path(__file__).resolve().parents[1] / "polyfuse" / "cuda" / "codegen"


@pytest.mark.parametrize(
    "module", ["printer.py", "body_printer.py", "c_wide.py"]
)
def test_printer_module_makes_no_lowering_decision(module):
    text = (CODEGEN / module).read_text()
    assert printer_decisions(text) == []


def test_printer_decision_check_can_fail():
    """A decision brought back into a printer is caught (barrier, buffer, dtype, budget)."""
    text = (CODEGEN / "printer.py").read_text()
    for line, found in (
        ("        out.append(KBarrier(Scope.BLOCK))\n", r"\bKBarrier\("),
        ("    shared = KAlloc(name, MemSpace.SHARED, 'float32', (n,))\n", r"\bKAlloc\("),
        ('    ctype = "const float*" if read_only else "float*"\n', r'"const float\*"'),
        ("from polyfuse.poly.policy import STATIC_SMEM_LIMIT\n", "STATIC_SMEM_LIMIT"),
    ):
        assert found in printer_decisions(text + line), line


def _gemm_ir() -> KernelIR:
    """A k-tile loop with one copy statement, a barrier statement and a micro-tile loop."""
    kt = KVar("kt0")
    copy = KStmt("C_a", (kt, KVar("p0r"), KOp("+", (KVar("p0c"), KOp("*", (KInt(8), kt))))))
    micro = KFor("ii0", KInt(0), KOp("<=", (KVar("ii0"), KInt(3))), 1, [KStmt("U", (KVar("ii0"),))])
    ktile = KFor(
        "kt0", KInt(0), KOp("<=", (kt, KInt(4))), 1, [copy, KStmt("Sync_load", (kt,)), micro]
    )
    epi = KFor("ii0", KInt(0), KOp("<=", (KVar("ii0"), KInt(3))), 1, [KStmt("E", (KVar("ii0"),))])
    ir = KernelIR("k", (("b0", 4),), (("t0", 64),), (ktile, epi), ("mg",))
    return alloc_buffers(
        ir,
        [
            BufferPlacement("a", MemSpace.GLOBAL, read_only=True),
            BufferPlacement("y", MemSpace.GLOBAL),
            BufferPlacement("x", MemSpace.REGISTER),
            BufferPlacement("m_acc", MemSpace.REGISTER),
        ],
        ["a", "y"],
    )


def test_lower_promotions_allocates_tile_and_rewrites_copies():
    from polyfuse.cuda.codegen.kernel_ast import KCopy, KThreadGrid, KTile
    from polyfuse.cuda.codegen.lower_promotions import PromotedTile, lower_promotions

    before = _gemm_ir()
    lo = (KVar("b0"), KOp("*", (KInt(8), KVar("kt0"))))
    tile = PromotedTile(
        "a", "C_a", lo, (16, 8), (33, 40), (True, False), (("p0r", 8), ("p0c", 8)), frozenset({"U"})
    )
    after = lower_promotions(before, [tile])
    assert not before.tiles and not before.thread_grids
    assert after.allocs[0] == KAlloc("s_a", MemSpace.SHARED, "", (16, 8))  # before registers
    assert after.thread_grids == (KThreadGrid("s_a", (("p0r", 8), ("p0c", 8))),)
    assert after.tiles == (KTile("a", "s_a", lo, frozenset({"U"})),)
    copy = after.body[0].body[0]
    assert isinstance(copy, KCopy) and copy.dst == "s_a" and copy.src == "a"
    assert copy.src_shape == (33, 40) and copy.dst_index[0] == KOp("-", (KVar("p0r"), lo[0]))
    assert copy.guard == KOp(
        "&&", (KOp(">=", (KVar("p0r"), KInt(0))), KOp("<", (KVar("p0r"), KInt(33))))
    )
    printed = assign_dtypes(after.with_(body=(copy,)))
    src = emit_kernel(printed, [], {}, {}).source
    assert "const int p0r = threadIdx.x / 8;\n  const int p0c = threadIdx.x % 8;\n" in src
    assert "__shared__ float s_a[128];" in src
    dst = "s_a[(p0r - b0) * 8 + ((p0c + (8 * kt0)) - (8 * kt0))]"
    assert f"{dst} = (p0r >= 0 && p0r < 33) ? a[p0r * 40 + (p0c + (8 * kt0))] : 0.0f;" in src


def test_lower_register_tile_array_unroll_and_guards():
    from polyfuse.cuda.codegen.lower_register_tile import lower_register_tile

    before = _gemm_ir()
    after = lower_register_tile(before, "r_m_acc", [4], ["ii0"], {"E": [10]})
    regs = [a for a in after.allocs if a.space is MemSpace.REGISTER]
    assert regs[0] == KAlloc("r_m_acc", MemSpace.REGISTER, "", (4,), None, (), ("ii0",))
    assert [a.name for a in regs] == ["r_m_acc", "r_x"]
    micro, epi = after.body[0].body[2], after.body[1]
    assert micro.unroll and epi.unroll and not after.body[0].unroll  # k-tile loop stays
    assert epi.body[0].guard == KOp("<=", (KVar("ii0"), KInt(10)))
    assert micro.body[0].guard is None and before.body[1].body[0].guard is None


def test_lower_promotions_vector_copy_aligned_and_printed_as_float4():
    from polyfuse.cuda.codegen.kernel_ast import KCopy
    from polyfuse.cuda.codegen.lower_promotions import PromotedTile, lower_promotions

    lo = (KVar("b0"), KOp("*", (KInt(8), KVar("kt0"))))
    tile = PromotedTile(
        "a", "C_a", lo, (16, 8), (32, 40), (False, False), (("p0r", 32), ("p0c", 2)), frozenset(), 4
    )
    after = lower_promotions(_gemm_ir(), [tile])
    assert after.allocs[0].align == 16
    copy = after.body[0].body[0]
    assert isinstance(copy, KCopy) and copy.width == 4 and copy.guard is None
    src = emit_kernel(assign_dtypes(after.with_(body=(copy,))), [], {}, {}).source
    assert "__shared__ __align__(16) float s_a[128];" in src
    assert "*reinterpret_cast<float4*>(&s_a[" in src
    assert "= *reinterpret_cast<const float4*>(&a[p0r * 40 + (p0c + (8 * kt0))]);" in src


def test_lower_vector_stores_stage_runs_then_one_vector_store():
    from polyfuse.cuda.codegen.kernel_ast import KStage, KVectorStore
    from polyfuse.cuda.codegen.lower_vector_stores import lower_vector_stores

    col = KOp("+", (KOp("*", (KInt(4), KVar("t0"))), KVar("iv")))
    guard = KOp("<=", (col, KInt(9)))
    run = KFor(
        "iv", KInt(0), KOp("<=", (KVar("iv"), KInt(3))), 1, [KStmt("E", (KVar("r"), col), guard)]
    )
    other = KFor("iv", KVar("p0"), KOp("<=", (KVar("iv"), KInt(9))), 2, [KStmt("C", ())])
    before = KernelIR("k", (), (("t0", 4),), (other, run), ("mg",))
    after = lower_vector_stores(before, "iv", 4, {"E": "y"}, {"y": (3, 12)})
    assert before.staged == () and len(before.body) == 2
    assert after.staged == (KStage("y", "r_y_v", "iv", frozenset({"E"})),)
    assert after.allocs[-1] == KAlloc("r_y_v", MemSpace.REGISTER, "", (4,))
    first = KOp("+", (KOp("*", (KInt(4), KVar("t0"))), KInt(0)))
    assert after.body[2] == KVectorStore(
        "y", (KVar("r"), first), (3, 12), "r_y_v", 4, KOp("<=", (first, KInt(9)))
    )
    assert len(after.body) == 3  # the other loop named iv (a copy) gets no store
    src = _printed(after.with_(body=(after.body[2],)))
    want = "if (((4 * t0) + 0) <= 9) { *reinterpret_cast<float4*>(&y[r * 12 + ((4 * t0) + 0)])"
    assert want in src and "make_float4(r_y_v[0], r_y_v[1], r_y_v[2], r_y_v[3]);" in src


def _printed(ir: KernelIR) -> str:
    return emit_kernel(assign_dtypes(ir), [], {}, {}).source


def test_lower_promotions_pipelined_async_copies_into_the_next_stage():
    from polyfuse.cuda.codegen.kernel_ast import KAsyncCopy, KCommit, KWait
    from polyfuse.cuda.codegen.lower_promotions import Pipeline, PromotedTile, lower_promotions

    kt = KVar("kt0")
    ahead = KOp("+", (kt, KInt(1)))  # the copy of k-tile kt0 + 1 runs in iteration kt0
    col = KOp("+", (KVar("p0c"), KOp("*", (KInt(8), ahead))))
    body = (
        KFor(
            "kt0",
            KInt(-1),
            KOp("<=", (kt, KInt(4))),
            1,
            [KStmt("C_a", (ahead, KVar("p0r"), col)), KStmt("Commit", (kt,)), KStmt("Wait", (kt,))],
        ),
    )
    ir = KernelIR("k", (), (("t0", 64),), body, ("mg",))
    lo = (KInt(0), KOp("*", (KInt(8), kt)))
    tile = PromotedTile(
        "a",
        "C_a",
        lo,
        (16, 8),
        (16, 48),
        (False, False),
        (("p0r", 8), ("p0c", 8)),
        frozenset({"U"}),
    )
    pipe = Pipeline(2, "kt0", ("kt0",), "Commit", "Wait")
    after = lower_promotions(ir, [tile], pipe)
    assert after.allocs[0].shape == (2, 16, 8)
    assert after.tiles[0].stage == KOp("%", (kt, KInt(2)))
    copy, commit, wait = after.body[0].body
    assert isinstance(copy, KAsyncCopy) and commit == KCommit() and wait == KWait(1)
    assert copy.dst_index[0] == KOp("%", (ahead, KInt(2)))  # the stage of k-tile kt0 + 1
    assert copy.dst_index[2] == KOp("-", (col, KOp("*", (KInt(8), ahead))))  # its own box
    src = _printed(after.with_(body=after.body[0].body))
    assert "__pipeline_memcpy_async(&s_a[((kt0 + 1) % 2) * 128 + " in src
    assert "], &a[p0r * 48 + (p0c + (8 * (kt0 + 1)))], 4);" in src
    assert "__pipeline_commit();\n  __pipeline_wait_prior(1);" in src


def test_lower_fragments_loads_registers_before_the_micro_tile():
    from polyfuse.cuda.codegen.body_printer import c_value
    from polyfuse.cuda.codegen.kernel_ast import KCopy, KFragment
    from polyfuse.cuda.codegen.lower_fragments import OperandFragment, lower_fragments
    from polyfuse.cuda.codegen.lower_promotions import PromotedTile, lower_promotions

    lo = (KVar("b0"), KOp("*", (KInt(8), KVar("kt0"))))
    tile = PromotedTile(
        "a", "C_a", lo, (16, 8), (33, 40), (True, False), (("p0r", 8), ("p0c", 8)), frozenset({"U"})
    )
    before = lower_promotions(_gemm_ir(), [tile])
    row = KOp("+", (KVar("b0"), KOp("*", (KInt(4), KVar("ii0")))))
    element = (row, KOp("*", (KInt(8), KVar("kt0"))))
    frag = OperandFragment("a", ("ii0",), (4,), element, frozenset({"U"}))
    after = lower_fragments(before, [frag], ["ii0"])
    assert not before.fragments and lower_fragments(before, [], ["ii0"]) is before
    assert after.fragments == (KFragment("a", "r_a_frag", KVar("ii0"), frozenset({"U"})),)
    assert after.allocs[-1] == KAlloc("r_a_frag", MemSpace.REGISTER, "", (4,))
    ktile = after.body[0]
    load, micro = ktile.body[2], ktile.body[3]  # the load right before the micro-tile loop
    assert micro == before.body[0].body[2]
    assert isinstance(load, KFor) and load.var == "ii0" and load.unroll
    copy = load.body[0]
    assert isinstance(copy, KCopy) and copy.dst == "r_a_frag" and copy.src == "s_a"
    assert copy.dst_index == (KVar("ii0"),) and copy.src_shape == (16, 8)
    assert copy.src_index == tuple(KOp("-", (e, b)) for e, b in zip(element, lo, strict=True))
    assert after.body[1] == before.body[1]  # the epilogue's loop reads no fragment
    src = _printed(after.with_(body=(load,)))
    assert "float r_a_frag[4];" in src
    want = "r_a_frag[ii0] = s_a[((b0 + (4 * ii0)) - b0) * 8 + ((8 * kt0) - (8 * kt0))];"
    assert want in src
    # The update's reads of ``a`` print as the register; other statements' as before.
    from polyfuse.cuda.codegen.kernel_access import KIdx
    from polyfuse.cuda.codegen.lower_accesses import Resolver
    from polyfuse.poly.placement import Placement

    r = Resolver(after, {"a": Placement("a", "global", "input")})
    idx = [KIdx(KVar("r")), KIdx(KVar("k"))]
    r.stmt = "U"
    assert c_value(r.access("a", "float32", (33, 40), idx)) == "r_a_frag[ii0]"
    r.stmt = "E"
    assert c_value(r.access("a", "float32", (33, 40), idx)) == "a[r * 40 + k]"


def test_lower_fragments_two_variables_and_a_pipelined_tile():
    from polyfuse.cuda.codegen.kernel_ast import KTile
    from polyfuse.cuda.codegen.lower_fragments import OperandFragment, lower_fragments

    stage = KOp("%", (KVar("kt0"), KInt(2)))
    inner = KFor("iv", KInt(0), KOp("<=", (KVar("iv"), KInt(3))), 1, [KStmt("U", ())])
    micro = KFor("ii1", KInt(0), KOp("<=", (KVar("ii1"), KInt(1))), 1, [inner])
    ir = KernelIR("k", (), (("t0", 4),), (micro,), ("mg",)).with_(
        allocs=(KAlloc("s_w", MemSpace.SHARED, "float", (2, 8, 64)),),
        tiles=(KTile("w", "s_w", (KInt(0), KInt(0)), frozenset({"U"}), stage),),
    )
    col = KOp("+", (KVar("iv"), KOp("*", (KInt(4), KVar("ii1")))))
    frag = OperandFragment("w", ("ii1", "iv"), (2, 4), (KVar("kk0"), col), frozenset({"U"}))
    after = lower_fragments(ir, [frag], ["ii1", "iv"])
    index = KOp("+", (KOp("*", (KVar("ii1"), KInt(4))), KVar("iv")))
    assert after.fragments[0].index == index
    load = after.body[0]
    assert [load.var, load.body[0].var] == ["ii1", "iv"] and load.body[0].unroll
    copy = load.body[0].body[0]
    assert copy.src_index[0] == stage and copy.dst_index == (index,)
    assert after.body[1] == micro
