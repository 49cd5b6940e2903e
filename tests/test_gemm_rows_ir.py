"""The GEMM + row-reduction kernel as kernel IR (issue 21 item 1): the two lowered halves are
joined as sections of one IR (:mod:`polyfuse.cuda.codegen.lower_gemm_rows`) and printed by the
one printer — before/after on hand-built IRs, then a compiled attention kernel."""

from __future__ import annotations

import polyfuse
from polyfuse import ops, te
from polyfuse.cuda.codegen.kernel_ast import (
    ROW_BLOCK,
    KAlloc,
    KBarrier,
    KCopy,
    KernelIR,
    KInt,
    KMark,
    KParam,
    KRowBlocks,
    KScope,
    KSection,
    KVar,
    MemSpace,
    Scope,
    nodes_of,
)
from polyfuse.cuda.codegen.kernel_function import print_function
from polyfuse.cuda.codegen.lower_gemm_rows import (
    GEMM_NOTE,
    POOL,
    ROWS_NOTE,
    TILE_NOTE,
    RowBlocks,
    join_irs,
    pool_allocs,
)
from polyfuse.cuda.codegen.printer import print_ir


def _shared(name: str, shape: tuple[int, ...], lo=()) -> KAlloc:
    return KAlloc(name, MemSpace.SHARED, "float32", shape, lo=lo)


def _gemm() -> KernelIR:
    """A GEMM-like half: an operand tile, then its epilogue stores the row tile ``s_y``."""
    load = KCopy("s_a", (KVar("t0"),), "a", (KVar("b0"), KVar("t0")), src_shape=(2, 4))
    store = KCopy("s_y", (KInt(0), KVar("t0")), "s_a", (KVar("t0"),), src_shape=(8,))
    return KernelIR(
        "k",
        (("b0", 2),),
        (("t0", 4),),
        (load, KBarrier(Scope.BLOCK), store),
        ("mm",),
        params=(KParam("a", "const float*", "a"),),
        allocs=(_shared("s_a", (8,)), _shared("s_y", (4, 4), (KVar("b0"), KInt(0)))),
    )


def _rows() -> KernelIR:
    """A reduction half on a finer grid reading the row tile ``s_y``."""
    use = KCopy("s_z", (KVar("l0"),), "s_y", (KVar("b1"), KVar("l0")), src_shape=(4, 4))
    return KernelIR(
        "k",
        (("b0", 2), ("b1", 4)),
        (("l0", 4),),
        (KMark("part:red", (use,)),),
        ("red",),
        params=(KParam("a", "const float*", "a"), KParam("z", "float*", "z")),
        allocs=(
            _shared("s_z", (3,)),
            _shared("s_y", (4, 4), (KVar("b0"), KInt(0))),
            KAlloc("r_x", MemSpace.REGISTER, "float32", ()),
        ),
    )


HEAD = (
    'extern "C" __global__ void __launch_bounds__(4) '
    "k(const float* __restrict__ a, float* __restrict__ z) {\n"
)
JOINED = """\
  __shared__ __align__(16) unsigned char pf_pool[80];
  {  // the GEMM: its epilogue stores the row tile to shared memory
    int _b = blockIdx.x;
    const int b0 = _b;
    int _t = threadIdx.x;
    const int t0 = _t;
    float* const s_a = reinterpret_cast<float*>(pf_pool + 0);
    float* const s_y = reinterpret_cast<float*>(pf_pool + 0);
    const int s_y_lo0 = b0;
    const int s_y_lo1 = 0;
    s_a[t0] = a[b0 * 4 + t0];
    __syncthreads();
    s_y[0 * 4 + t0] = s_a[t0];
  }
  __syncthreads();  // the row tile is complete before the reduction reads it
  {  // the row reduction on the block's rows
    int pf_g = blockIdx.x;
    const int pf_g0 = pf_g;
    for (int pf_j = 0; pf_j < 4; ++pf_j) {
      const int pf_r = pf_j;
      if (pf_r < 4) {  // uniform per block
        const int pf_rb = pf_g0 * 4 + pf_r;
          int _b = pf_rb;
          const int b1 = _b % 4; _b /= 4;
          const int b0 = _b;
          int _t = threadIdx.x;
          const int l0 = _t;
          float* const s_z = reinterpret_cast<float*>(pf_pool + 64);
          float* const s_y = reinterpret_cast<float*>(pf_pool + 0);
          const int s_y_lo0 = b0;
          const int s_y_lo1 = 0;
          float r_x;
          // part:red
          s_z[l0] = s_y[b1 * 4 + l0];
      }
      __syncthreads();  // the next rows reuse the reduction's shared arrays
    }
  }
}
"""


def test_pool_allocs_overlay_and_sequence():
    """The GEMM's arrays overlay the row tile from offset 0; the reduction's follow it, each
    rounded up to 16 bytes; registers stay as they are."""
    gemm, size = pool_allocs(_gemm().allocs, "s_y", overlay=True)
    assert [(a.name, a.pool, a.offset) for a in gemm] == [("s_a", POOL, 0), ("s_y", POOL, 0)]
    assert size == 64  # the row tile, the larger
    rows, size = pool_allocs(_rows().allocs, "s_y", overlay=False)
    assert [(a.name, a.pool, a.offset) for a in rows] == [
        ("s_z", POOL, 64),
        ("s_y", POOL, 0),
        ("r_x", "", None),
    ]
    assert size == 64 + 16  # three floats take a 16-byte slot


def test_join_irs_before_after_and_printed():
    """Before: two lowered IRs, each with its own launch coordinates and shared arrays. After:
    one IR whose body is the GEMM section in a scope, a block barrier, and the reduction
    section under the row-block loop, every shared array a slice of one pool; printed by
    the one printer (the text the former text join wrote)."""
    gemm, rows = _gemm(), _rows()
    ir, pool = join_irs(gemm, rows, "y", RowBlocks((2,), (2, 4), 4))
    assert gemm == _gemm() and rows == _rows()  # the halves untouched
    assert pool == 80
    assert ir.allocs == (KAlloc(POOL, MemSpace.SHARED, "uint8", (80,), align=16),)
    assert [p.name for p in ir.params] == ["a", "z"]
    assert ir.micrographs == ("mm", "red")
    g_scope, barrier, r_scope = ir.body
    assert barrier == KBarrier(Scope.BLOCK, TILE_NOTE)
    assert (g_scope.note, r_scope.note) == (GEMM_NOTE, ROWS_NOTE)
    (g,) = g_scope.body
    assert g == KSection(
        KVar("blockIdx.x"),
        gemm.grid_dims,
        gemm.thread_dims,
        pool_allocs(gemm.allocs, "s_y", True)[0],
        (),
        gemm.body,
    )
    (loop,) = r_scope.body
    assert isinstance(loop, KRowBlocks) and (loop.gemm_grid, loop.rows_grid) == ((2,), (2, 4))
    (r,) = loop.body
    assert r.block == KVar(ROW_BLOCK) and r.body == rows.body
    assert r.allocs == pool_allocs(rows.allocs, "s_y", False)[0]
    assert "row_blocks pf_rb x4" in str(ir) and "pool pf_pool+64B" in str(ir)
    fn = print_ir(ir)
    assert fn.own_block_index and fn.own_thread_index
    assert (fn.grid_dims, fn.thread_dims) == ((), ())  # the sections split the indices
    assert print_function(fn, "k") == HEAD + JOINED


def test_compiled_gemm_rows_kernel_is_ir():
    """An attention scores GEMM + softmax compiles to one kernel whose body is the joined IR
    (sections, not printed text): the row tile at the pool's start in both halves, the
    source what the printer writes for it."""
    q = te.placeholder((1, 2, 13, 16), name="q")
    k = te.placeholder((1, 2, 16, 96), name="k")
    scores = ops.mul(ops.matmul(q, k, name="scores"), 0.25, name="scaled")
    probs = ops.softmax(scores, -1, name="probs")
    fn = polyfuse.compile([q, k], [probs], check_cuda=False, cache=None)
    (kern,) = fn.kernels
    assert [type(n) for n in kern.body] == [KScope, KBarrier, KScope]
    gemm, rows = nodes_of(kern.body, KSection)
    (loop,) = nodes_of(kern.body, KRowBlocks)
    assert loop.body == (rows,) and rows.block == KVar(ROW_BLOCK)
    tile = {a.name for a in gemm.allocs} & {a.name for a in rows.allocs}
    assert len(tile) == 1  # the row tile, seen by both halves
    for s in (gemm, rows):
        (a,) = [a for a in s.allocs if a.name in tile]
        assert (a.pool, a.offset) == (POOL, 0)
    shared = [a for s in (gemm, rows) for a in s.allocs if a.space is MemSpace.SHARED]
    assert all(a.pool == POOL for a in shared)
    assert kern.facts is not None and kern.facts.shared_bytes >= 16 * 4
    assert kern.printed is not None and kern.printed.own_block_index
    assert "__shared__ __align__(16) unsigned char pf_pool[" in kern.source
    assert kern.source.count("__shared__") == 1  # the pool only
