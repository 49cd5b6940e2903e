"""Inputs staged in shared memory: one global read where several stitched parts read an input.

Policy. In a stitched reduction kernel (Layer 2) an input that several parts read is read from
global memory by each of them: batch norm's ``x`` by the mean's part and again by the
variance's. The second read hits the L1 cache only while the block's elements of the input stay
there; beside a shared tile that takes most of the SM's L1/shared SRAM they do not (batch norm
at N 64, 28²: 196 KB per channel block, 28 KB of L1 left), and the re-read streams from L2 at
latency-bound rates. Such an input is *staged*: the one statement of the first part that reads
it also stores every element it reads into a shared tile, and the later parts read the tile
(parts are separated by barriers). isl proves each condition for every block:

- the stager is the only statement of the first reading part that reads the input, and each
  element it reads is read by one thread at one instance (its stores do not race);
- the elements the later parts read are among those the stager reads;
- the block's elements of the input have a constant bounding box (the tile); where the input
  moves as float4, the tile keeps its 16-byte runs aligned (:func:`aligned_rows`).

An input whose block footprint fits the L1 left to each resident block beside the shared tiles
(blocks per SM by the occupancy calculator, registers assumed) is left to L1 (the reason is
kept). The staged tiles are placed before the scratch tiles, so a scratch tensor they displace
is spilled and then recomputed from the staged input (:mod:`polyfuse.stitch.recompute`); the
stitch stage keeps the placement without staging where that leaves a tensor spilled that it
keeps on chip, or fewer blocks resident per SM. An input read again past the L1 and not
staged is counted for the cost model (:func:`rereads`: one more read phase per such part).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import islpy as isl

from polyfuse.base.decision import DecisionKind
from polyfuse.poly.coarsen import VECTOR
from polyfuse.poly.device import DeviceSpec, occupancy
from polyfuse.poly.islutil import drop_params, injective, maps_of
from polyfuse.poly.mapping import MappedKernel
from polyfuse.poly.policy import ASSUMED_REGISTERS, smem_itemsize, smem_words


@dataclass(frozen=True)
class Staging:
    """An input staged in shared memory by statement ``stmt`` (or why it is not: ``why``)."""

    tensor: str
    stmt: str = ""
    box: tuple[tuple[isl.PwAff, int], ...] = ()
    words: int = 0  # 4-byte words of the tile
    offset: int = 0  # where the tile starts in the kernel's pool, in 4-byte words
    itemsize: int = 4
    readers: tuple[str, ...] = ()  # the later parts' statements reading the tile
    why: str = ""  # not staged: why

    @property
    def staged(self) -> bool:
        return bool(self.stmt)

    @property
    def kinds(self) -> tuple[DecisionKind, ...]:
        return (DecisionKind.FOOTPRINT,)


def aligned_rows(shape: tuple[int, ...], box, context: isl.Set) -> bool:
    """Whether a shared box keeps every 16-byte aligned run of the tensor's rows 16-byte
    aligned and contiguous: the tensor's rows and the box's rows are multiples of 4 elements
    (a run never crosses a row; the outer box strides keep the alignment) and isl proves the
    box's lower bound along the rows a multiple of 4 for every block."""
    if not box or not shape or shape[-1] % VECTOR or box[-1][1] % VECTOR:
        return False
    lo = box[-1][0]
    off = lo.mod_val(isl.Val.int_from_si(lo.get_ctx(), VECTOR)).non_zero_set()
    return off.intersect_params(context).is_empty()


def _threads_in(m: isl.Map, params: list[str]) -> isl.Map:
    """``m`` with the thread parameters moved into its domain (block parameters kept)."""
    for p in params:
        pos = m.get_space().find_dim_by_name(isl.dim_type.param, p)
        if pos >= 0:
            m = m.move_dims(isl.dim_type.in_, m.dim(isl.dim_type.in_), isl.dim_type.param, pos, 1)
    return m


def plan_staging(
    rk: MappedKernel,
    box_of,
    device: DeviceSpec,
    limit_bytes: int,
    scratch: list[tuple[int, int]],
    decided: frozenset[str] | None = None,
) -> list[Staging]:
    """Per input of ``rk`` read by several parts: staged (with its tile's offset in the pool),
    or why not. ``box_of`` bounds a union map's elements per block
    (:func:`polyfuse.poly.placement.block_box`); ``limit_bytes``: the shared memory the
    kernel's tiles may take; ``scratch``: its scratch tiles' (4-byte words, itemsize),
    smallest first, which the L1 left beside them is judged with. ``decided``: stage these
    inputs (where still legal) without judging the L1 again, and no other (the kernel
    re-placed after recomputing the scratch tensors a first staging displaced)."""
    threads = rk.thread_params + rk.lane_params
    fixed = max(0, device.smem_per_block_optin - limit_bytes)  # the combine's scratch
    left = _l1_left(device, rk.block, fixed + fitting(scratch, limit_bytes))
    out: list[Staging] = []
    used = 0
    for name, by_stmt, parts in multi_part_inputs(rk):
        if decided is not None and name not in decided:
            continue
        first = min(parts.values())
        stagers = [s for s, i in parts.items() if i == first]
        later = tuple(sorted(s for s, i in parts.items() if i != first))
        l1 = None if decided is not None else left
        st = _staging(rk, name, by_stmt, stagers, later, box_of, l1, threads)
        if st.staged:
            st = _fit(st, used, limit_bytes)
        if st.staged:
            used = st.offset + st.words
        out.append(st)
    return out


def multi_part_inputs(rk: MappedKernel) -> list[tuple[str, dict[str, isl.Map], dict[str, int]]]:
    """The inputs of ``rk`` that statements of several parts read: (name, each reading
    statement's read relation, each reading statement's part)."""
    model = rk.scheduled.model
    part_of = {s.name: i for i, p in enumerate(rk.parts) for s in p.model.statements}
    reads = model.reads.intersect_domain(rk.domain)
    out = []
    for name, role in model.tensors.items():
        if role.role != "input":
            continue
        by_stmt: dict[str, isl.Map] = {}
        for m in maps_of(reads):
            if m.get_tuple_name(isl.dim_type.out) == name:
                s = m.get_tuple_name(isl.dim_type.in_)
                by_stmt[s] = by_stmt[s].union(m) if s in by_stmt else m
        parts = {s: part_of[s] for s in by_stmt}
        if len(set(parts.values())) > 1:
            out.append((name, by_stmt, parts))
    return out


def rereads(rk: MappedKernel, box_of, device: DeviceSpec, smem_bytes: int) -> dict[str, int]:
    """Per input of ``rk`` that several parts read from global memory: how many later parts
    read it again past the L1 — its block footprint larger than the L1 left to each resident
    block beside ``smem_bytes`` of shared memory — so that it streams from L2 once more per
    such part (0 where the L1 keeps it); the cost model's ``reread_bytes``."""
    blocks, left = _l1_left(device, rk.block, smem_bytes)
    out: dict[str, int] = {}
    for name, by_stmt, parts in multi_part_inputs(rk):
        box = box_of(_union(by_stmt))
        n = 1
        for _, size in box or ():
            n *= size
        if box is not None and n * rk.scheduled.model.tensors[name].itemsize > left:
            out[name] = len(set(parts.values())) - 1
    return out


def _union(by_stmt: dict[str, isl.Map]) -> isl.UnionMap:
    maps = [isl.UnionMap.from_map(m) for m in by_stmt.values()]
    union = maps[0]
    for m in maps[1:]:
        union = union.union(m)
    return union


def fitting(scratch: list[tuple[int, int]], limit_bytes: int, used: int = 0) -> int:
    """Bytes the pool takes once the tiles ``scratch`` ((4-byte words, itemsize), smallest
    first) that fit ``limit_bytes`` are placed after ``used`` words."""
    for n, size in scratch:
        pad = used % 2 if size == 8 else 0
        if (used + pad + n) * 4 <= limit_bytes:
            used += pad + n
    return used * 4


def _l1_left(device: DeviceSpec, threads: int, smem: int) -> tuple[int, int]:
    """(Resident blocks per SM, bytes of L1 left per block beside their shared memory) for
    blocks of ``threads`` threads taking ``smem`` bytes each."""
    blocks = resident_blocks(device, threads, smem)
    return blocks, max(0, device.l1_bytes_per_sm // blocks - smem)


def _fit(st: Staging, used: int, limit_bytes: int) -> Staging:
    """``st`` at its offset after ``used`` words, or not staged where its tile does not fit."""
    offset = used + (used % 2 if st.itemsize == 8 else 0)
    if (offset + st.words) * 4 > limit_bytes:
        return replace(st, stmt="", why=f"its {st.words * 4} B tile does not fit shared memory")
    return replace(st, offset=offset)


def resident_blocks(device: DeviceSpec, threads: int, smem: int) -> int:
    """Blocks per SM of ``threads`` threads taking ``smem`` bytes of shared memory each (the
    registers are not known yet: :data:`polyfuse.poly.policy.ASSUMED_REGISTERS`)."""
    return max(1, occupancy(device, threads, ASSUMED_REGISTERS, smem).blocks_per_sm)


def _staging(rk, name, by_stmt, stagers, later, box_of, l1, threads) -> Staging:
    """Whether input ``name`` can be staged by its one first-part reader (module doc)."""
    model = rk.scheduled.model
    role = model.tensors[name]
    box = box_of(_union(by_stmt))
    if box is None:
        return Staging(name, why="its block footprint has no constant box")
    n = 1
    for _, size in box:
        n *= size
    itemsize = smem_itemsize(role.dtype)
    words = smem_words(n, itemsize)
    blocks, left = l1 if l1 is not None else (0, -1)
    if n * role.itemsize <= left:
        why = (
            f"the later parts' re-read of its {n * role.itemsize} B block footprint stays in "
            f"the L1 ({left} B per block beside the shared tiles of {blocks} resident blocks)"
        )
        return Staging(name, why=why)
    if len(stagers) != 1:
        return Staging(name, why="several statements of its first part read it")
    (stager,) = stagers
    m = by_stmt[stager]
    if not injective(isl.UnionMap.from_map(_threads_in(m, threads))):
        return Staging(name, why=f"{stager} reads an element at several threads or instances")
    mine = drop_params(m.range(), threads)
    for s in later:
        if not drop_params(by_stmt[s].range(), threads).is_subset(mine):
            return Staging(name, why=f"{s} reads elements {stager} does not")
    c = rk.coarsening
    if c is not None and c.factor > 1 and c.vector.get(name):
        if not aligned_rows(tuple(role.shape), box, rk.context):
            return Staging(name, why="its tile would not keep the float4 runs aligned")
    return Staging(name, stager, box, words, itemsize=itemsize, readers=later)
