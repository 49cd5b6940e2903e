"""Where each tensor of a mapped micrograph lives: registers or global memory.

Policy. Inputs and outputs of the micrograph live in global memory. A tensor that never leaves
the micrograph (an internal intermediate or a reduction accumulator) is kept in one scalar
register per thread when isl proves that is exact:

(a) *per-thread element*: for fixed block/thread parameters, every access to the tensor touches
    one single element, and every element a thread reads it wrote itself (threads that compute
    the same element redundantly each keep a private copy); or
(b) *per-iteration element*: the writer and every reader sit under the same bands of the
    schedule tree, each flow dependence has distance zero in those bands, the writer runs once
    per iteration, and every element a thread reads it wrote itself.

A micrograph output that is also read inside the kernel is stored to global memory and, when
the same criteria hold, its in-kernel reads use the register copy instead of reloading it.
Otherwise an internal tensor is spilled to a global scratch buffer (correct, but it costs
bytes; Layer 2 stitching improves on this with shared memory). Each decision carries its
reason.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import islpy as isl

from polyfuse.base.decision import Decided, DecisionKind
from polyfuse.base.decision_data import PlacementData
from polyfuse.poly.device import DeviceSpec
from polyfuse.poly.islutil import drop_params, injective, maps_of, sets_of, zero_deltas
from polyfuse.poly.mapping import MappedKernel
from polyfuse.poly.policy import FLOAT_BYTES, smem_itemsize, smem_words
from polyfuse.poly.stage import plan_staging, rereads


@dataclass(frozen=True)
class Placement:
    """Memory space of one tensor in one kernel, and why."""

    tensor: str
    space: str  # "global" | "register" | "shared"
    reason: str
    register_copy: bool = False  # a global output whose in-kernel reads use a register
    box: tuple[tuple[isl.PwAff, int], ...] = ()  # shared: per-dim (lower bound in b, size)
    smem_offset: int = 0  # shared: offset in floats inside the kernel's dynamic shared memory
    kinds: tuple[DecisionKind, ...] = ()  # what the reason says, typed (polyfuse.base.decision)
    #: a global scratch buffer (an internal tensor spilled): why it is not kept on chip;
    #: empty for inputs, outputs and on-chip tensors
    spill_why: str = ""
    #: shared: bytes of one element of the tile (:func:`polyfuse.poly.policy.smem_itemsize`)
    itemsize: int = 4
    #: a global input staged in a shared tile (:mod:`polyfuse.poly.stage`): the statement
    #: that reads it from global memory and stores it there; later parts read the tile
    stage: str = ""
    #: a global input that later parts read again past the L1: how many such parts
    #: (:func:`polyfuse.poly.stage.rereads`; the cost model's re-read bytes)
    reread: int = 0

    @property
    def smem_floats(self) -> int:
        n = 1
        for _, size in self.box:
            n *= size
        return n if self.space == "shared" or self.stage else 0

    @property
    def smem_bytes(self) -> int:
        """Bytes of shared memory the tile takes (elements of :attr:`itemsize` bytes, in the
        pool's 4-byte words: a double tile 8 per element, a float or a widened half 4); 0 for
        a shared placement without a box (a GEMM's operand tiles: their passes size them)."""
        if not self.box:
            return 0
        return smem_words(self.smem_floats, self.itemsize) * FLOAT_BYTES

    @property
    def in_register(self) -> bool:
        """Whether in-kernel reads use a register."""
        return self.space == "register" or self.register_copy

    def record(self, kernel: str) -> Decided:
        """This placement in kernel ``kernel`` as the one decision record (subject: the
        tensor; made: kept on chip)."""
        data = PlacementData(
            kernel, self.tensor, self.space, self.register_copy, self.smem_floats, self.spill_why
        )
        return Decided(self.kinds, self.reason, data, (self.tensor,), self.space != "global")

    def __str__(self) -> str:
        return f"{self.tensor}: {self.space} ({self.reason})"


def _maps_to(um: isl.UnionMap, tensor: str) -> isl.UnionMap:
    out = isl.UnionMap.empty(um.get_space())
    for m in maps_of(um):
        if m.get_tuple_name(isl.dim_type.out) == tensor:
            out = out.union(isl.UnionMap.from_map(m))
    return out


def _per_thread_function(fp: isl.Set) -> tuple[bool, bool]:
    """(single-valued, injective) of the map block/thread parameters → accessed elements."""
    n = fp.dim(isl.dim_type.param)
    m = isl.Map.from_range(fp).move_dims(isl.dim_type.in_, 0, isl.dim_type.param, 0, n)
    return m.is_single_valued(), m.is_injective()


def _leaves(
    node: isl.ScheduleNode, path: tuple[int, ...], bands: tuple[tuple[int, ...], ...], out: list
):
    t = node.get_type()
    if t == isl.schedule_node_type.leaf:
        out.append((node, bands))
        return
    if t == isl.schedule_node_type.band:
        bands = bands + (path,)
    for i in range(node.n_children()):
        _leaves(node.child(i), path + (i,), bands, out)


def place_tensors(mm: MappedKernel) -> dict[str, Placement]:
    """Decide register or global for every tensor the micrograph touches."""
    model = mm.scheduled.model
    dom = mm.domain
    writes = model.writes.intersect_domain(dom)
    reads = model.reads.intersect_domain(dom)
    leaves: list = []
    _leaves(mm.schedule.get_root(), (), (), leaves)
    stmt_leaf: dict[str, tuple] = {}
    prefix = isl.UnionMap.empty(dom.get_space())
    for node, bands in leaves:
        ldom = node.get_domain()
        for s in sets_of(ldom):
            stmt_leaf[s.get_tuple_name()] = (node, bands)
        if not ldom.is_empty():
            prefix = prefix.union(node.get_prefix_schedule_union_map().intersect_domain(ldom))

    out: dict[str, Placement] = {}
    for name, role in model.tensors.items():
        w, r = _maps_to(writes, name), _maps_to(reads, name)
        if role.role == "input":
            out[name] = Placement(name, "global", "micrograph input")
            continue
        fits, why = _register_fit(w, r, prefix, stmt_leaf)
        if role.role == "output":
            if not r.is_empty() and fits:
                out[name] = Placement(
                    name,
                    "global",
                    f"micrograph output; in-kernel reads from a register ({why})",
                    register_copy=True,
                )
            else:
                out[name] = Placement(name, "global", "micrograph output")
        elif fits:
            out[name] = Placement(name, "register", why)
        else:
            out[name] = Placement(name, "global", f"scratch buffer: {why}", spill_why=why)
    return out


def block_box(
    acc: isl.UnionMap, dom: isl.UnionSet, context: isl.Set, thread_params: list[str]
) -> tuple[tuple[isl.PwAff, int], ...] | None:
    """Bounding box of the elements one block touches: per dim (lower bound in b, size)."""
    fp_u = drop_params(acc.intersect_domain(dom).range().intersect_params(context), thread_params)
    sets = sets_of(fp_u)
    if len(sets) != 1:
        return None
    box = set_box(sets[0].coalesce())
    return None if box is None else tuple(box)


def set_box(fp: isl.Set) -> list[tuple[isl.PwAff, int]] | None:
    """Per dimension of ``fp``: its lower bound and the constant size of the box around it
    (None when some size is not a constant)."""
    box = []
    for i in range(fp.dim(isl.dim_type.set)):
        lo, hi = fp.dim_min(i), fp.dim_max(i)
        size = hi.sub(lo).max_val()
        if not size.is_int():
            return None
        box.append((lo, size.to_python() + 1))
    return box


def place_shared(
    rk,
    placements: dict[str, Placement],
    limit_bytes: int,
    device: DeviceSpec | None = None,
    stage: bool | frozenset[str] = False,
) -> dict[str, Placement]:
    """Layer 2 placement: move scratch tensors of a reduction kernel into shared memory.

    A tensor qualifies when its per-block footprint (the box isl bounds for one block's
    instances, every thread included) fits what is left of ``limit_bytes``, and every element
    a thread reads it either wrote itself or was written in an earlier part (parts are
    separated by barriers). Candidates are taken smallest first; the rest stay in global
    memory with the reason. With ``device``, inputs that several parts read are staged first
    where ``stage`` and :mod:`polyfuse.poly.stage` decide so (a set: those inputs, decided
    once), and the others' re-reads past the L1 are counted (:attr:`Placement.reread`).
    """
    model = rk.scheduled.model
    dom = rk.domain
    threads = rk.thread_params + rk.lane_params
    part_of = {s.name: i for i, p in enumerate(rk.parts) for s in p.model.statements}
    writes, reads = model.writes.intersect_domain(dom), model.reads.intersect_domain(dom)
    out = dict(placements)
    cands = []
    for name, p in placements.items():
        if p.space != "global" or not p.spill_why:
            continue
        w, r = _maps_to(writes, name), _maps_to(reads, name)
        own = r.range().is_subset(w.range())
        wparts = {part_of[m.get_tuple_name(isl.dim_type.in_)] for m in maps_of(w)}
        rparts = {part_of[m.get_tuple_name(isl.dim_type.in_)] for m in maps_of(r)}
        if not own and not (rparts and min(rparts) > max(wparts)):
            continue
        box = block_box(w.union(r), dom, rk.context, threads)
        if box is None:
            continue
        n = 1
        for _, size in box:
            n *= size
        # in 4-byte words of the pool: bytes of the tensor's register dtype (a double 8)
        size = smem_itemsize(model.tensors[name].dtype)
        cands.append((smem_words(n, size), name, box, size))
    cands.sort(key=lambda c: c[0])
    used = 0
    if device is not None and stage:
        decided = stage if isinstance(stage, frozenset) else None
        used = _stage_inputs(rk, out, limit_bytes, device, cands, decided)
    for n, name, box, size in cands:
        if size == 8:
            used += used % 2  # an 8-byte tile starts at an 8-byte boundary
        if (used + n) * 4 > limit_bytes:
            why = (
                f"per-block footprint {n * 4} B does not fit the "
                f"{limit_bytes - used * 4} B of shared memory left"
            )
            out[name] = Placement(
                name,
                "global",
                f"scratch buffer: {why}",
                kinds=(DecisionKind.FOOTPRINT,),
                spill_why=why,
            )
            continue
        out[name] = Placement(
            name,
            "shared",
            f"per-block footprint {n * 4} B in shared memory",
            box=box,
            smem_offset=used,
            itemsize=size,
        )
        used += n
    if device is not None:
        fixed = max(0, device.smem_per_block_optin - limit_bytes)  # the combine's scratch
        box_of = lambda u: block_box(u, dom, rk.context, threads)  # noqa: E731
        for t, n in rereads(rk, box_of, device, used * 4 + fixed).items():
            if not out[t].stage:
                out[t] = replace(out[t], reread=n)
    return out


def _stage_inputs(rk, out: dict[str, Placement], limit_bytes: int, device: DeviceSpec, cands,
                  decided: frozenset[str] | None):  # fmt: skip
    """Stage the inputs :func:`polyfuse.poly.stage.plan_staging` picks into ``out`` (the rest
    keep their global placement, with why not); the 4-byte words their tiles take."""
    threads = rk.thread_params + rk.lane_params

    def box_of(u: isl.UnionMap):
        return block_box(u, rk.domain, rk.context, threads)

    used = 0
    scratch = [(n, size) for n, _, _, size in cands]
    for st in plan_staging(rk, box_of, device, limit_bytes, scratch, decided):
        p = out[st.tensor]
        if not st.staged:
            out[st.tensor] = replace(p, reason=f"{p.reason}; read again by later parts, not "
                                     f"staged: {st.why}")  # fmt: skip
            continue
        reason = (
            f"{p.reason}, staged in shared memory by {st.stmt} for {', '.join(st.readers)} "
            f"(per-block footprint {st.words * 4} B; the re-read would miss the L1)"
        )
        out[st.tensor] = replace(
            p, reason=reason, box=st.box, smem_offset=st.offset, itemsize=st.itemsize,
            stage=st.stmt, kinds=(*p.kinds, *st.kinds),
        )  # fmt: skip
        used = st.offset + st.words
    return used


def _register_fit(
    w: isl.UnionMap, r: isl.UnionMap, prefix: isl.UnionMap, stmt_leaf
) -> tuple[bool, str]:
    """Whether a tensor can live in one register per thread, and why (or why not)."""
    if not r.range().is_subset(w.range()):
        return False, "threads read elements other threads write"
    sets = sets_of(w.union(r).range())
    if len(sets) == 1 and _per_thread_function(sets[0])[0]:
        return True, "one element per thread (isl footprint)"
    reason = _per_iteration(w, r, prefix, stmt_leaf)
    if reason is not None:
        return False, reason
    return True, "one element per loop iteration (zero-distance flow)"


def _per_iteration(w: isl.UnionMap, r: isl.UnionMap, prefix: isl.UnionMap, stmt_leaf) -> str | None:
    """None when criterion (b) holds, else why not."""
    wstmts = {m.get_tuple_name(isl.dim_type.in_) for m in maps_of(w)}
    rstmts = {m.get_tuple_name(isl.dim_type.in_) for m in maps_of(r)}
    if len(wstmts) != 1:
        return "written by several statements"
    (ws,) = wstmts
    for rs in rstmts:
        if stmt_leaf[rs][1] != stmt_leaf[ws][1]:
            return "reader and writer are in different loop nests"
    wp = prefix.intersect_domain(w.domain())
    if not injective(wp):
        return "the writer runs several times per loop iteration"
    pairs = w.apply_range(r.reverse())
    if pairs.is_empty():
        return None
    if not zero_deltas(pairs.apply_domain(prefix).apply_range(prefix).deltas()):
        return "a value is read in a later loop iteration than it is written"
    return None
