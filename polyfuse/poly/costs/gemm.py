"""Description of a GEMM-like kernel from its tiling, before the kernel exists.

:func:`polyfuse.poly.tiling.rank_gemm_tiles` prices every candidate tiling through the cost
model. The candidate kernel is not generated yet, so :func:`gemm_tile_desc` describes it from
the loop code the passes will give it (:func:`polyfuse.poly.costs.gemm_code.loop_code`: the
shared tiles and their copies, the unrolled reduction steps, the fragment loads by vector
width, the launch bounds), per k-tile and thread:

- ``acc x steps`` FFMA (padded reduction steps included);
- the fragment loads (LDS.32/64/128, their bytes through the shared-memory pipe);
- the tile copies: one ``cp.async`` (double-buffered) or a load and a store (single stage)
  each, :data:`COPY_INTS` address slots, :data:`GUARD_SLOTS` more where the copy checks the
  array's bounds; through L1, whole 128-byte lines where a warp's request uses part of them;
- :data:`LOOP_SLOTS` per iteration of the reduction loop kept as a loop (none when the steps
  are unrolled whole);
- :data:`KTILE_SLOTS` for the k-tile itself (two barriers, the async-copy wait, the loop's
  counter and branch, the copy pointers' advance);

then the epilogue per output (its tensor expression, :mod:`polyfuse.poly.costs.ops`, and a
scalar or float4 store, guarded against the extents where tiles pad them) and the prologue
(indices, pointers, the accumulators' zeros). Registers: the micro-tile's estimate
(:func:`polyfuse.poly.policy.gemm_tile_registers`) under the launch bounds the loop pass sets;
shared memory: the tiles times their stages. A block streams its tiles from L2
(``block_read_bytes``); those copied by 16-byte ``cp.async`` (pipelined float4 tiles) bypass
the L1 (``block_bypass_bytes``: no block reuses another's from there). Where the instruction
mix comes from: ``GEMM tile estimate``.

The slot constants were read off the SASS of the generated kernels (NVRTC 13.0, nvdisasm
13.5, sm_80 and sm_90: matmul, FFN, convs and attention at several tilings each); ``python
benchmarks/tile_check.py`` compares the estimate with the SASS of the candidates the model
ranks first and prints the agreement.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from polyfuse.base.decision import DecisionKind, noted
from polyfuse.base.decision_data import GemmLoopData
from polyfuse.poly.costs.desc import KernelDesc, Mix
from polyfuse.poly.costs.gemm_code import LoopCode, Operand, TileLayout, loop_code
from polyfuse.poly.device import DeviceSpec

#: integer slots per tile copy beside the copy itself (its shared and global addresses)
COPY_INTS = 3.5
#: slots more per copy that checks the array's bounds (the predicate, the zero fill)
GUARD_SLOTS = 3.0
#: slots per iteration of a reduction loop kept as a loop (counter, compare, branch, the
#: fragment addresses it advances)
LOOP_SLOTS = 16.0
#: integer slots per fragment load issued word by word (the address arithmetic of a conv's
#: input window, whose offsets do not all fold into the loads)
WORD_LOAD_INTS = 0.4
#: slots of one k-tile besides its steps and copies (2 BAR, the async-copy wait, the counter
#: and branch, the copy pointers' advance, moves)
KTILE_SLOTS = 22.0
#: slots before the k-tile loop (indices, pointers; the accumulators' zeros come on top)
PROLOGUE = 60.0
#: slots per output of the epilogue besides its expression (the accumulator's move, the
#: store's share, its address)
OUTPUT_SLOTS = 1.0
#: slots per output the epilogue spends checking it against the extents (partial tiles)
GUARD_OUTPUT_SLOTS = 2.0


@dataclass(frozen=True)
class GemmProblem:
    """What a GEMM-like micrograph computes: extents of its data and reduction dims, the
    operands the update reads (:class:`~polyfuse.poly.costs.gemm_code.Operand`), the matrix
    plane's rows (``m_dim``) and columns (the last data dim) and the tiled reduction dim
    (``kin``), the distinct bytes it reads and writes, and the epilogue's estimate per output
    element (without its store)."""

    data: tuple[int, ...]
    red: tuple[int, ...]
    operands: tuple[Operand, ...]
    m_dim: int
    kin: int
    bytes_read: int
    bytes_written: int
    epilogue: Mix

    @property
    def n_dim(self) -> int:
        return len(self.data) - 1

    @property
    def k(self) -> int:
        return self.red[self.kin]


def gemm_loop_code(p: GemmProblem, lay: TileLayout, device: DeviceSpec) -> LoopCode:
    """The loop code ``lay`` gets for ``p`` on ``device``."""
    rows = lay.regs[p.m_dim]
    acc = 1
    for r in lay.regs:
        acc *= r
    return loop_code(p.operands, p.data, p.red, lay, (rows, acc // rows), device)


def ktile_mix(code: LoopCode, worst: bool = False) -> Mix:
    """What one thread executes per k-tile of ``code`` (see the module doc); ``worst``: with
    window fragments loaded word by word (:attr:`LoopCode.fragment_loads_worst`)."""
    if worst:
        code = replace(
            code,
            fragment_loads=code.fragment_loads_worst,
            fragment_wavefronts=code.fragment_wavefronts_worst,
        )
    sync = code.stages == 1
    copies = code.copies
    guarded = sum(t.copies for t in code.tiles if t.guarded)
    fill = code.fill_bytes
    loop = LOOP_SLOTS * code.bodies if code.bodies > 1 else 0.0
    ffma = code.accumulators * code.steps
    words = WORD_LOAD_INTS * code.fragment_loads.get(1, 0)
    ints = copies * COPY_INTS + guarded * GUARD_SLOTS + loop + words + KTILE_SLOTS / 2
    return Mix(
        slots=ffma
        + code.fragment_instructions
        + copies * (2 if sync else 1)
        + ints
        + KTILE_SLOTS / 2,
        ints=ints,
        ffma=ffma,
        lds=float(code.fragment_bytes),
        ldgsts=0.0 if sync else fill,
        ldg=fill if sync else 0.0,
        sts=fill if sync else 0.0,
        l1=code.line_waste,
        bar=2,
    )


def gemm_tile_desc(p: GemmProblem, code: LoopCode, name: str = "gemm") -> KernelDesc:
    """The cost model's description of ``p`` run as ``code`` (see the module doc)."""
    sync = code.stages == 1
    fill = code.fill_bytes
    per_ktile = ktile_mix(code)
    outputs = code.accumulators
    stores = outputs / (4 if code.vector_stores else 1)
    guard = GUARD_OUTPUT_SLOTS * outputs if code.guarded_outputs else 0.0
    epilogue = p.epilogue.scaled(outputs) + Mix(
        slots=outputs * OUTPUT_SLOTS + stores + guard, ints=guard, stg=4.0 * outputs
    )
    prologue = Mix(slots=PROLOGUE + outputs / 2, ints=PROLOGUE / 2)
    mix = per_ktile.scaled(code.ktiles) + epilogue + prologue
    notes = list(code.notes)
    if code.min_blocks:  # the modelled code's launch bounds (poly/gemm_loops.py chooses them)
        why = (
            f"__launch_bounds__({code.threads}, {code.min_blocks}): at most "
            f"{code.register_cap} registers"
        )
        data = GemmLoopData(
            "launch bounds",
            threads=code.threads,
            min_blocks=code.min_blocks,
            register_cap=code.register_cap,
        )
        notes.append(noted(DecisionKind.GEMM_LOOP, why, name, data=data))
    return KernelDesc(
        name=name,
        source="GEMM tile estimate",
        blocks=code.blocks,
        threads=code.threads,
        registers=code.registers,
        shared_bytes=code.shared_bytes,
        mix=mix,
        bytes_read=p.bytes_read,
        bytes_written=p.bytes_written,
        vector_bytes=(p.bytes_read if all(t.width > 1 for t in code.tiles) else 0)
        + (p.bytes_written if code.vector_stores else 0),
        inflight_bytes=fill,
        block_read_bytes=code.block_fill_bytes * code.ktiles,
        block_bypass_bytes=code.block_bypass_bytes * code.ktiles,
        barriers=True,
        sync_phases=float(code.ktiles) if sync else 0.0,
        notes=tuple(notes),
    )
