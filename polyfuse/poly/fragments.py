"""Register promotion of GEMM operand fragments, decided by isl (PPCG's register promotion).

Inside one step of the innermost reduction loop (``kk``), a thread's unrolled micro-tile reads
each shared operand tile once per multiply-add. For each promoted operand isl computes the
*fragment*: the image of the thread's micro-tile instances of one ``kk`` step (block, thread,
k-tile and ``kk`` fixed as parameters) under the read's access function. The micro-tile loop
variables the read depends on index the fragment; the others only repeat it. The operand gets
a register array when

- the read is a function of the micro-tile variables, injective in those it depends on (the
  array then holds each element of the footprint exactly once),
- the footprint is smaller than the number of reads of it in the micro-tile (reuse), and
- all fragments fit the register budget beside the accumulators
  (:func:`polyfuse.poly.policy.fits_register_fragments`).

Each ``kk`` step then loads the fragment from shared memory once (TM + TN shared loads for a
TM x TN micro-tile instead of 2 TM TN) and the multiply-adds read registers only.

An operand the reduction does not index (a 1-D factor ``s[i]`` or ``s[j]`` of the product) has
the same fragment in every ``kk`` step: :func:`hoisted_fragments` loads it from global memory
once per thread, before the reduction loop, instead of promoting it to a shared tile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import islpy as isl

from polyfuse.base.decision import DecisionKind, Refusal, noted, refusal_note, refused
from polyfuse.base.decision_data import FragmentData
from polyfuse.poly.model import Statement
from polyfuse.poly.policy import GEMM_REGISTER_ARRAY_FLOATS, fits_register_fragments

#: the kind of every plan note on an operand's register fragment
KIND = DecisionKind.REGISTER_FRAGMENT


@dataclass
class Fragment:
    """One operand's register fragment per ``kk`` step."""

    tensor: str
    index_vars: list[str]  # micro-tile loop variables indexing it (the read depends on them)
    shape: list[int]  # their extents
    #: the global coordinates the read touches, over the block/thread parameters, the k-tile
    #: and ``kk`` loop variables and ``index_vars`` (all as isl parameters)
    element: list[isl.PwAff]
    context: isl.Set  # ranges of those parameters (to simplify ``element``)
    reads: int  # reads of the operand per thread and ``kk`` step (hoisted: per k loop)
    reason: str
    #: k-invariant: loaded from global memory once per thread before the reduction loop
    #: (:func:`hoisted_fragments`), not from a shared tile per ``kk`` step
    hoisted: bool = False
    #: hoisted: per array dim, whether the elements read never fall below 0 / past the end
    inside: list[tuple[bool, bool]] = field(default_factory=list)

    @property
    def floats(self) -> int:
        return math.prod(self.shape)


def _thread_access(
    update: Statement, schedule_map: isl.UnionMap, iterators: list[str], acc: isl.Map
) -> isl.Map:
    """``[loop params] -> { [schedule dims] -> tensor[e] }``: the read per schedule point, with
    the k-tile and ``kk`` dimensions moved to parameters."""
    lst = schedule_map.get_map_list()
    (sched,) = [
        lst.get_at(i)
        for i in range(lst.n_map())
        if lst.get_at(i).get_tuple_name(isl.dim_type.in_) == update.name
    ]
    f = sched.reverse().apply_range(acc.align_params(sched.get_space()))
    for i, name in enumerate(iterators):
        f = f.set_dim_name(isl.dim_type.in_, i, name)
    for name in iterators:
        if name.startswith(("kt", "kk")):
            pos = f.find_dim_by_name(isl.dim_type.in_, name)
            f = f.move_dims(isl.dim_type.param, f.dim(isl.dim_type.param), isl.dim_type.in_, pos, 1)
    return f


def _depends_on(f: isl.Map, pos: int) -> bool:
    """Whether single-valued ``f`` changes along input dimension ``pos``."""
    n = f.dim(isl.dim_type.in_)
    xs = [f"x{k}" for k in range(n)]
    moved = [f"x{k} + 1" if k == pos else f"x{k}" for k in range(n)]
    shift = isl.Map(f"{{ [{', '.join(xs)}] -> [{', '.join(moved)}] }}", context=f.get_ctx())
    shift = shift.align_params(f.get_space())
    g = f.reset_tuple_id(isl.dim_type.in_)
    shifted = shift.apply_range(g).intersect_domain(g.domain())
    return not shifted.is_subset(g)


def invariant_in(acc: isl.Map, dims: range) -> bool:
    """Whether the access function ``acc`` (single-valued, e.g. its affine hull) ignores the
    domain dimensions ``dims`` (the update's reduction dims: the read is k-invariant)."""
    h = acc.reset_tuple_id(isl.dim_type.in_)
    n = h.dim(isl.dim_type.in_)
    ins = ", ".join(f"i{k}" for k in range(n))
    for d in dims:
        moved = ", ".join(f"i{k} + 1" if k == d else f"i{k}" for k in range(n))
        shift = isl.Map(f"{{ [{ins}] -> [{moved}] }}", context=h.get_ctx())
        shift = shift.align_params(h.get_space())
        if not shift.apply_range(h).is_equal(h.align_params(shift.get_space())):
            return False
    return True


@dataclass
class _Footprint:
    """A thread's fragment of one operand: what :class:`Fragment` records of it."""

    index_vars: list[str]
    shape: list[int]
    element: list[isl.PwAff]
    context: isl.Set
    inside: list[tuple[bool, bool]]  # per array dim: never below 0, never past the end


def _thread_footprint(
    update: Statement,
    schedule_map: isl.UnionMap,
    iterators: list[str],
    reg_iters: list[str],
    reg_shape: list[int],
    acc: isl.Map,
    array_shape: tuple[int, ...],
) -> _Footprint | Refusal:
    """The operand's per-thread fragment as a function of the micro-tile loop variables it
    depends on, or why there is none (a GEMM_TILE refusal about the operand)."""
    tensor = acc.get_tuple_name(isl.dim_type.out) or ""
    f = _thread_access(update, schedule_map, iterators, acc)
    # schedule dims other than the micro-tile's are constants for the update: drop them
    for name in reversed(iterators):
        pos = f.find_dim_by_name(isl.dim_type.in_, name)
        if pos >= 0 and name not in reg_iters:
            f = f.project_out(isl.dim_type.in_, pos, 1)
    if not f.is_single_valued():
        return refused(
            DecisionKind.GEMM_TILE, "the read is not a function of the micro-tile", tensor
        )
    dep = [k for k in range(len(reg_iters)) if _depends_on(f, k)]
    g = f
    for k in reversed(range(len(reg_iters))):
        if k not in dep:
            g = g.project_out(isl.dim_type.in_, k, 1)
    if not g.is_injective():
        why = "distinct micro-tile iterations read the same element"
        return refused(DecisionKind.GEMM_TILE, why, tensor)
    index_vars = [reg_iters[k] for k in dep]
    # the element as a function of the loop variables (all parameters now)
    point = g
    for name in index_vars:
        pos = point.find_dim_by_name(isl.dim_type.in_, name)
        point = point.move_dims(
            isl.dim_type.param, point.dim(isl.dim_type.param), isl.dim_type.in_, pos, 1
        )
    elem = point.range()
    pma = elem.lexmin_pw_multi_aff()
    element = [pma.get_pw_aff(i) for i in range(elem.dim(isl.dim_type.set))]
    inside = []
    if array_shape:  # padded tiles may read past the array's edge (or before it: padding)
        whole = elem.project_out(isl.dim_type.param, 0, elem.dim(isl.dim_type.param))
        for i, n in enumerate(array_shape):
            lo, hi = whole.dim_min_val(i), whole.dim_max_val(i)
            inside.append((lo.is_int() and lo.to_python() >= 0, hi.is_int() and hi.to_python() < n))
    return _Footprint(index_vars, [reg_shape[k] for k in dep], element, elem.params(), inside)


def _refusal(
    tensor: str, size: int, reads: int, accumulators: int, used: int, per: str
) -> Refusal | None:
    """Why a fragment of ``tensor`` of ``size`` floats read ``reads`` times is not kept in
    registers (no reuse, or over the budget beside ``accumulators`` and the ``used`` fragment
    floats; a GEMM_TILE refusal), or None when it is."""
    if size >= reads:
        why = f"each of its {size} elements {per} is read once: no reuse"
        return refused(DecisionKind.GEMM_TILE, why, tensor)
    if not fits_register_fragments(accumulators, used + size):
        why = (
            f"{accumulators} accumulators + {used + size} fragment floats exceed the "
            f"{GEMM_REGISTER_ARRAY_FLOATS}-float register budget"
        )
        return refused(DecisionKind.GEMM_TILE, why, tensor)
    return None


def register_fragments(
    update: Statement,
    schedule_map: isl.UnionMap,
    iterators: list[str],
    reg_iters: list[str],
    reg_shape: list[int],
    operands: list[tuple[str, isl.Map]],
    accumulators: int,
    reserved: int = 0,
) -> tuple[list[Fragment], list[str]]:
    """The operands (``(tensor, access function of the update)``, each promoted to shared
    memory) that get register fragments, and a plan note per operand saying why or why not.
    ``reg_iters`` / ``reg_shape``: the micro-tile loop variables and their extents;
    ``reserved``: fragment floats already held (k-invariant operands, :func:`hoisted_fragments`)."""
    fragments: list[Fragment] = []
    notes: list[str] = []
    instances = math.prod(reg_shape)
    used = reserved
    for tensor, acc in operands:
        occurrences = sum(1 for n, _ in operands if n == tensor)
        if any(f.tensor == tensor for f in fragments):
            continue
        reads = instances * occurrences
        fp = _thread_footprint(update, schedule_map, iterators, reg_iters, reg_shape, acc, ())
        if isinstance(fp, Refusal):
            notes.append(refusal_note(KIND, f"{tensor}: no register fragment ({fp.reason})", fp))
            continue
        size = math.prod(fp.shape)
        no = _refusal(tensor, size, reads, accumulators, used, "per kk step")
        if no is not None:
            notes.append(refusal_note(KIND, f"{tensor}: no register fragment ({no.reason})", no))
            continue
        used += size
        by = ", ".join(fp.index_vars) or "nothing"
        fragments.append(
            Fragment(
                tensor,
                fp.index_vars,
                fp.shape,
                fp.element,
                fp.context,
                reads,
                f"register fragment r_{tensor}_frag[{size}] per kk step (indexed by {by}): isl "
                f"finds a footprint of {size} element(s) per thread read {reads} times by the "
                f"{'x'.join(map(str, reg_shape)) or '1'} micro-tile; {size} shared loads per kk "
                f"step instead of {reads}",
            )
        )
    for fr in fragments:
        data = FragmentData(fr.tensor, fr.floats, fr.reads)
        notes.append(noted(KIND, f"{fr.tensor}: {fr.reason}", fr.tensor, data=data))
    return fragments, notes


def hoisted_fragments(
    update: Statement,
    schedule_map: isl.UnionMap,
    iterators: list[str],
    reg_iters: list[str],
    reg_shape: list[int],
    operands: list[tuple[str, isl.Map, tuple[int, ...]]],
    accumulators: int,
    k_steps: int,
) -> tuple[list[Fragment], dict[str, str]]:
    """Register fragments of k-invariant operands (``(tensor, access function, array shape)``,
    each read through one access that ignores every reduction dimension), loaded from global
    memory once per thread before the reduction loop; and, per operand left out, why.

    Policy. A read the reduction does not index (a row scale ``s[i]``, a column scale
    ``s[j]``, a per-batch ``s[b]``) touches the same elements in every k-tile: a shared tile
    would copy them again for each of the ``KT`` k-tiles and read them back per ``kk`` step.
    Each thread instead holds the few elements its micro-tile touches in registers for the whole
    loop — no copies, no shared memory, no barriers — when isl finds them a function of the
    micro-tile variables, injective (each element held once), reused (read more often over the
    ``k_steps`` reduction steps than held) and within the register budget beside the
    accumulators. An operand left out is promoted like the others (its shared tile correct for
    any rank) if it is reused across threads."""
    fragments: list[Fragment] = []
    why: dict[str, str] = {}
    instances = math.prod(reg_shape)
    used = 0
    for tensor, acc, array_shape in operands:
        fp = _thread_footprint(
            update, schedule_map, iterators, reg_iters, reg_shape, acc, array_shape
        )
        if isinstance(fp, Refusal):
            why[tensor] = fp.reason
            continue
        size = math.prod(fp.shape)
        reads = instances * k_steps
        no = _refusal(tensor, size, reads, accumulators, used, "per thread")
        if no is not None:
            why[tensor] = no.reason
            continue
        used += size
        by = ", ".join(fp.index_vars) or "nothing"
        fragments.append(
            Fragment(
                tensor,
                fp.index_vars,
                fp.shape,
                fp.element,
                fp.context,
                reads,
                f"register fragment r_{tensor}_frag[{size}] (indexed by {by}) loaded from "
                f"global memory once per thread before the reduction loop: the reduction does "
                f"not index {tensor}, so a shared tile would copy the same elements every "
                f"k-tile; isl finds {size} element(s) per thread, read {reads} times over the "
                "reduction",
                hoisted=True,
                inside=fp.inside,
            )
        )
    return fragments, why
