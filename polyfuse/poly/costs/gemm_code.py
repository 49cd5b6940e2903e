"""The loop code a GEMM tiling will get, described before the kernel exists.

:func:`polyfuse.poly.tiling.rank_gemm_tiles` prices every candidate tiling; the kernel is built
for one of them only. So that the price follows the code the passes generate (issue 20 item
2) rather than the tile sizes alone, :func:`loop_code` works out, for one candidate
(:class:`TileLayout`: block tile, threads and k-tile per dimension, after the fold of
:mod:`polyfuse.poly.tile_fit`), what those passes will emit — by the passes' own decision
functions where they are pure (:mod:`polyfuse.poly.gemm_loops`: ``unrolled_steps``,
``kept_unroll_factor``, ``launch_bound``; :func:`polyfuse.poly.copy_layout.thread_extents`)
and by the same arithmetic on each operand's affine subscripts (:class:`Operand`) where they
ask isl:

1. **Shared tiles** (:mod:`polyfuse.poly.promote`, :mod:`polyfuse.poly.tile_box`): each
   operand's per-block k-tile footprint box (per array dim, the span of its subscript over the
   block tile and the k-tile), its dims covered whole merged with the one outside them, the
   row widened to start on a 16-byte boundary where the start's residue is the same in every
   block, rows padded by a vector when a multiple of 32 words; copied as float4 where the row
   is whole vectors, aligned and without holes; copies per thread from the copy layout's
   thread grid; a bounds check on each copy when the box may leave the array (conv padding,
   partial tiles). A subscript known only within bounds (:attr:`Operand.slack`: a grouped
   conv's input channel) widens its box by the slack, within the array, and keeps the copy
   scalar: an upper estimate of isl's box. Double-buffered (``stages``) where both stages
   fit the GEMM budget.
2. **Unrolled reduction steps** (:mod:`polyfuse.poly.gemm_loops`): the ``kk`` loops unrolled
   within :data:`~polyfuse.poly.gemm_loops.UNROLL_FMA_LIMIT` multiply-adds, the next loop out
   by a factor; the loop iterations left per k-tile (:attr:`LoopCode.bodies`).
3. **Fragment loads**: the distinct shared words one thread reads in one unrolled body — its
   micro-tile (cyclic over the threads, runs of 4 columns with vector stores) times the body's
   steps, through each operand's subscripts into the tile — grouped as ptxas does into 128-,
   64- and 32-bit loads: consecutive words whose first is a multiple of the vector in the tile
   and whose run-time offset (the thread's coordinates, the kept loop's counter, the stage)
   is one too.
4. **Launch bounds** and occupancy: the registers the micro-tile is estimated at and the
   blocks per SM they allow (:func:`~polyfuse.poly.gemm_loops.launch_bound`).

The slots of the k-tile loop around them (barriers, the copies' addresses, the loop counter)
are priced by :func:`polyfuse.poly.costs.gemm.gemm_tile_desc`; the tile estimate is checked
against the SASS of generated kernels by ``python benchmarks/tile_check.py``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from polyfuse.poly.copy_layout import copies_per_thread, thread_extents
from polyfuse.poly.device import DeviceSpec
from polyfuse.poly.gemm_loops import (
    kept_unroll_factor,
    launch_bound,
    tile_registers,
    unbounded_registers,
    unrolled_steps,
)
from polyfuse.poly.policy import FLOAT_BYTES, gemm_tile_budget
from polyfuse.poly.vectorize import VECTOR_WIDTH

#: banks of shared memory (32-bit words): rows of a multiple of this are padded
BANKS = 32


#: :attr:`Operand.periods` of an affine subscript
NO_PERIOD = (-1, 0, 0)


@dataclass(frozen=True)
class Operand:
    """One operand the update reads, as the tile estimate sees it: the array's shape and, per
    array dim, its affine subscript over the update's dims (data dims, then reduction dims) as
    coefficients and a constant; ``rows`` empty when a subscript is not affine. ``slack``
    per array dim (empty: all 0): a subscript that is no affine function (a grouped conv's
    input channel, a division) lies between its row minus the slack and its row. ``periods``
    per array dim (empty: none): ``(j, D, e)`` where the subscript is its row plus
    ``e * floor(x_j / D)`` (a reshape's ``k // D``, ``k % D``): exact in a tile of ``x_j``
    inside one period; :data:`NO_PERIOD` for the others."""

    name: str
    shape: tuple[int, ...]
    rows: tuple[tuple[tuple[int, ...], int], ...] = ()
    slack: tuple[int, ...] = ()
    periods: tuple[tuple[int, int, int], ...] = ()

    def periodic(self, a: int) -> bool:
        """Whether array dim ``a``'s subscript is periodic (see the class doc)."""
        return bool(self.periods) and self.periods[a][0] >= 0

    def within_periods(self, extent: tuple[int, ...]) -> bool:
        """Whether tiles of ``extent`` (per update dim, from 0) stay inside one period of
        every periodic subscript, where its row is exact."""
        return all(j < 0 or d % extent[j] == 0 for j, d, _ in self.periods)


@dataclass(frozen=True)
class TileLayout:
    """A candidate tiling per dimension: block tile and threads per data dim, k-tile per
    reduction dim, and the pipeline stages the arch allows (2 with cp.async)."""

    block: tuple[int, ...]
    threads: tuple[int, ...]
    tk: tuple[int, ...]
    stages: int = 1

    @property
    def regs(self) -> tuple[int, ...]:
        return tuple(b // t for b, t in zip(self.block, self.threads, strict=True))


@dataclass(frozen=True)
class TileCopy:
    """One operand's shared tile: its box (in the copy's view), floats per stage (rows
    padded), the copy's vector width, copies per thread per k-tile, and whether each copy
    checks the array's bounds."""

    tensor: str
    size: tuple[int, ...]
    floats: int
    width: int
    copies: int
    guarded: bool
    #: bytes of 128-byte lines one warp's copy touches beyond the bytes it moves (rows of
    #: the box shorter than the warp's lanes along them, each a partly used line)
    line_waste: int = 0


@dataclass(frozen=True)
class LoopCode:
    """What the code generator will emit for one candidate (see the module doc); counts are
    per thread and k-tile unless said otherwise."""

    blocks: int
    threads: int
    accumulators: int
    #: the micro-tile as rows x columns (columns: the accumulators along the last data dim)
    micro: tuple[int, int]
    steps: int  # reduction steps per k-tile (padded)
    ktiles: int
    stages: int
    vector_stores: bool
    tiles: tuple[TileCopy, ...]
    #: shared loads of the operand fragments by vector width in words ({4: LDS.128, ...})
    fragment_loads: dict[int, int]
    #: the same with every window operand's words loaded one by one: how far NVRTC's merging
    #: of window loads may fall short (a strided conv's input: merged for one run of columns
    #: per thread, partly for two, in the SASS measured)
    fragment_loads_worst: dict[int, int]
    #: shared-memory wavefronts of one warp's fragment loads (128 bytes each): a ``w``-word
    #: load takes ``w``, more where distinct words of one phase's lanes share a bank
    fragment_wavefronts: int
    fragment_wavefronts_worst: int
    body_steps: int  # reduction steps per unrolled body
    bodies: int  # unrolled bodies per k-tile: iterations of the loops kept (1: none)
    registers: int  # per thread: the launch bounds' cap, else what ptxas takes unbounded
    min_blocks: int  # __launch_bounds__ blocks per SM (0: no bound)
    register_cap: int
    padding: float  # share of the multiply-adds on padding (data and reduction)
    guarded_outputs: bool  # the epilogue checks each output against the extents
    notes: tuple[str, ...] = field(default=())

    @property
    def shared_floats(self) -> int:
        """Floats of one stage of all shared tiles."""
        return sum(t.floats for t in self.tiles)

    @property
    def shared_bytes(self) -> int:
        return FLOAT_BYTES * self.shared_floats * self.stages

    @property
    def copies(self) -> int:
        return sum(t.copies for t in self.tiles)

    @property
    def fill_bytes(self) -> float:
        """Global bytes one thread copies into the shared tiles per k-tile."""
        return float(sum(t.copies * t.width for t in self.tiles) * FLOAT_BYTES)

    @property
    def block_fill_bytes(self) -> int:
        """Global bytes one block copies per k-tile (every element of every box once)."""
        return FLOAT_BYTES * sum(math.prod(t.size) for t in self.tiles)

    @property
    def block_bypass_bytes(self) -> int:
        """Of :attr:`block_fill_bytes`, those copied by 16-byte ``cp.async`` (float4 tiles of
        a pipelined loop: ``__pipeline_memcpy_async`` of 16 bytes is ``cp.async.cg``, SASS
        ``LDGSTS.E.BYPASS.128``), which bypass the L1."""
        if self.stages < 2:
            return 0
        return FLOAT_BYTES * sum(math.prod(t.size) for t in self.tiles if t.width == VECTOR_WIDTH)

    @property
    def line_waste(self) -> float:
        """L1 bytes per thread and k-tile beyond the copied bytes (partly used lines)."""
        return sum(t.copies * t.line_waste for t in self.tiles) / 32

    @property
    def fragment_instructions(self) -> int:
        return sum(self.fragment_loads.values())

    @property
    def fragment_bytes(self) -> int:
        """Shared bytes per thread the fragment loads cost: a warp's wavefronts of 128 bytes
        over its 32 lanes (a conflict-free 128-bit load: 16 bytes a lane)."""
        return 4 * self.fragment_wavefronts


def _span(coef: int, n: int) -> tuple[int, int]:
    """(min, max) of ``coef * x`` over ``0 <= x < n``."""
    a, b = 0, coef * (n - 1)
    return min(a, b), max(a, b)


def _values(terms: list[tuple[int, int]]) -> np.ndarray:
    """The distinct values of ``sum coef * x_i`` over ``0 <= x_i < n_i`` (``terms``: the
    (coef, n) pairs)."""
    return _distinct_sums(tuple((c, n) for c, n in terms if c and n > 1))


@functools.lru_cache(maxsize=4096)
def _distinct_sums(terms: tuple[tuple[int, int], ...]) -> np.ndarray:
    v = np.zeros(1, dtype=np.int64)
    for c, n in terms:
        v = np.unique((v[:, None] + c * np.arange(n)[None, :]).ravel())
    v.setflags(write=False)  # shared between callers
    return v


def _vector_groups(addresses: np.ndarray, align: int) -> list[tuple[int, int]]:
    """Loads of the distinct ``addresses`` (words) as ``(first word, width)``, grouped into
    vectors of 4, 2, 1 words: ``w`` consecutive words whose first is a multiple of ``w``, with
    a run-time offset that is a multiple of ``align`` (at least ``w``)."""
    left = np.unique(addresses)
    if not len(left):
        return []
    lo = int(left[0]) - int(left[0]) % 4  # a multiple of 4: w-alignment is kept in the mask
    present = np.zeros(int(left[-1]) - lo + 4, dtype=bool)  # the words not yet loaded
    present[left - lo] = True
    out: list[tuple[int, int]] = []
    for w in (4, 2):
        if align % w or int(present.sum()) < w:
            continue
        # w-aligned runs of w words all present (runs are disjoint: each starts on a multiple)
        whole = present[: len(present) // w * w].reshape(-1, w).all(axis=1)
        starts = np.nonzero(whole)[0] * w
        if len(starts):
            present[(starts[:, None] + np.arange(w)[None, :]).ravel()] = False
            out += [(int(a) + lo, w) for a in starts]
    return out + [(int(a) + lo, 1) for a in np.nonzero(present)[0]]


def _wavefronts(loads: list[tuple[int, int]], lanes: np.ndarray) -> int:
    """Shared-memory wavefronts of ``loads`` (first word, width ``w``) issued by a warp whose
    lanes add ``lanes`` (words) to each address. A ``w``-word load is served in ``w`` phases
    of ``32 / w`` lanes (quarter-warps for 128 bits), each one wavefront unless distinct words
    of its lanes fall in one of the 32 banks (lanes reading one word share it); without such
    conflicts, ``w`` wavefronts: the bytes the load moves."""
    key = tuple(lanes.tolist())
    kinds: dict[tuple[int, int], int] = {}
    for a, w in loads:
        kinds[(a % BANKS, w)] = kinds.get((a % BANKS, w), 0) + 1
    return sum(n * _load_wavefronts(bank, w, key) for (bank, w), n in kinds.items())


@functools.lru_cache(maxsize=65536)
def _load_wavefronts(bank: int, w: int, lanes: tuple[int, ...]) -> int:
    """Wavefronts of one ``w``-word load at ``bank`` (see :func:`_wavefronts`)."""
    n = 0
    for phase in np.asarray(lanes, dtype=np.int64).reshape(w, -1):
        words = np.unique((bank + phase[:, None] + np.arange(w)[None, :]).ravel())
        n += int(np.bincount(words % BANKS, minlength=BANKS).max())
    return n


@functools.lru_cache(maxsize=16384)
def loop_code(
    operands: tuple[Operand, ...],
    data: tuple[int, ...],
    red: tuple[int, ...],
    lay: TileLayout,
    micro: tuple[int, int],
    device: DeviceSpec,
) -> LoopCode:
    """The loop code of ``lay`` for an update over ``data`` x ``red`` (extents) reading
    ``operands``; ``micro``: its micro-tile as rows x columns (see the module doc).

    A pure function of its (hashable) arguments, memoized: a compile ranks up to 345 tilings
    of each GEMM-like micrograph, several times over (stitching, recompute, the partitioner's
    rounds), and a process compiles the same micrographs again (a zoo, a test run). The
    result is shared between callers and must not be changed."""
    nd, nr = len(data), len(red)
    regs = lay.regs
    grid = [-(-e // b) for e, b in zip(data, lay.block, strict=True)]
    ktile = [-(-e // k) for e, k in zip(red, lay.tk, strict=True)]
    acc = math.prod(regs)
    steps = math.prod(lay.tk)
    threads = math.prod(lay.threads)
    n = nd - 1
    vw = VECTOR_WIDTH if regs[n] % VECTOR_WIDTH == 0 and lay.block[n] % 4 == 0 else 1
    vw = vw if data[n] % VECTOR_WIDTH == 0 else 1
    notes: list[str] = []
    # the update's loops over one block tile and k-tile: (extent) per dim, data then red
    extent = list(lay.block) + list(lay.tk)
    padded = [g * b for g, b in zip(grid, lay.block, strict=True)]
    padded += [k * t for k, t in zip(ktile, lay.tk, strict=True)]
    # 2. unrolled steps and the loops kept
    unrolled, kept = unrolled_steps(list(lay.tk), acc)
    body = [lay.tk[j] if j in unrolled else 1 for j in range(nr)]
    if kept:
        j = kept[-1]
        body[j] = kept_unroll_factor(lay.tk[j], acc * math.prod(body))
    body_steps = math.prod(body)
    bodies = steps // body_steps
    # 1. shared tiles (one stage each; the stages follow once their size is known)
    # an operand no reduction dim indexes is loaded into registers once, before the loop
    tiled_ops = tuple(
        op
        for op in operands
        if not op.rows
        or any(any(c[nd:]) for c, _ in op.rows)
        or any(j >= nd for j, _, _ in op.periods)
    )
    boxes = [
        _box(op, tuple(extent), tuple(padded), tuple(grid), tuple(ktile), nd, threads)
        for op in tiled_ops
    ]
    floats = sum(b[0].floats for b in boxes)
    stages = lay.stages
    if FLOAT_BYTES * floats * stages > gemm_tile_budget(device):
        stages = 1  # both stages do not fit: single-buffered (poly/kernel_map.py)
    if stages > 1 and sum(k > 1 for k in ktile) != 1:
        stages = 1  # nothing to overlap, or k-tiles over several loops (poly/promote.py)
    # 3. fragment loads per unrolled body, then per k-tile
    frag: dict[int, int] = {}
    worst: dict[int, int] = {}
    waves = [0, 0]
    for op, (tile, view) in zip(tiled_ops, boxes, strict=True):
        got = _fragment_loads(
            op, view, tile.floats if stages > 1 else 0, lay.regs, lay.threads, len(lay.tk), vw,
            tuple(body), tuple(kept), stages, nd,
        )  # fmt: skip
        for counts, into in ((got.widths, frag), (got.worst, worst)):
            for w, c in counts.items():
                into[w] = into.get(w, 0) + c * bodies
        waves[0] += got.wavefronts * bodies
        waves[1] += got.worst_wavefronts * bodies
    # 4. registers and launch bounds
    sync = stages == 1 and bool(tiled_ops)
    est = tile_registers(*micro, sync)
    min_blocks, cap = launch_bound(
        threads, est, FLOAT_BYTES * floats * stages, device, math.prod(grid)
    )
    taken = cap if min_blocks else unbounded_registers(*micro, sync)
    useful = math.prod(data) * math.prod(red)
    waste = 1 - useful / math.prod(padded)
    return LoopCode(
        blocks=math.prod(grid),
        threads=threads,
        accumulators=acc,
        micro=micro,
        steps=steps,
        ktiles=math.prod(ktile),
        stages=stages,
        vector_stores=vw > 1,
        tiles=tuple(b[0] for b in boxes),
        fragment_loads=frag,
        fragment_loads_worst=worst,
        fragment_wavefronts=waves[0],
        fragment_wavefronts_worst=waves[1],
        body_steps=body_steps,
        bodies=bodies,
        registers=taken,
        min_blocks=min_blocks,
        register_cap=cap,
        padding=waste,
        guarded_outputs=any(p > e for p, e in zip(padded, data, strict=False)),
        notes=tuple(notes),
    )


@dataclass(frozen=True)
class _View:
    """A shared tile's layout: per array dim its view group, the box's lower bound at block
    and k-tile 0, and the word stride of each view dim."""

    groups: tuple[tuple[int, ...], ...]
    lo: tuple[int, ...]
    strides: tuple[int, ...]
    shape: tuple[int, ...]  # the array's

    def coefficient(self, row: int) -> int:
        """Words in the tile per unit of array dim ``row``."""
        return self._coefficients[row]

    @functools.cached_property
    def _coefficients(self) -> tuple[int, ...]:
        out = {}
        for g, stride in zip(self.groups, self.strides, strict=True):
            for i, row in enumerate(g):
                out[row] = stride * math.prod(self.shape[a] for a in g[i + 1 :])
        return tuple(out[row] for row in range(len(self.shape)))


@functools.lru_cache(maxsize=16384)
def _box(
    op: Operand,
    extent: tuple[int, ...],
    padded: tuple[int, ...],
    grid: tuple[int, ...],
    ktile: tuple[int, ...],
    nd: int,
    threads: int,
) -> tuple[TileCopy, _View | None]:
    """``op``'s shared tile for one block tile and k-tile (see the module doc, 1). Memoized
    (pure; the candidates of one GEMM share an operand's box where they share its tile)."""
    if not op.rows or not op.within_periods(extent):
        # subscripts not affine (or a tile across a reshape's period): the box of its dims'
        # extents, copied in scalars
        size = (math.prod(extent),)
        copies = -(-size[0] // threads)
        return TileCopy(op.name, size, size[0], 1, copies, True), None
    tiled = [g > 1 for g in grid] + [k > 1 for k in ktile]
    size, lo, whole, guarded, holes = [], [], [], False, False
    for a, (coef, const) in enumerate(op.rows):
        slack = op.slack[a] if op.slack else 0
        spans = [_span(c, e) for c, e in zip(coef, extent, strict=True)]
        # a bounded subscript (slack > 0): its box reaches the slack below the row's span,
        # within the array (the array's extent bounds what isl's footprint can be)
        lo_a = const + sum(s[0] for s in spans) - slack
        size.append(sum(s[1] - s[0] for s in spans) + 1 + slack)
        if slack and size[-1] >= op.shape[a]:
            lo_a, size[-1] = 0, op.shape[a]
        lo.append(lo_a)
        moving = [c for c, t in zip(coef, tiled, strict=True) if c and t]
        if op.periodic(a) and tiled[op.periods[a][0]]:
            moving.append(op.periods[a][2])  # the period's floor steps between tiles
        whole.append(not moving and lo_a == 0 and size[-1] == op.shape[a])
        if not op.periodic(a):  # a reshape's subscript stays inside the array
            full = [_span(c, e) for c, e in zip(coef, padded, strict=True)]
            if const + sum(s[0] for s in full) - slack < 0:
                guarded = True
            if const + sum(s[1] for s in full) >= op.shape[a]:
                guarded = True
        # a subscript that skips values inside its span (a strided conv's input), or one
        # known only within bounds: the footprint is not its box, and the copy stays scalar
        holes = holes or bool(slack)
        holes = holes or len(_values(list(zip(coef, extent, strict=True)))) < size[-1]
    # merged view: a dim the box covers whole joins the group of the dim outside it
    groups: list[list[int]] = []
    for a in range(len(size)):
        if groups and whole[a]:
            groups[-1].append(a)
        else:
            groups.append([a])
    vsize = [
        size[g[0]] * math.prod(op.shape[a] for a in g[1:]) for g in groups
    ]  # merged dims are whole: the outer one's box times the inner ones' extents
    vshape = [math.prod(op.shape[a] for a in g) for g in groups]
    last = groups[-1][0]
    # the start's residue: the same in every block and k-tile when the row's subscript moves
    # by whole vectors between them
    coef, const = op.rows[last]
    inner_mult = math.prod(op.shape[a] for a in groups[-1][1:])
    steps = [c * e * inner_mult for c, e, t in zip(coef, extent, tiled, strict=True) if c and t]
    if op.periodic(last) and tiled[op.periods[last][0]]:  # and by e where the period wraps
        steps.append(op.periods[last][2] * inner_mult)
    width = 1
    aligned_rows = vshape[-1] % VECTOR_WIDTH == 0
    same_residue = all(s % VECTOR_WIDTH == 0 for s in steps)
    shift = (lo[last] * inner_mult) % VECTOR_WIDTH
    if aligned_rows and same_residue and not holes and (inner_mult == 1 or not shift):
        if shift or vsize[-1] % VECTOR_WIDTH:  # widened to whole, aligned vectors
            lo[last] -= shift
            vsize[-1] = -(-(vsize[-1] + shift) // VECTOR_WIDTH) * VECTOR_WIDTH
        width = VECTOR_WIDTH
    rows = vsize[-1] + (width if len(vsize) >= 2 and vsize[-1] % BANKS == 0 else 0)
    strides = [0] * len(vsize)
    acc = 1
    for i in reversed(range(len(vsize))):
        strides[i] = acc
        acc *= rows if i == len(vsize) - 1 else vsize[i]
    floats = acc
    per_dim = thread_extents(vsize, width, threads)
    copies = copies_per_thread(vsize, width, per_dim)
    tile = TileCopy(
        op.name, tuple(vsize), floats, width, copies, guarded, _line_waste(per_dim[-1], width)
    )
    return tile, _View(tuple(tuple(g) for g in groups), tuple(lo), tuple(strides), op.shape)


def _line_waste(along: int, width: int, line: int = 128, warp: int = 32) -> int:
    """Bytes of 128-byte lines beyond the bytes moved when a warp's lanes copy rows ``along``
    lanes at a time, ``width`` words each (rows start on a line when whole lines long)."""
    lanes = max(1, min(warp, along))
    segment = lanes * width * FLOAT_BYTES
    lines = -(-segment // line) * (warp // lanes)
    return max(0, lines * line - warp * width * FLOAT_BYTES)


def _window(op: Operand, nd: int) -> bool:
    """Whether ``op``'s innermost subscript slides over a data dim and a reduction dim (a
    conv's input row, ``s * ow + kw``): each step reads the fragment shifted."""
    if not op.rows:
        return False
    coef = op.rows[-1][0]
    return any(coef[:nd]) and any(coef[nd:])


@dataclass(frozen=True)
class _Loads:
    """One operand's fragment loads per unrolled body: instructions by width and the warp's
    shared-memory wavefronts, as NVRTC merges them and with window words one by one."""

    widths: dict[int, int]
    wavefronts: int
    worst: dict[int, int]
    worst_wavefronts: int


def _counts(loads: list[tuple[int, int]]) -> dict[int, int]:
    out: dict[int, int] = {}
    for _, w in loads:
        out[w] = out.get(w, 0) + 1
    return out


def _fragment_loads(
    op: Operand,
    view: _View | None,
    stage_floats: int,
    regs: tuple[int, ...],
    threads: tuple[int, ...],
    nr: int,
    vw: int,
    body: tuple[int, ...],
    kept: tuple[int, ...],
    stages: int,
    nd: int,
) -> _Loads:
    """Shared loads of ``op`` one thread issues per unrolled body (see the module doc, 3):
    ``regs`` and ``threads`` per data dim, ``nr`` reduction dims, ``stage_floats`` the floats
    of one stage of its tile."""
    if view is None:  # no affine subscripts: one scalar load per multiply-add
        n = math.prod(regs) * math.prod(body)
        return _Loads({1: n}, n, {1: n}, n)
    # the tile's words per unit of each update dim
    k = tuple(sum(view.coefficient(a) * op.rows[a][0][x] for a in range(len(op.rows)))
              for x in range(nd + nr))  # fmt: skip
    base = sum(view.coefficient(a) * (op.rows[a][1] - view.lo[a]) for a in range(len(op.rows)))
    coef = op.rows[-1][0]
    # a unit-stride window (a conv's input row, ow + kw): each step reads the run one word
    # further; NVRTC loads such fragments word by word (SASS of every stride-1 conv tiling
    # measured: LDS.32 only), whatever their alignment
    unit = any(c == 1 for c in coef[:nd]) and any(c == 1 for c in coef[nd:])
    # a dim the operand does not move along only repeats its words: keyed as one value, so
    # the candidates that differ in the other operand's tiling share this one's loads
    return _loads_of(
        k, base, tuple(r if k[d] else 1 for d, r in enumerate(regs)), threads,
        vw if k[nd - 1] else 1, tuple(b if k[nd + j] else 1 for j, b in enumerate(body)),
        tuple(j for j in kept if k[nd + j]), stage_floats if stages > 1 else 0, unit,
        _window(op, nd), nd,
    )  # fmt: skip


@functools.lru_cache(maxsize=16384)
def _loads_of(
    k: tuple[int, ...],
    base: int,
    regs: tuple[int, ...],
    threads: tuple[int, ...],
    vw: int,
    body: tuple[int, ...],
    kept: tuple[int, ...],
    stage_floats: int,
    unit: bool,
    window: bool,
    nd: int,
) -> _Loads:
    """:func:`_fragment_loads` of a tile with ``k`` words per unit of each update dim and its
    fragment's first word at ``base`` (``stage_floats`` 0: single-buffered; ``unit``: word by
    word; ``window``: also the word-by-word worst case). Memoized: a pure function."""
    addr = np.zeros(1, dtype=np.int64)
    offsets = []  # run-time offsets between threads, kept-loop iterations, stages
    lane = np.arange(32)
    lanes = np.zeros(32, dtype=np.int64)  # each lane's offset: threads, innermost dim fastest
    for d in reversed(range(nd)):
        t = threads[d]
        step = vw if d == nd - 1 and vw > 1 else 1
        lanes += k[d] * step * (lane % t)
        lane //= t
    for d in range(nd):  # each dim's values in one body
        t = threads[d]
        if d == nd - 1 and vw > 1:  # runs of vw columns, vw * T apart
            vals = (np.arange(regs[d] // vw)[:, None] * vw * t + np.arange(vw)[None, :]).ravel()
            step = vw
        else:
            vals, step = np.arange(regs[d]) * t, 1
        addr = (addr[:, None] + k[d] * vals[None, :]).ravel()
        if t > 1:
            offsets.append(k[d] * step)
    for j, b in enumerate(body):
        addr = (addr[:, None] + k[nd + j] * np.arange(b)[None, :]).ravel()
        if j in kept:
            offsets.append(k[nd + j] * b)
    addr = addr + base
    if stage_floats:
        offsets.append(stage_floats)
    align = 1 if unit else math.gcd(VECTOR_WIDTH, *offsets) if offsets else VECTOR_WIDTH
    loads = _vector_groups(addr, align)
    worst = _vector_groups(addr, 1) if window else loads
    return _Loads(
        _counts(loads), _wavefronts(loads, lanes), _counts(worst), _wavefronts(worst, lanes)
    )
