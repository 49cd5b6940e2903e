"""Op kinds from isl dataflow relations (APOLLO Definitions 1–4, computed by isl).

For every read access of a primitive, the dataflow relation R = write ∘ read⁻¹ maps the input
elements read to the output elements they feed. isl's own predicates classify it:

- single-valued and injective → bijective; *aligned* when, after dropping size-1 dimensions,
  every output dimension is the same-position input dimension plus a constant, otherwise a
  *layout* access (transpose, reshape, strided copy);
- injective only → *injective* (a broadcast: one input element feeds many outputs);
- single-valued only → *surjective* (a reduction: many inputs feed one output);
- neither → *general* (a contraction, an overlapping window).

The op kind follows from the kinds of all its accesses; there is no list of op names.
"""

from __future__ import annotations

from enum import StrEnum

import islpy as isl

from polyfuse.graph.expr import Binary, IterVar, Read, Select, Tensor, walk


class AccessKind(StrEnum):
    ALIGNED = "aligned"
    LAYOUT = "layout"
    INJECTIVE = "injective"
    SURJECTIVE = "surjective"
    GENERAL = "general"


class OpKind(StrEnum):
    ELEMENTWISE = "elementwise"
    BROADCAST = "broadcast"
    REDUCTION = "reduction"
    OPAQUE = "opaque"


def _drop_unit_dims(r: isl.Map, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> isl.Map:
    for pos in reversed([i for i, n in enumerate(in_shape) if n == 1]):
        r = r.project_out(isl.dim_type.in_, pos, 1)
    for pos in reversed([i for i, n in enumerate(out_shape) if n == 1]):
        r = r.project_out(isl.dim_type.out, pos, 1)
    return r


def is_aligned(r: isl.Map, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> bool:
    """Whether each output dim is the same-position input dim plus one constant."""
    r = _drop_unit_dims(r, in_shape, out_shape)
    if r.dim(isl.dim_type.in_) != r.dim(isl.dim_type.out):
        return False
    if r.dim(isl.dim_type.in_) == 0:
        return True
    r = r.reset_tuple_id(isl.dim_type.in_).reset_tuple_id(isl.dim_type.out)
    return r.deltas().is_singleton()


def dataflow_relation(read: isl.Map, write: isl.Map) -> isl.Map:
    """R = write ∘ read⁻¹: input elements → the output elements they feed."""
    return read.reverse().apply_range(write)


def access_kind(
    read: isl.Map, write: isl.Map, in_shape: tuple[int, ...], out_shape: tuple[int, ...]
) -> AccessKind:
    """Classify one read access of a primitive by its dataflow relation."""
    r = dataflow_relation(read, write)
    if r.is_empty():
        return AccessKind.ALIGNED
    sv, inj = r.is_single_valued(), r.is_injective()
    if sv and inj:
        return AccessKind.ALIGNED if is_aligned(r, in_shape, out_shape) else AccessKind.LAYOUT
    if inj:
        return AccessKind.INJECTIVE
    if sv:
        return AccessKind.SURJECTIVE
    return AccessKind.GENERAL


def op_kind(accesses: list[AccessKind]) -> OpKind:
    """Op kind from its accesses: any general/layout → opaque; any surjective → reduction;
    any injective → broadcast; else elementwise."""
    s = set(accesses)
    if AccessKind.GENERAL in s or AccessKind.LAYOUT in s:
        return OpKind.OPAQUE
    if AccessKind.SURJECTIVE in s:
        return OpKind.REDUCTION
    if AccessKind.INJECTIVE in s:
        return OpKind.BROADCAST
    return OpKind.ELEMENTWISE


def is_contraction(t: Tensor) -> bool:
    """Whether reduction ``t`` is a sum of products of reads at least two of which each
    ignore some output axis (matmul, batched matmul, conv): the GEMM-like shape
    :func:`polyfuse.poly.tiling.detect_gemm` tiles, whose reduction is never split."""
    assert t.op is not None and t.op.reduce is not None
    red = t.op.reduce
    if red.op != "sum":
        return False
    factors, stack = [], [red.body]
    while stack:
        e = stack.pop()
        if isinstance(e, Binary) and e.op == "mul":
            stack += [e.a, e.b]
        else:
            factors.append(e)
    reads = [f.a if isinstance(f, Select) else f for f in factors]
    if len(reads) < 2 or not all(isinstance(r, Read) for r in reads):
        return False
    axes = {a.uid for a in t.op.axes if a.extent > 1}

    def used(r: Read) -> set[int]:
        return {n.uid for i in r.indices for n in walk(i) if isinstance(n, IterVar)}

    return sum(1 for r in reads if axes - used(r)) >= 2  # type: ignore[arg-type]
