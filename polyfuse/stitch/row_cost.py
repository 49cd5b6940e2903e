"""The cost decision of the GEMM + row-reduction stitch (rule 9, :mod:`polyfuse.stitch.gemm_rows`).

Stitching a GEMM with the row reduction that reads its output changes three things, and the
decision weighs exactly these (every figure *modelled*, on the one cost model):

- **the GEMM's tile**: one block must compute whole rows (``BN >= N``), so the GEMM runs with
  the cheapest whole-row tile instead of its best tile. The difference, ``extra_us`` =
  whole-row tile's time - best tile's time, is what the stitch costs. A whole-row tile gives
  the grid ``ceil(M / BM)`` blocks and every block streams the whole ``K x N`` weight, so on a
  wide row it is the number of blocks against the SMs (and the padding of ``N`` to the tile)
  that makes it dear: the record keeps both tiles' blocks, waves and bound to say so;
- **the intermediate**: it no longer goes to DRAM and back (written once by the GEMM, read
  once by the reduction kernel): ``dram_us`` = twice its bytes at the device's bandwidth;
- **a launch**: the reduction kernel's (``launch_us``).

The reduction's own work (its other reads, its combines, its stores) is done in both plans;
only where it reads the intermediate from changes, which ``dram_us`` already prices. So the
stitch saves ``saved_us = dram_us + launch_us`` and is taken when ``gain_us = saved_us -
extra_us`` is positive. Ties are refused (nothing is gained by a stitch that costs as much as
it saves, and the separate kernels keep their best tiles). The comparison leans towards the
stitch: joined, the reduction runs on the GEMM's grid after each block's k-loop rather than on
its own (often larger) grid, which this does not charge.

BERT-base's FFN down projection (1024 x 3072 x 768, then add + layer norm) on an A100 shows
why a wide row is refused: the best whole-row tile, 16x1024 (the row padded to a power of
two), gives 64 blocks of 16,384 outputs; the best tile, 64x128, 96 blocks of 8,192 — the
busiest SM does twice the FP32 work (659.6 vs 339.8 us modelled) to save 6.45 us.
"""

from __future__ import annotations

from dataclasses import dataclass

from polyfuse.base.decision import Decided, DecisionKind
from polyfuse.base.decision_data import RowStitchData
from polyfuse.poly.costs import model_kernel
from polyfuse.poly.costs.constants import CONSTANTS
from polyfuse.poly.device import DeviceSpec
from polyfuse.poly.gemm_shape import GemmTiling

Tile = tuple[int, int, int, int, int]


@dataclass(frozen=True)
class TilePrice:
    """One GEMM tiling as the cost model prices it: the tile (BM, BN, TM, TN, TK), the
    modelled time, what bounds it, its blocks and waves (blocks over the resident blocks of
    all SMs), and the outputs the busiest SM computes (``ceil(blocks / SMs)`` block tiles,
    padding included: what an FP32-bound tile's time follows)."""

    tile: Tile
    us: float
    bound: str
    blocks: int
    waves: float
    sm_outputs: int
    #: a tensorized tile: (BM, BN, warps along M, warps along N, k-tile)
    tensor_cores: bool = False

    @classmethod
    def of(cls, tiling: GemmTiling, device: DeviceSpec) -> TilePrice:
        """The price of a ranked ``tiling`` (:func:`polyfuse.poly.tiling.rank_gemm_tiles`)."""
        assert tiling.choice is not None and tiling.estimate is not None
        m = model_kernel(tiling.estimate, device)
        bm, bn, tm, tn, tk = tiling.choice
        blocks = tiling.estimate.blocks
        sm_outputs = -(-blocks // device.sms) * bm * bn
        return cls((bm, bn, tm, tn, tk), tiling.modelled_us, m.bound, blocks, m.waves, sm_outputs)

    def label(self) -> str:
        bm, bn, tm, tn, tk = self.tile
        if self.tensor_cores:
            return (
                f"{bm}x{bn} on tensor cores ({tm}x{tn} warps, k-tile {tk}; {self.blocks} "
                f"blocks, {self.waves:.2f} waves, {self.sm_outputs} outputs on the busiest SM, "
                f"{self.bound}-bound) modelled {self.us:.2f} us"
            )
        return (
            f"{bm}x{bn} (micro-tile {tm}x{tn}, k-tile {tk}; {self.blocks} blocks, "
            f"{self.waves:.2f} waves, {self.sm_outputs} outputs on the busiest SM, "
            f"{self.bound}-bound) modelled {self.us:.2f} us"
        )


@dataclass(frozen=True)
class RowStitchCost:
    """The numbers the stitch decision compares (module doc) and the decision."""

    tensor: str  # the GEMM output the reduction reads
    rows: TilePrice  # the whole-row tile
    best: TilePrice  # the GEMM's best tile
    size: int  # bytes of ``tensor``
    dram_us: float  # ``tensor`` written to DRAM once and read back once
    launch_us: float  # the reduction kernel's launch

    @property
    def saved_us(self) -> float:
        return self.dram_us + self.launch_us

    @property
    def extra_us(self) -> float:
        return self.rows.us - self.best.us

    @property
    def gain_us(self) -> float:
        return self.saved_us - self.extra_us

    @property
    def taken(self) -> bool:
        return self.gain_us > 0

    def figures(self) -> str:
        """Both tiles and what the stitch saves, in words (the decision's reason)."""
        return (
            f"whole-row tile {self.rows.label()} vs best tile {self.best.label()}: "
            f"{self.extra_us:+.2f} us; keeping {self.tensor} on chip saves {2 * self.size} B "
            f"of DRAM traffic ({self.dram_us:.2f} us) and a launch ({self.launch_us:.2f} us), "
            f"modelled {self.saved_us:.2f} us: gain {self.gain_us:+.2f} us"
        )

    def data(self) -> RowStitchData:
        """The figures as the decision's typed data (``as_dict()``: JSON-ready)."""
        r, b = self.rows, self.best
        return RowStitchData(
            tile=list(r.tile),
            rows_tile_us=round(r.us, 3),
            rows_bound=r.bound,
            rows_blocks=r.blocks,
            rows_waves=round(r.waves, 3),
            rows_sm_outputs=r.sm_outputs,
            best_tile=list(b.tile),
            best_tile_us=round(b.us, 3),
            best_bound=b.bound,
            best_blocks=b.blocks,
            best_waves=round(b.waves, 3),
            best_sm_outputs=b.sm_outputs,
            extra_us=round(self.extra_us, 3),
            saved_bytes=2 * self.size,
            dram_us=round(self.dram_us, 3),
            launch_us=round(self.launch_us, 3),
            saved_us=round(self.saved_us, 3),
            gain_us=round(self.gain_us, 3),
            tensor_cores=True if r.tensor_cores else None,
        )

    @property
    def record(self) -> Decided:
        """The cost model's verdict as the one decision record (subject: the tensor kept on
        chip; made: taken)."""
        kinds = (DecisionKind.COST_MODEL,)
        return Decided(kinds, self.figures(), self.data(), (self.tensor,), self.taken)


def row_stitch_cost(
    tensor: str, rows: TilePrice, best: TilePrice, size: int, device: DeviceSpec
) -> RowStitchCost:
    """The decision for keeping ``tensor`` (``size`` bytes) on chip with the whole-row tile
    ``rows`` instead of the best tile ``best``, on ``device``."""
    dram_us = 2 * size / (device.bandwidth_gbps * 1e3)
    return RowStitchCost(tensor, rows, best, size, dram_us, CONSTANTS.launch_us)
