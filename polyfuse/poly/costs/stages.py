"""How many shared-memory stages a pipelined GEMM k-tile loop gets: ALCOP's latency model.

ALCOP (MLSys'23, Table I; ../shared/seeds/000_*) models a load-use loop of ``N_loop``
iterations whose loads take ``T_load`` and whose uses take ``T_use``, with ``N_pipe`` stages
in flight and ``N_mplx`` parallel units (blocks on one SM) that can hide a load too::

    T_load <= (N_pipe * N_mplx - 1) * T_use  ->  T_loop = T_use * N_loop          (hidden)
    otherwise                               ->  T_loop = (T_load + T_use) * N_loop / N_pipe

and a block's time ``T_block = T_init + T_loop`` (``T_init``: the first tile's load), a
kernel's ``T_block * N_batches`` (a batch: the blocks all SMs hold at once). Here, per k-tile
of one block (cycles of the SM clock):

- ``T_use``: the block's multiply-adds over the SM's FP32 lanes at the FFMA share of a
  CUDA-core GEMM loop (:data:`polyfuse.poly.device.SGEMM_FFMA_SHARE`): ALCOP's
  ``FLOPS / (Throughput_SM x Util)``;
- ``T_load = max(T_L2, T_DRAM)``: ``LAT_L2 + stage bytes x blocks per batch / BW_L2`` and
  ``LAT_DRAM + the batch's distinct bytes per k-tile / BW_DRAM``;
- ``N_mplx``: the blocks one SM holds with S stages of shared tiles (the occupancy
  calculator's arithmetic, :func:`polyfuse.poly.device.occupancy`), at most the grid's share.

S is the count in 2..:data:`MAX_STAGES` of least modelled kernel time (ties: fewer stages,
less shared memory; for tensor cores more, as measured:
:attr:`StageProblem.more_stages_on_ties`), among those whose tiles fit the problem's shared
budget (:func:`polyfuse.poly.policy.gemm_tile_budget`, static, for CUDA-core GEMMs;
:func:`polyfuse.poly.policy.tensor_core_tile_budget`, dynamic, for tensorized ones) and that
do not exceed the k-tiles (a stage past the last k-tile holds nothing). Every
candidate's figures and every refusal are kept as the choice's reasons. The two latencies are
assumptions (no GPU measured them here): the order of the L2-hit and DRAM round trips that
microbenchmarks of A100/H100 report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from polyfuse.poly.device import SGEMM_FFMA_SHARE, DeviceSpec, occupancy
from polyfuse.poly.policy import gemm_tile_budget

#: pipelined stage counts the code generator builds (cp.async groups, S buffers per tile)
MAX_STAGES = 4
#: cycles of an L2 hit's round trip (assumed: microbenchmarks of A100/H100 report ~200-270)
L2_LATENCY_CYCLES = 220.0
#: cycles of a DRAM round trip (assumed: microbenchmarks report ~450-600 on A100/H100)
DRAM_LATENCY_CYCLES = 520.0


@dataclass(frozen=True)
class StageProblem:
    """One tiled GEMM as the stage model sees it: per block and k-tile, the multiply-adds
    (padded) and the bytes of one stage of its shared tiles; the k-tiles of the pipelined
    loop, the blocks and threads of the grid, the registers per thread (estimate) and the
    distinct bytes the operands read from DRAM over the whole kernel."""

    fma_per_ktile: int
    stage_bytes: int
    ktiles: int
    blocks: int
    threads: int
    registers: int
    dram_bytes: int
    #: cycles of one k-tile's multiply-adds where the caller models them (tensor cores);
    #: 0: the FP32 CUDA-core rate below
    use_cycles: float = 0.0
    #: bytes of shared memory the stages may take; 0: :func:`gemm_tile_budget` (static)
    shared_budget: int = 0
    #: where modelled times tie, take the most stages (tensor cores: measured on an H100,
    #: 2026-11-26, the 4096^3 bf16 loop whose load two stages already hide ran 0.587 ms at two,
    #: 0.575 at three; with double-buffered register fragments 0.684 at two, 0.477 at three
    #: and four); False: the fewest (CUDA-core GEMMs, less shared memory)
    more_stages_on_ties: bool = False


@dataclass(frozen=True)
class StageCandidate:
    """One stage count's figures (cycles) or why it is refused (``refused`` non-empty)."""

    stages: int
    shared_bytes: int
    blocks_per_sm: int = 0
    t_load: float = 0.0
    t_use: float = 0.0
    hidden: bool = False
    t_kernel: float = 0.0
    refused: str = ""

    @property
    def label(self) -> str:
        if self.refused:
            return f"S={self.stages} refused: {self.refused}"
        how = "load hidden" if self.hidden else "load-bound"
        return (
            f"S={self.stages}: {self.shared_bytes} B shared, {self.blocks_per_sm} block(s)/SM, "
            f"T_load {self.t_load:.0f} vs (S x N_mplx - 1) x T_use "
            f"{(self.stages * self.blocks_per_sm - 1) * self.t_use:.0f} cycles ({how}), "
            f"kernel {self.t_kernel:.0f} cycles"
        )


@dataclass(frozen=True)
class StageChoice:
    """The chosen stage count and the reasons (one per candidate, the choice first)."""

    stages: int
    reason: str
    candidates: tuple[StageCandidate, ...] = field(default=())

    @property
    def notes(self) -> list[str]:
        return [self.reason] + [c.label for c in self.candidates]


def pipeline_latency(t_load: float, t_use: float, n_loop: int, n_pipe: int, n_mplx: int) -> float:
    """ALCOP's PipelineLatencyModel (Table I): a load-use loop's steady-state time."""
    if t_load <= (n_pipe * n_mplx - 1) * t_use:
        return t_use * n_loop
    return (t_load + t_use) * n_loop / n_pipe


def _candidate(p: StageProblem, s: int, device: DeviceSpec) -> StageCandidate:
    smem = p.stage_bytes * s
    budget = p.shared_budget or gemm_tile_budget(device)
    if smem > budget:
        return StageCandidate(
            s, smem, refused=f"{s} x {p.stage_bytes} B = {smem} B > {budget} B budget"
        )
    if s > p.ktiles:
        return StageCandidate(s, smem, refused=f"more stages than the {p.ktiles} k-tiles")
    occ = occupancy(device, p.threads, p.registers, smem).blocks_per_sm
    if occ < 1:
        return StageCandidate(s, smem, refused="no block of it fits one SM")
    mplx = max(1, min(occ, -(-p.blocks // device.sms)))
    batch = min(p.blocks, device.sms * mplx)
    clock = device.sustained_clock_mhz * 1e6
    t_use = p.use_cycles or p.fma_per_ktile / (device.fp32_lanes_per_sm * SGEMM_FFMA_SHARE)
    l2 = L2_LATENCY_CYCLES + p.stage_bytes * batch / (device.l2_gbps * 1e9 / clock)
    dram_share = p.dram_bytes * min(1.0, batch / p.blocks) / p.ktiles
    dram = DRAM_LATENCY_CYCLES + dram_share / (device.bandwidth_gbps * 1e9 / clock)
    t_load = max(l2, dram)
    loop = pipeline_latency(t_load, t_use, p.ktiles, s, mplx)
    batches = math.ceil(p.blocks / batch)
    return StageCandidate(
        s,
        smem,
        mplx,
        t_load,
        t_use,
        t_load <= (s * mplx - 1) * t_use,
        (t_load + loop) * batches,
    )


def choose_stages(p: StageProblem, device: DeviceSpec, forced: int | None = None) -> StageChoice:
    """The stage count of ``p`` on ``device`` (see the module doc); ``forced`` (2..4) is taken
    when it fits the budget, else the largest fitting count below it, the refusal recorded.
    Returns 1 stage when not even two stages fit."""
    cands = tuple(_candidate(p, s, device) for s in range(2, MAX_STAGES + 1))
    # a forced count may exceed the k-tiles (tests); only the budget refuses it
    fit = [c for c in cands if not c.refused or (forced and c.refused.startswith("more"))]
    if forced is not None:
        if not 1 <= forced <= MAX_STAGES:
            raise ValueError(f"gemm_stages={forced}: pipelined GEMMs take 1 to {MAX_STAGES}")
        if forced == 1:
            return StageChoice(1, "1 stage (forced): single-buffered shared tiles", cands)
        ok = [c for c in fit if c.stages <= forced and not c.refused.startswith("no block")]
        if not ok:
            return StageChoice(1, f"{forced} stages forced but none fits: 1 stage", cands)
        best = max(ok, key=lambda c: c.stages)
        why = (
            f"{forced} stages (forced)"
            if best.stages == forced
            else (f"{forced} stages forced, refused ({cands[forced - 2].refused}): {best.stages}")
        )
        return StageChoice(best.stages, why, cands)
    ok = [c for c in cands if not c.refused]
    if not ok:
        return StageChoice(1, "single-buffered: " + "; ".join(c.label for c in cands), cands)
    more = -1 if p.more_stages_on_ties else 1
    best = min(ok, key=lambda c: (round(c.t_kernel), more * c.stages))
    how = "its load is hidden" if best.hidden else "the loop stays load-bound; fewer stages wait"
    return StageChoice(
        best.stages,
        f"{best.stages} stages by ALCOP's latency model: least modelled time "
        f"({best.t_kernel:.0f} cycles), {how}",
        cands,
    )
