"""The launch-shape cost model for reduction kernels (one place, documented thresholds).

Policy, per canonical form (see :mod:`polyfuse.poly.canonical`):

- **y-reduce** (rows kept, each row reduced). Short rows (at most ``warp_row_max`` elements)
  get a warp per row and several rows per block, combined with warp shuffles only; longer rows
  get a block per row whose lanes stride the row (coalesced), combined with warp shuffles and
  then shared memory across warps. The block size is the power of two that leaves each thread
  about ``elems_per_thread`` elements, within [64, max threads].
- **x-reduce** (columns kept, the outer dimension reduced). Threads along the kept dimension
  (coalesced) and ``x_rows`` thread rows splitting the reduced dimension, combined through a
  shared-memory tree. The kept tile must divide the kept extent (no partial tiles, so every
  thread reaches the combine's barriers).
- **all-reduce**: one block whose lanes stride the whole domain.

A reduction where some thread would still loop over more than ``max_serial`` elements, or an
all-reduce over more than ``all_single_block`` elements, is split into two stages first
(:mod:`polyfuse.poly.split`).
Modelled times of these layouts, where a decision needs them (two-stage reductions), come from
the one cost model (:mod:`polyfuse.poly.costs`); none is a measurement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from polyfuse.base.decision import Decided, DecisionKind
from polyfuse.base.decision_data import ReductionLayoutData
from polyfuse.poly.canonical import CanonicalForm
from polyfuse.poly.device import DeviceSpec
from polyfuse.poly.policy import MAX_THREADS_PER_BLOCK


@dataclass(frozen=True)
class ReductionConfig:
    """Thresholds of the reduction cost model."""

    warp_row_max: int = 256
    elems_per_thread: int = 4
    min_threads: int = 64
    max_threads: int = MAX_THREADS_PER_BLOCK
    block_threads: int = 256
    x_rows: int = 8
    #: an x reduction of at most this many reduced elements whose kept points alone fill every
    #: SM's resident threads sums them serially, one thread per kept point (lanes along so
    #: short a reduced dim would only add a combine through shared memory and a barrier)
    x_serial: int = 16
    max_serial: int = 256
    all_single_block: int = 65536  # larger all-reduces use many blocks (two stages)
    chunk: int = 16384  # elements per partial reduction of a split all-reduce


@dataclass(frozen=True)
class ReductionStrategy:
    """How a reduction kernel is laid out on the GPU."""

    form: CanonicalForm
    kept_tile: int  # kept points per block along the innermost kept dimension
    lanes: int  # threads cooperating on one kept point (across the reduced dimension)
    reason: str

    @property
    def threads(self) -> int:
        return self.kept_tile * self.lanes

    @property
    def lanes_fastest(self) -> bool:
        """y/all: lanes are the fast part of threadIdx (contiguous); x: kept points are."""
        return self.form.kind != "x"

    @property
    def combine(self) -> str:
        if self.form.kind == "x":
            return "shared-memory tree across thread rows"
        return "warp shuffles" if self.lanes <= 32 else "warp shuffles + shared memory"

    def serial_per_thread(self) -> int:
        return -(-self.form.reduced // self.lanes)

    @property
    def note(self) -> str:
        """The plan's note for this layout (prose for people; programs read :meth:`decision`)."""
        return f"reduction layout: {self}"

    def decision(self, blocks: int) -> Decided:
        """This layout as a typed record, for a kernel of ``blocks`` blocks; its reason is
        :attr:`note`, its data the numbers behind it."""
        data = ReductionLayoutData(
            str(self.form), self.kept_tile, self.lanes, self.threads, blocks, self.reason
        )
        return Decided((DecisionKind.COST_MODEL, DecisionKind.REDUCTION_LAYOUT), self.note, data)

    def __str__(self) -> str:
        return (
            f"{self.form}: {self.kept_tile} kept x {self.lanes} lanes = {self.threads} threads, "
            f"{self.serial_per_thread()} serial/thread, combine by {self.combine} ({self.reason})"
        )


def fit_kept_tile(
    strategy: ReductionStrategy, ranges: Sequence[tuple[int, int]]
) -> ReductionStrategy:
    """``strategy`` with its kept tile cut to tile each of the kept band's ``ranges`` exactly:
    the band's own, and that of each reduction's statements.

    An x-reduction combines across thread rows with block barriers, so a partial tile would
    put the combine under a thread guard (a divergent ``__syncthreads``). The form's kept
    extents come from the reduction's output axes; the band's range is the statement's, and
    the two differ when a layout fold stores the result through a permutation. A reduction
    whose statements cover only a part of the band (fused with a padding that widens it: the
    reduction's kept points 1..2 of a band 0..3, torch fuzz seed 7262) needs tiles aligned to
    its own range too, or some threads of a tile skip the combine. Other forms combine within
    a warp per kept point (or keep one point per block) and are returned as they are."""
    kt = strategy.kept_tile

    def tiles(d: int) -> bool:
        return all(lo % d == 0 and (hi + 1) % d == 0 for lo, hi in ranges)

    if strategy.form.kind != "x" or tiles(kt):
        return strategy
    fit = next(d for d in range(kt, 0, -1) if tiles(d))
    spans = ", ".join(f"[{lo}, {hi}]" for lo, hi in ranges)
    why = f"{strategy.reason}; kept tile {fit}, not {kt}, tiles the kept ranges {spans}"
    return replace(strategy, kept_tile=fit, reason=why)


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _pow2_at_most(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def choose_reduction_strategy(
    form: CanonicalForm, device: DeviceSpec, cfg: ReductionConfig | None = None
) -> ReductionStrategy:
    """Pick the launch shape of a reduction kernel of canonical form ``form``."""
    cfg = cfg or ReductionConfig()
    maxt = min(cfg.max_threads, device.max_threads_per_block)
    n = form.reduced
    inner_kept = form.kept[-1] if form.kept else 1
    if form.kind == "x":
        wide = next((d for d in (256, 128) if d <= maxt and inner_kept % d == 0), 0)
        resident = device.sms * device.max_threads_per_sm  # threads of one full wave
        if wide and n <= cfg.x_serial and form.kept_extent >= resident:
            why = (
                f"threads along the kept dimension, each reducing its {n} elements "
                f"alone: {form.kept_extent} kept points fill the SMs without lanes to combine"
            )
            return ReductionStrategy(form, wide, 1, why)
        if inner_kept <= 32:
            kt = inner_kept
        else:
            kt = next((d for d in range(32, 7, -1) if inner_kept % d == 0), inner_kept)
            if kt > maxt // 2:
                kt = 1
        rows = max(1, min(_pow2_at_most(max(1, cfg.block_threads // kt)), _pow2_at_least(n)))
        return ReductionStrategy(form, kt, rows, "threads along the kept dimension")
    if form.kind == "y" and n <= cfg.warp_row_max:
        rows = min(cfg.block_threads // 32, _pow2_at_most(inner_kept))
        why = f"short rows (<= {cfg.warp_row_max}): warp per row"
        return ReductionStrategy(form, rows, 32, why)
    lanes = _pow2_at_least(-(-n // cfg.elems_per_thread))
    lanes = max(cfg.min_threads, min(maxt, lanes))
    why = "block per row" if form.kind == "y" else "one block strides the whole domain"
    return ReductionStrategy(form, 1, lanes, why)


def lanes_over_runs(
    st: ReductionStrategy, run: int, cfg: ReductionConfig | None = None
) -> ReductionStrategy:
    """The strategy when every lane takes runs of ``run`` consecutive elements
    (:mod:`polyfuse.poly.lane_vector`): a block-per-row layout keeps its lanes (so its block
    size, occupancy and waves) unless the row has fewer runs than lanes, then the power of two
    covering the runs (at least ``min_threads``); a warp per row keeps its 32 lanes (the
    combine is by shuffles only). Fewer, longer-running lanes were tried: the time model's
    last wave then runs nearly empty (e.g. softmax 4096 rows of 64 threads: 1.03 waves)."""
    cfg = cfg or ReductionConfig()
    if st.form.kind == "x" or st.lanes <= 32:
        return st
    runs = -(-st.form.reduced // run)
    lanes = max(cfg.min_threads, min(st.lanes, _pow2_at_least(runs)))
    if lanes == st.lanes:
        return st
    why = f"{st.reason}, {run}-element runs per lane"
    return replace(st, lanes=lanes, reason=why)
