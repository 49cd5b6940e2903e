"""Tensorization decision: a 16-bit GEMM-like micrograph on ``mma.sync.aligned.m16n8k16`` (a
byte one on ``m16n8k32``, a float32 one on tf32 ``m16n8k8`` where the user allows it).

TensorIR's matching (seeds/003), on this compiler's isl model: the intrinsic computes
``D[m, n] += A[m, k] * B[k, n]`` over one 16x8x16 tile per warp. A micrograph matches when
:func:`polyfuse.poly.tiling.detect_gemm` finds its GEMM structure (one sum update, a product
of reads of micrograph inputs, an elementwise epilogue on the data domain) with 16-bit
operands, and the update's access relations are the intrinsic's up to renaming and a batch:

- one reduction dimension ``k`` (the intrinsic's), two data dimensions ``m`` and ``n`` (rows
  and columns of the result), every other data dimension a batch: the last two first, else
  the first other pair ``m`` before ``n`` (``n`` latest) that matches, so a 1x1 stride-1 NCHW
  conv ``out[b, o, y, x] = w[o, c] * x[b, c, y, x]`` is a GEMM with ``m = o``, ``n = x`` over
  the batch ``(b, y)``;
- exactly two factors, both plain reads of the same 16-bit dtype, accumulated in float32; or
  both int8/uint8 reads widened to int32 (``int32(a) * int32(b)``, any signedness pair),
  accumulated in int32, on ``m16n8k32`` (an operand stored with k outside is filled
  k-innermost element by element: ``ldmatrix`` has no ``.trans`` of bytes; the graph pass
  :mod:`polyfuse.graph.passes.bytes_k_inner` stores such operands k-innermost first);
- operand ``A`` reads ``m`` and ``k`` with unit coefficients in two distinct array
  dimensions and does not depend on ``n``; ``B`` likewise with ``n``; every other array
  dimension is an affine function of the batch dimensions only (isl: the affine access's
  coefficients). Which of the two array dimensions is innermost fixes the shared layout and
  whether the fragment is loaded with ``ldmatrix`` or ``ldmatrix.trans`` (``x @ W^T``, the
  Linear layout, is B with ``k`` innermost).
- otherwise an implicit GEMM (:mod:`polyfuse.poly.tensorize_gather`): several reduction dims
  flattened into one ``k``, operands that are no plain tiles (strided, mixed, a padding select
  isl proves redundant) gathered element by element by the fill; where no dim pair matches, a
  data dim read through a floor division (a grouped conv's channel) split into (group, row).

The decision (:func:`map_tensor_core`) gives a :class:`TensorCoreKernel`: a block tile of warps,
each warp a grid of 16x8 mma tiles, k-steps of 16 over k-tiles of ``BLOCK_K``, the tiling
chosen by the model of :mod:`polyfuse.poly.tensorize_tiling`. The shared
tiles are unpadded and XOR-swizzled (:func:`operand_layouts`, the rule in
:mod:`polyfuse.poly.swizzle`; padded rows where it does not apply, the layout and reason noted).
Out-of-range elements (odd M, N, K) are zero-filled in shared memory so whole mma tiles are
correct, and the epilogue's stores are guarded. Where every row of an operand's array starts
16-byte aligned and the tile's chunks start on 8-element boundaries (:func:`fill_alignment`),
the tiles are filled by 16-byte ``cp.async`` chunks and the k-tile loop is pipelined over S
stages chosen by ALCOP's latency model (:func:`stage_problem`, the use time at the SM's
tensor-core rate) inside the shared-memory budget; otherwise scalar single-stage fills, the
reason noted. Where it does not apply, the reason is returned and the caller records it beside
its other GEMM decisions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import islpy as isl

from polyfuse.base.decision import Decided, DecisionKind, DecisionNote, Refusal, noted, refused
from polyfuse.base.decision_data import TensorCoreData
from polyfuse.graph.expr import Binary, Select, widened_byte_read
from polyfuse.poly import tensorize_tiling
from polyfuse.poly.costs.stages import StageChoice, StageProblem, choose_stages
from polyfuse.poly.device import DeviceSpec
from polyfuse.poly.gemm_shape import GemmShape
from polyfuse.poly.mapping import MappedKernel
from polyfuse.poly.mma_operand import (  # noqa: F401 (re-export)
    BYTE_DTYPES,
    CHUNK,
    HALF_DTYPES,
    ITEMSIZE,
    MmaOperand,
    fill_alignment,
)
from polyfuse.poly.placement import Placement
from polyfuse.poly.policy import tensor_core_tile_budget
from polyfuse.poly.promote import pipeline_stages
from polyfuse.poly.schedule import ScheduledMicrograph
from polyfuse.poly.swizzle import ROW_PAD, SharedLayout, operand_layout
from polyfuse.poly.tensorize_gather import (
    affine_index,
    chunked_k,
    factor_read,
    fold_columns,
    gather_operand,
    group_splits,
    guarded_operands,
    k_extent,
    linear_k,
    split_shape,
)
from polyfuse.poly.tensorize_order import choose_k_order
from polyfuse.poly.tensorize_tiling import (
    MMA_M,
    MMA_N,
    MmaTiling,
    choose_mma_tiling,
    extent,
)
from polyfuse.poly.tiling import detect_gemm


@dataclass(frozen=True)
class TensorCoreKernel(MappedKernel):
    """A GEMM-like micrograph whose update runs on tensor cores (see the module doc)."""

    shape: GemmShape | None = None
    dtype: str = ""
    a: MmaOperand | None = None
    b: MmaOperand | None = None
    tiling: MmaTiling | None = None
    stages: int = 1
    #: the shared tiles are filled by 16-byte cp.async chunks (else scalar 2-byte copies)
    vector_fill: bool = False
    #: the shared layouts of A's and B's tiles (:func:`operand_layouts`)
    a_layout: SharedLayout | None = None
    b_layout: SharedLayout | None = None
    #: ``(d, og)``: the micrograph's data dim ``d`` is split into ``shape``'s dims ``d`` (the
    #: group) and ``d + 1`` (``og`` rows in it), ``d = og * g + o`` (a grouped conv)
    split: tuple[int, int] | None = None
    #: the data dim folded into the columns with ``n`` (outer to it, row-major): a conv's
    #: output rows beside its narrow output width
    #: (:func:`polyfuse.poly.tensorize_gather.fold_columns`)
    fold: int | None = None
    #: register fragment buffers (2: double-buffered across the k-steps, tensorize_fragments)
    fragment_buffers: int = 1
    #: the steady k-tile loop unrolled by its stages (constant stage offsets,
    #: tensorize_fragments.stage_unroll)
    stage_unroll: bool = False
    #: B's dtype where it differs from A's (``dtype``): uint8 x int8 on ``m16n8k32``
    b_dtype: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.b_dtype:
            object.__setattr__(self, "b_dtype", self.dtype)

    @property
    def accumulator_dtype(self) -> str:
        """int32 for byte operands, else float32."""
        return "int32" if self.dtype in BYTE_DTYPES else "float32"

    @property
    def m_dim(self) -> int:
        """The data dim of the result's rows (A's)."""
        assert self.a is not None
        return self.a.outer_dim

    @property
    def n_dim(self) -> int:
        """The data dim of the result's columns (B's)."""
        assert self.b is not None
        return self.b.outer_dim

    def shared_bytes(self) -> int:
        """Bytes of the two shared tiles (one stage each)."""
        assert self.a_layout is not None and self.b_layout is not None
        return ITEMSIZE[self.dtype] * (self.a_layout.elements + self.b_layout.elements)


def operand_layouts(
    a: MmaOperand, b: MmaOperand, t: MmaTiling, itemsize: int = 2
) -> tuple[SharedLayout, SharedLayout]:
    """The shared layouts of A's and B's tiles (:func:`polyfuse.poly.swizzle.operand_layout`):
    a tile is ``rows`` (m or n) by ``block_k`` stored with its array's innermost dim innermost;
    between mma tiles and k-steps, ``ldmatrix`` addresses move by rows, or (along the
    innermost dim) by a k-step of the intrinsic's k (k innermost) or by A's 16-row and B's 8-column
    mma tiles per load (m or n innermost)."""
    out = []
    for op, rows, step in ((a, t.block_m, MMA_M), (b, t.block_n, MMA_N * t.b_step)):
        if op.k_inner:
            out.append(operand_layout(rows, t.block_k, itemsize, t.mma_k))
        else:
            out.append(operand_layout(t.block_k, rows, itemsize, step))
    return out[0], out[1]


#: 16-bit elements per 16-byte chunk of a shared-tile fill (one cp.async)
#: mma.sync m16n8k16 multiply-adds per SM and cycle as ALCOP's use time (dense 16-bit; the
#: loop's rate, below the instruction's ceiling,
#: :attr:`polyfuse.poly.device.DeviceSpec.mma_tflops`): the datasheets' tensor
#: rates (A100 312 TFLOP/s at 108 SMs x 1.41 GHz: 1024; GA10x/AD10x half that). Hopper's
#: 2048 are wgmma's; for mma.sync the figure is measured: on an H100 (2026-11-26,
#: ``benchmarks/gpu.py``) the 4096^3 bf16 GEMM's 128x256x32 loop ran 0.587 ms at two stages,
#: 0.575 at three and four (its load hidden: the loop is use-bound), 510 multiply-adds per
#: SM-cycle at the 1739 MHz sustained clock; with it the model gives 0.605 ms (S=2) and
#: 0.858 ms (S=1, measured 0.859).
MMA_FMA_PER_SM_CYCLE = {"sm_80": 1024, "sm_86": 512, "sm_89": 512, "sm_90": 512}


def stage_problem(
    sm: ScheduledMicrograph, tk: TensorCoreKernel, device: DeviceSpec
) -> StageProblem:
    """ALCOP's view of a tensorized k-tile loop (per block and k-tile): the use time is the
    block's multiply-adds over the SM's tensor-core rate (:data:`MMA_FMA_PER_SM_CYCLE`)."""
    t, shape = tk.tiling, tk.shape
    assert t is not None and shape is not None and tk.a is not None and tk.b is not None
    lk, hk = k_extent(shape)
    fma = t.block_m * t.block_n * t.block_k
    regs = t.registers
    model = sm.model
    dram = sum(
        math.prod(model.tensors[n].shape) * model.tensors[n].itemsize
        for n in dict.fromkeys((tk.a.tensor, tk.b.tensor))  # one array as both: once
    )
    rate = MMA_FMA_PER_SM_CYCLE.get(device.arch, 512)
    if tk.dtype == "float32":  # tf32: half the 16-bit rate (A100: 156 vs 312 TFLOP/s)
        rate //= 2
    elif tk.dtype in BYTE_DTYPES:  # int8: twice it (A100: 624 TOPS)
        rate *= 2
    return StageProblem(
        fma_per_ktile=fma,
        stage_bytes=tk.shared_bytes(),
        ktiles=-(-(hk - lk + 1) // t.block_k),
        blocks=tk.grid,
        threads=32 * t.warps,
        registers=regs,
        dram_bytes=dram,
        use_cycles=fma / rate,
        shared_budget=tensor_core_tile_budget(device),
        more_stages_on_ties=True,
    )


def _operand(
    name: str, acc: isl.Map, shape: tuple[int, ...], nd: int, mine: int, other: int
) -> MmaOperand | str:
    """The operand reading data dim ``mine`` and the reduction dim (index ``nd``), or why it
    does not match the intrinsic's operand."""
    index = affine_index(name, acc)
    if isinstance(index, str):
        return index
    rows = [i for i, (c, _) in enumerate(index) if c[mine]]
    ks = [i for i, (c, _) in enumerate(index) if c[nd]]
    if len(rows) != 1 or len(ks) != 1 or rows == ks:
        return f"{name} does not read the mma operand's row and k in two array dims"
    (r,), (k,) = rows, ks
    if index[r][0][mine] != 1 or index[k][0][nd] != 1 or any(c[other] for c, _ in index):
        return f"{name}'s row or k subscript is strided, or it reads the other operand's dim"
    if any(c[mine] or c[nd] for i, (c, _) in enumerate(index) if i not in (r, k)):
        return f"{name} mixes its row or k into a batch subscript"
    if sum(1 for c in index[r][0] if c) != 1 or sum(1 for c in index[k][0] if c) != 1:
        return f"{name}'s row or k subscript mixes dims"
    last = max(i for i, e in enumerate(shape) if e > 1 or i in (r, k))
    if last not in (r, k):
        return f"neither k nor the row dim is {name}'s innermost dim"
    return MmaOperand(name, shape, tuple(index), mine, k == last, last)


def match_mma(
    sm: ScheduledMicrograph, dtypes: tuple[str, ...] = HALF_DTYPES
) -> tuple[GemmShape, str, MmaOperand, MmaOperand, tuple[int, int] | None] | str:
    """The micrograph's GEMM shape, operand dtype and mma operands A and B, or why the
    intrinsic does not match (see the module doc)."""
    shape = detect_gemm(sm, dtypes)
    if not isinstance(shape, GemmShape):  # a Refusal: its reason
        return str(shape)
    model = sm.model
    nd = len(shape.data)
    red = shape.update.tensor.op.reduce
    body = red.body
    if not (isinstance(body, Binary) and body.op == "mul"):
        return "the update is not a product of two reads"
    reads = [factor_read(f) for f in (body.a, body.b)]
    if None in reads:
        return "a factor is neither a plain read nor a padding select of one (casts)"
    if len(shape.operands) != 2:
        return "the update does not read exactly two operands"
    dtypes = {model.tensors[n].dtype for n, _ in shape.operands}
    byte = dtypes <= set(BYTE_DTYPES)  # int8 x uint8 is one of m16n8k32's forms
    if len(dtypes) != 1 and not byte:
        return f"mixed operand dtypes {sorted(dtypes)}"
    if byte and any(widened_byte_read(_unpadded(f)) is None for f in (body.a, body.b)):
        return "a byte factor is not widened to int32 (the products would wrap at 8 bits)"
    acc = "int32" if byte else "float32"
    if red.accumulate_dtype != acc:
        return f"accumulates in {red.accumulate_dtype}, not {acc}"
    guarded = guarded_operands(shape, model, body)
    if isinstance(guarded, str):
        return guarded
    first = ""
    for m, n in _dim_pairs(nd):
        got = _pair(shape, model, m, n, guarded)
        if not isinstance(got, str):
            swapped = _pair(shape, model, n, m, guarded)
            size = ITEMSIZE[model.tensors[got[0].tensor].dtype]
            if not isinstance(swapped, str) and _padding(shape, swapped, size) < _padding(
                shape, got, size
            ):
                got = swapped
            return shape, model.tensors[got[0].tensor].dtype, *_bytes_k_inner(*got, byte), None
        first = first or got
    for d, og in group_splits(shape):  # a grouped conv: a batch of GEMMs per group
        split = split_shape(shape, d, og)
        for m, n in _dim_pairs(nd + 1):
            got = _pair(split, model, m, n, guarded)
            if not isinstance(got, str):
                a, b = _bytes_k_inner(*got, byte)
                return split, model.tensors[a.tensor].dtype, a, b, (d, og)
    return f"no A/B operand pair: {first}"


def _unpadded(f):
    """A factor without its padding select ``where(c, f, 0)``."""
    return f.a if isinstance(f, Select) else f


def _bytes_k_inner(a: MmaOperand, b: MmaOperand, byte: bool) -> tuple[MmaOperand, MmaOperand]:
    """Byte operands stored m- or n-innermost, filled element by element into k-innermost
    tiles (``ldmatrix`` has no ``.trans`` of 8-bit elements); others as matched."""
    if not byte:
        return a, b
    return tuple(
        op
        if op.k_inner
        else replace(
            op, gather=True, k_inner=True, linear=None, chunked=False, transposed_fill=True
        )
        for op in (a, b)
    )  # type: ignore[return-value]


def _either(
    t: str, acc: isl.Map, arr: tuple[int, ...], shape: GemmShape, mine: int, other: int,
    guarded: bool, chunk: int,
) -> MmaOperand | str:  # fmt: skip
    """The plain operand where it matches (one reduction dim, no select), else the gathered
    one (:mod:`polyfuse.poly.tensorize_gather`), or the plain match's reason; ``chunk``: its
    elements per 16-byte chunk."""
    nd = len(shape.data)
    plain = _operand(t, acc, arr, nd, mine, other) if len(shape.red) == 1 else ""
    if isinstance(plain, MmaOperand) and not guarded:
        return replace(plain, chunk=chunk)
    got = gather_operand(t, acc, arr, nd, mine, other)
    if isinstance(got, str):
        return plain if isinstance(plain, str) and plain else got
    index, k_inner, inner = got
    lin = None if guarded else linear_k(index, arr, shape, mine, k_inner)
    chunked = lin is None and chunked_k(index, arr, shape, k_inner, chunk)
    return MmaOperand(
        t, arr, index, mine, k_inner, inner, True, guarded, lin, chunked, chunk=chunk
    )


def _dim_pairs(nd: int) -> list[tuple[int, int]]:
    """The (m, n) data-dim pairs tried, in order: the last two, then ``n`` from the last dim
    down, ``m`` before it from the nearest down."""
    return [(m, n) for n in range(nd - 1, 0, -1) for m in range(n - 1, -1, -1)]


def _chunkable(shape: GemmShape, b: MmaOperand) -> bool:
    """A plain or linearly gathered operand (a strided 1x1 conv's channels-last input,
    ``x[n, 2h, 2w, c]``) stored k-innermost whose k runs are aligned 16-byte chunks
    (:func:`chunked_k`): gathered with a folded dim, it keeps its chunks. The strided
    projection convs of ResNet-50 so fold their output rows into the columns instead of
    padding a 64-row tile for 28 (or 14, 7) rows: bf16 stage 2, 3.75 -> 1.45 modelled other
    instructions per useful HMMA."""
    return (
        (not b.gather or b.linear is not None)
        and b.k_inner
        and chunked_k(b.index, b.shape, shape, True, b.chunk)
    )


def _may_fold(shape: GemmShape, b: MmaOperand, size: int) -> bool:
    """Whether B may take a dim folded into its columns (which gathers it): it is gathered
    anyway (element by element, or by chunks of channels whatever the reduction's declared
    order), its rows take no 16-byte chunks (scalar fills), or its chunks survive the
    gather (:func:`_chunkable`)."""
    lo_b = k_extent(shape)[0] if b.k_inner else shape.data[b.outer_dim][0]
    return (
        (b.gather and b.linear is None)
        or bool(fill_alignment(b, lo_b, 16 // size))
        or _chunkable(shape, b)
    )


def _padding(shape: GemmShape, ops: tuple[MmaOperand, MmaOperand], size: int) -> float:
    """The padded over the useful outputs of the smallest block tile on operands ``(A, B)``:
    rows A's row dim, columns B's with the dim outside folded in (:func:`fold_columns`). A
    conv stored channels-last matches first with its narrow output width as the rows (the
    channels innermost are the columns); its weight's rows and the width with the height
    folded in pad far less."""
    a, b = ops
    rows = min(t[0] for t in tensorize_tiling.TILINGS)
    cols = min(t[1] for t in tensorize_tiling.TILINGS)
    fold = fold_columns(shape, a.outer_dim, b.outer_dim, a.index, cols)
    fold = fold if _may_fold(shape, b, size) else None
    m = extent(shape, a.outer_dim)
    n = extent(shape, b.outer_dim) * (1 if fold is None else extent(shape, fold))
    return (-(-m // rows) * rows * -(-n // cols) * cols) / (m * n)


def _pair(
    shape: GemmShape, model, m: int, n: int, guarded: set[str]
) -> tuple[MmaOperand, MmaOperand] | str:
    """Operands A (reading data dim ``m`` and k) and B (``n`` and k), or why not: plain tiles
    (one reduction dim, no select) where :func:`_operand` matches, else gathered."""
    ops: list[MmaOperand | str] = []
    for mine, other in ((m, n), (n, m)):
        found = [
            _either(
                t, acc, tuple(model.tensors[t].shape), shape, mine, other, t in guarded,
                16 // ITEMSIZE[model.tensors[t].dtype],
            )
            for t, acc in shape.operands
        ]
        ok = [o for o in found if isinstance(o, MmaOperand)]
        ops.append(ok[0] if len(ok) == 1 else "; ".join(o for o in found if isinstance(o, str)))
    a, b = ops
    if isinstance(a, str) or isinstance(b, str):
        return a if isinstance(a, str) else str(b)
    return a, b


def _pipelining(
    sm: ScheduledMicrograph, tk: TensorCoreKernel, device: DeviceSpec, forced: int | None
) -> tuple[bool, StageChoice]:
    """Whether ``tk``'s tiles are filled by 16-byte cp.async chunks, and its stage count (the
    ALCOP model, or ``forced`` within the budget), with the reasons."""
    assert tk.shape is not None and tk.a is not None and tk.b is not None
    if pipeline_stages(device.arch) == 1:
        return False, StageChoice(1, f"single-stage: no cp.async on {device.arch}")
    (lm, _), (ln, _) = tk.shape.data[tk.m_dim], tk.shape.data[tk.n_dim]
    lk = k_extent(tk.shape)[0]
    size = ITEMSIZE[tk.dtype]
    gathered = [op.tensor for op in (tk.a, tk.b) if op.scalar]
    if len(gathered) == 2:
        return False, StageChoice(
            1,
            f"single-stage, scalar {size}-byte fills: {' and '.join(gathered)} gathered "
            "(implicit GEMM: the reduction dims flattened into k, im2col in the fill)",
        )
    why = [
        fill_alignment(op, lk if op.k_inner else lo, 16 // size)
        for op, lo in ((tk.a, lm), (tk.b, ln))
        if not op.scalar
    ]
    why = [w for w in why if w]
    if why:
        if gathered:
            why.insert(0, f"{gathered[0]} gathered (implicit GEMM: the reduction dims "
                          "flattened into k, im2col in the fill)")  # fmt: skip
        return False, StageChoice(1, f"single-stage, scalar {size}-byte fills: " + "; ".join(why))
    choice = choose_stages(stage_problem(sm, tk, device), device, forced)
    if gathered:  # the other operand's k runs are contiguous: chunks, pipelined
        chunked = tk.b.tensor if gathered[0] == tk.a.tensor else tk.a.tensor
        reason = (
            f"{gathered[0]} gathered (implicit GEMM: the reduction dims flattened into k, "
            f"im2col in the fill) by scalar {size}-byte copies into the stages, {chunked} by "
            f"16-byte cp.async chunks; {choice.reason}"
        )
        choice = replace(choice, reason=reason)
    return True, choice


def _fragment_load(op: MmaOperand, x: str, tf32: bool) -> str:
    """How ``op``'s fragments are loaded from shared memory (for the notes)."""
    if tf32 and op.trans:  # ldmatrix .trans moves 16-bit elements
        return "32-bit shared loads (no ldmatrix.trans of 32-bit elements)"
    return f"ldmatrix.{x}" + (".trans" if op.trans else "")


def map_tensor_core(
    sm: ScheduledMicrograph,
    device: DeviceSpec,
    stages: int | None = None,
    tf32: bool = False,
    block_k: int | None = None,
    tiling: tuple[int, int, int, int] | None = None,
    tiling_reason: str = "",
) -> TensorCoreKernel | Refusal:
    """The tensorized mapping of ``sm`` on ``device``, or why not (a :class:`Refusal` of
    tensor cores about the micrograph); ``stages``
    forces the k-tile pipeline's stage count (refused over the shared budget, noted);
    ``tf32``: a float32 GEMM on ``m16n8k8`` tf32 (the user's ``allow_tf32``) instead of a
    16-bit one; ``block_k`` forces the k-tile (``MappingConfig.mma_block_k``), ``tiling``
    the block tile and warp grid (for ``tiling_reason``)."""
    got = match_mma(sm, ("float32",) if tf32 else HALF_DTYPES + BYTE_DTYPES)
    shape_name = "m16n8k8" if tf32 else "m16n8k16"
    if not isinstance(got, str) and got[1] in BYTE_DTYPES:
        shape_name = "m16n8k32"
    if not device.arch.startswith("sm_") or int(device.arch[3:].rstrip("a")) < 80:
        why = f"no {shape_name} mma.sync on {device.arch} (sm_80 and later)"
        return refused(DecisionKind.TENSOR_CORES, why, sm.name)
    if isinstance(got, str):
        return refused(DecisionKind.TENSOR_CORES, got, sm.name)
    shape, dtype, a, b, split = got
    b_dtype = sm.model.tensors[b.tensor].dtype
    byte = dtype in BYTE_DTYPES
    narrow = min(t[1] for t in tensorize_tiling.TILINGS)
    fold = None
    if _may_fold(shape, b, ITEMSIZE[dtype]):
        fold = fold_columns(shape, a.outer_dim, b.outer_dim, a.index, narrow)
    if fold is not None:
        b = replace(b, gather=True, linear=None, chunked=b.chunked or _chunkable(shape, b))
    mn = (a.outer_dim, b.outer_dim)
    size = ITEMSIZE[dtype]

    def aligned(op: MmaOperand) -> bool:
        lo = 0 if op.k_inner else shape.data[op.outer_dim][0]
        return not fill_alignment(op, lo, 16 // size)

    tiling, why = choose_mma_tiling(
        shape, device, size, mn, fold, (a, b), aligned, block_k, tiling, tiling_reason
    )
    shape, a, b, order_note = choose_k_order(
        shape, a, b, (tiling.block_m, tiling.block_n), tiling.block_k, 32 * tiling.warps, aligned
    )
    grid = [hi - lo + 1 for i, (lo, hi) in enumerate(shape.data) if i not in (*mn, fold)]
    cols = extent(shape, mn[1]) * (1 if fold is None else extent(shape, fold))
    grid += [-(-extent(shape, mn[0]) // tiling.block_m), -(-cols // tiling.block_n)]
    names = [f"pf_g{i}" for i in range(len(grid))]
    lay = "k" if a.k_inner else "m"
    lbt = "k" if b.k_inner else "n"
    bx = "x4 (two mma tiles)" if tiling.b_step == 2 else "x2"
    la, lb = operand_layouts(a, b, tiling, ITEMSIZE[dtype])
    kind = "tf32 (float32 operands, allow_tf32)" if tf32 else dtype
    if b_dtype != dtype:
        kind = f"{dtype} x {b_dtype}"
    acc = "int32" if byte else "float32"
    tc, gemm = DecisionKind.TENSOR_CORES, shape.update.prim
    notes: list[str] = [
        f"tensor cores: mma.sync.{shape_name} {kind} -> {acc} accumulators; {why}",
        noted(
            tc,
            f"tensor cores: {a.tensor} (A) in shared as {dtype}, {lay} innermost, "
            f"{_fragment_load(a, 'x4', tf32)}; {b.tensor} (B) {lbt} innermost, "
            f"{_fragment_load(b, bx, tf32)}",
            a.tensor,
            b.tensor,
        ),
        *(
            [
                noted(
                    tc,
                    f"tensor cores: {op.tensor} is stored {'m' if op is a else 'n'} innermost; "
                    "its tile is filled element by element k-innermost (ldmatrix has no "
                    ".trans of 8-bit elements)",
                    op.tensor,
                )
                for op in (a, b)
                if op.transposed_fill
            ]
        ),
        noted(
            tc,
            f"tensor cores: shared layout of {a.tensor} (A): {la.describe()}; of {b.tensor} "
            f"(B): {lb.describe()} (bank-conflict-free cp.async writes and ldmatrix reads)",
            a.tensor,
            b.tensor,
        ),
        *(
            [
                noted(
                    tc,
                    f"tensor cores: data dim {split[0]} split into (group, {split[1]} in the "
                    "group): a batch of GEMMs, one per group (a grouped conv's channels)",
                    gemm,
                )
            ]
            if split
            else []
        ),
        *(
            []
            if fold is None
            else [
                noted(
                    tc,
                    f"tensor cores: data dim {fold} folded into the columns with data dim "
                    f"{mn[1]} ({extent(shape, fold)} x {extent(shape, mn[1])} = {cols} columns, "
                    f"the {extent(shape, mn[1])} alone narrower than a block tile)",
                    gemm,
                )
            ]
        ),
        *(
            []
            if mn == (len(shape.data) - 2, len(shape.data) - 1)
            else [
                noted(
                    tc,
                    f"tensor cores: the GEMM's rows are data dim {mn[0]}, its columns data dim "
                    f"{mn[1]}, the other data dims a batch (one block tile per batch point)",
                    gemm,
                )
            ]
        ),
        *([order_note] if order_note else []),
        noted(
            tc,
            "tensor cores: out-of-range elements of the shared tiles are zero-filled (whole mma "
            "tiles); the epilogue runs per accumulator element at its fragment (row, col), "
            "guarded by the result's extents",
            gemm,
        ),
    ]
    decision = Decided(
        (DecisionKind.GEMM_LOOP,),
        notes[0],
        TensorCoreData(
            "tensorize",
            "m16n8k8.tf32" if tf32 else f"{shape_name}.{kind.replace(' x ', '.')}",
            [tiling.block_m, tiling.block_n, tiling.block_k],
            [tiling.warps_m, tiling.warps_n],
            layouts=[f"{a.tensor}: {la.describe()}", f"{b.tensor}: {lb.describe()}"],
            tile_bytes=[la.elements * ITEMSIZE[dtype], lb.elements * ITEMSIZE[dtype]],
        ),
    )
    ctx = isl.Set("{ : }", context=sm.model.ctx)
    tk = TensorCoreKernel(
        sm,
        sm.schedule,
        ctx,
        names,
        [],
        grid,
        [],
        shape.data,
        notes=notes,
        layout=decision,
        shape=shape,
        dtype=dtype,
        a=a,
        b=b,
        tiling=tiling,
        thread_order=[("pf_tid", 32 * tiling.warps)],
        a_layout=la,
        b_layout=lb,
        split=split,
        fold=fold,
        b_dtype=b_dtype,
    )
    vector, choice = _pipelining(sm, tk, device, stages)
    size = ITEMSIZE[dtype]
    fill = noted(
        tc,
        f"tensor cores: the shared tiles are filled by 16-byte cp.async chunks ({16 // size} "
        "elements, zero-filled past the arrays' edges)"
        if vector
        else f"tensor cores: scalar {size}-byte shared fills",
        gemm,
    )
    made = [True] + [c.stages == choice.stages and not c.refused for c in choice.candidates]
    stage = DecisionKind.PIPELINE_STAGES  # the choice, then each candidate (made: the chosen)
    tk.notes.append(fill)
    for n, m in zip(choice.notes, made, strict=True):
        tk.notes.append(noted(stage, f"tensor cores: stages: {n}", sm.name, made=m))
    data = replace(
        decision.data, stages=choice.stages, fill="cp.async 16 B" if vector else "scalar"
    )
    layout = Decided(decision.kinds, decision.reason, data)
    tk.notes[0] = DecisionNote(layout)  # the note is the layout's record
    return replace(tk, stages=choice.stages, vector_fill=vector, layout=layout)


def tensor_core_placements(tk: TensorCoreKernel) -> dict[str, Placement]:
    """Where each tensor of a tensorized kernel lives, with the reason."""
    model = tk.scheduled.model
    shape = tk.shape
    assert shape is not None and tk.a is not None and tk.b is not None
    acc = f"{shape.update.prim}_acc"
    read_inside = {m.get_tuple_name(isl.dim_type.out) for s in shape.epilogue for _, m in s.reads}
    out: dict[str, Placement] = {}
    for name, role in model.tensors.items():
        if name in (tk.a.tensor, tk.b.tensor):
            dtype = tk.dtype if name == tk.a.tensor else tk.b_dtype
            out[name] = Placement(name, "shared", f"mma operand tile in {dtype}")
        elif role.role == "input":
            out[name] = Placement(name, "global", "micrograph input (epilogue operand)")
        elif name == acc:
            out[name] = Placement(
                name, "register", f"mma accumulator fragments ({tk.accumulator_dtype})"
            )
        elif role.role == "output":
            out[name] = Placement(
                name, "global", "micrograph output", register_copy=name in read_inside
            )
        else:
            out[name] = Placement(name, "register", "one element per accumulator (epilogue)")
    return out


__all__ = [
    "MmaOperand",
    "MmaTiling",
    "TensorCoreKernel",
    "ROW_PAD",
    "map_tensor_core",
    "match_mma",
    "operand_layouts",
    "tensor_core_placements",
]
