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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import islpy as isl

from polyfuse.poly.model import Statement
from polyfuse.poly.policy import GEMM_REGISTER_ARRAY_FLOATS, fits_register_fragments


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
    reads: int  # reads of the operand per thread and ``kk`` step
    reason: str

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


def register_fragments(
    update: Statement,
    schedule_map: isl.UnionMap,
    iterators: list[str],
    reg_iters: list[str],
    reg_shape: list[int],
    operands: list[tuple[str, isl.Map]],
    accumulators: int,
) -> tuple[list[Fragment], list[str]]:
    """The operands (``(tensor, access function of the update)``, each promoted to shared
    memory) that get register fragments, and a plan note per operand saying why or why not.
    ``reg_iters`` / ``reg_shape``: the micro-tile loop variables and their extents."""
    fragments: list[Fragment] = []
    notes: list[str] = []
    instances = math.prod(reg_shape)
    used = 0
    for tensor, acc in operands:
        occurrences = sum(1 for n, _ in operands if n == tensor)
        if any(f.tensor == tensor for f in fragments):
            continue
        reads = instances * occurrences
        f = _thread_access(update, schedule_map, iterators, acc)
        # schedule dims other than the micro-tile's are constants for the update: drop them
        for name in reversed(iterators):
            pos = f.find_dim_by_name(isl.dim_type.in_, name)
            if pos >= 0 and name not in reg_iters:
                f = f.project_out(isl.dim_type.in_, pos, 1)
        if not f.is_single_valued():
            notes.append(
                f"{tensor}: no register fragment (the read is not a function of the micro-tile)"
            )
            continue
        dep = [k for k in range(len(reg_iters)) if _depends_on(f, k)]
        g = f
        for k in reversed(range(len(reg_iters))):
            if k not in dep:
                g = g.project_out(isl.dim_type.in_, k, 1)
        if not g.is_injective():
            notes.append(
                f"{tensor}: no register fragment (distinct micro-tile iterations read "
                "the same element)"
            )
            continue
        index_vars = [reg_iters[k] for k in dep]
        shape = [reg_shape[k] for k in dep]
        size = math.prod(shape)
        if size >= reads:
            notes.append(
                f"{tensor}: no register fragment (each of its {size} elements per kk "
                "step is read once by the micro-tile: no reuse)"
            )
            continue
        if not fits_register_fragments(accumulators, used + size):
            notes.append(
                f"{tensor}: no register fragment ({accumulators} accumulators + {used + size} "
                f"fragment floats exceed the {GEMM_REGISTER_ARRAY_FLOATS}-float register budget)"
            )
            continue
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
        used += size
        by = ", ".join(index_vars) or "nothing"
        fragments.append(
            Fragment(
                tensor,
                index_vars,
                shape,
                element,
                elem.params(),
                reads,
                f"register fragment r_{tensor}_frag[{size}] per kk step (indexed by {by}): isl "
                f"finds a footprint of {size} element(s) per thread read {reads} times by the "
                f"{'x'.join(map(str, reg_shape)) or '1'} micro-tile; {size} shared loads per kk "
                f"step instead of {reads}",
            )
        )
    notes += [f"{fr.tensor}: {fr.reason}" for fr in fragments]
    return fragments, notes
