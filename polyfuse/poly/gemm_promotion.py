"""Promotion of a tiled GEMM's operands: shared tiles and their copy statements, or registers
(PPCG's ``gpu_group.c`` is the reference).

For each operand access the update reads (:func:`access_groups`: a tensor read through two
relations, operand A and operand B of one array, is two promotions), isl computes the
footprint of one block tile for one k-tile
(:attr:`polyfuse.poly.gemm_tile_schedule.TileFrame.tile` under the read's access function).
Its bounding box (lower bound an affine function of the block and k-tile parameters,
constant size; :func:`polyfuse.poly.tile_box.tile_box`) becomes a ``__shared__`` buffer when
the operand is reused across the block's threads; its last dimension is padded against bank
conflicts when its row stride is a multiple of the 32 banks. A copy statement ``C_x[kt, e]``
whose domain is that footprint moves it in; its elements are partitioned over the block's
threads, each copied by exactly one, the innermost array dimension fastest (coalesced;
:mod:`polyfuse.poly.copy_layout`). Elements outside the array (partial tiles, conv padding)
are copied as zeros, so the padded update terms add 0.

An operand the reduction does not index (``s[i]``) is not promoted: each thread holds its
elements in registers for the whole reduction (:func:`hoist_invariant`,
:func:`polyfuse.poly.fragments.hoisted_fragments`).

In the kernel's schedule tree (:mod:`polyfuse.poly.gemm_tree`) the copies are grafted as an
extension node under the k-tile band, before the phases (:func:`copy_tree`, PPCG's way): each
k-tile runs its own copies, or (pipelined) those of k-tile kt+S-1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import islpy as isl

from polyfuse.base.decision import DecisionKind, Refusal, refused
from polyfuse.poly.copy_layout import copy_layout
from polyfuse.poly.fragments import Fragment, hoisted_fragments, invariant_in
from polyfuse.poly.gemm_kernel import Promotion
from polyfuse.poly.gemm_shape import GemmShape, GemmTiling, access_function, access_groups
from polyfuse.poly.gemm_tile_schedule import TileFrame, ints, tail
from polyfuse.poly.gemm_tree import graft_copies
from polyfuse.poly.tile_box import tile_box


@dataclass(frozen=True)
class CopyDomain:
    """The instances of one operand's copy statement: ``stmt[kt..., e...]`` partitioned over
    the block's threads (one instance per vector: its first element), and the constraints
    that give each thread's copies loop counters ``q*`` of constant trip count."""

    stmt: str
    domain: isl.Set
    rank: int
    counters: list[str]


def invariant_operands(shape: GemmShape, model) -> list[tuple[str, isl.Map, tuple[int, ...]]]:
    """The update's operands that no reduction dimension indexes (``s[i]``, ``s[j]``), each
    read through one access function: (tensor, that function, the array's shape)."""
    nd, nr = len(shape.data), len(shape.red)
    out = []
    for name in dict.fromkeys(n for n, _ in shape.operands):
        accs = [access_function(m) for n, m in shape.operands if n == name]
        if all(a.is_equal(accs[0]) for a in accs) and invariant_in(accs[0], range(nd, nd + nr)):
            out.append((name, accs[0], tuple(model.tensors[name].shape)))
    return out


def hoist_invariant(
    frame: TileFrame, shape: GemmShape, model, tiling: GemmTiling
) -> tuple[list[Fragment], dict[str, str]]:
    """The k-invariant operands held in registers (loaded once per thread, not shared
    tiles), and why the others of them are not."""
    invariant = invariant_operands(shape, model)
    if not invariant:
        return [], {}
    nr, regs = len(frame.kts), frame.regs
    up0 = frame.update_at(shape.update, nr + len(regs) + 1, ints(frame.bnames + frame.tnames))
    return hoisted_fragments(
        shape.update,
        up0,
        frame.kts + ["ph", "sub"] + frame.kks + regs + ["pos"],
        regs,
        frame.reg_shape,
        invariant,
        tiling.accumulators,
        math.prod(k * t for k, t in zip(frame.ktiles, tiling.tk, strict=True)),
    )


def promote_operands(
    frame: TileFrame,
    shape: GemmShape,
    model,
    nthreads: int,
    in_registers: set[str],
    not_hoisted: dict[str, str],
) -> tuple[list[Promotion], list[CopyDomain]] | Refusal:
    """The shared tile and copy domain of every operand not held in registers, or why an
    operand cannot be promoted (a refusal about it)."""
    ctx, kts, bnames = frame.ctx, frame.kts, frame.bnames
    promotions: list[Promotion] = []
    copy_doms: list[CopyDomain] = []
    for k, g in enumerate(access_groups(shape)):
        name, key, acc, reads, reuse = g.tensor, g.key, g.access, g.reads, g.reuse
        if name in in_registers:
            continue
        if not reuse:
            held = f" nor held in registers ({not_hoisted[name]})" if name in not_hoisted else ""
            return _no(name, f"is not reused across threads{held}: not promoted")
        box = tile_box(
            name, acc, frame.tile, frame.ranges, tuple(model.tensors[name].shape)
        )
        if isinstance(box, Refusal):
            return box
        fp, lo_t, lo_c, size, tshape = box.fp, box.lo_t, box.lo_c, box.size, box.shape
        proof = box.proof
        width = proof.width
        # Padding against bank conflicts keeps vector rows 16-byte aligned (a whole vector).
        pad = width if len(size) >= 2 and size[-1] % 32 == 0 else 0
        stride = [1] * len(size)
        acc_stride = size[-1] + pad if size else 1
        for i in reversed(range(len(size) - 1)):
            stride[i] = acc_stride
            acc_stride *= size[i]
        stride = [s if i < len(size) - 1 else 1 for i, s in enumerate(stride)]
        whole = fp.project_out(isl.dim_type.param, 0, fp.dim(isl.dim_type.param))
        check = [
            whole.dim_min_val(i).to_python() < 0 or whole.dim_max_val(i).to_python() >= tshape[i]
            for i in range(len(size))
        ]
        # Copy domain: the footprint with kt as loop dims, partitioned over the block's
        # threads (one instance per vector: its first element).
        es = [f"e{i}" for i in range(len(size))]
        layout = copy_layout(size, lo_t, width, nthreads, f"p{k}", es)
        cstmt = f"C_{key}"
        fpk = fp
        for j, kt in enumerate(kts):  # the k-tile parameters become the copy's outer dims
            pos = fpk.get_space().find_dim_by_name(isl.dim_type.param, kt)
            if pos < 0:
                fpk = fpk.insert_dims(isl.dim_type.set, j, 1).set_dim_name(isl.dim_type.set, j, kt)
            else:
                fpk = fpk.move_dims(isl.dim_type.set, j, isl.dim_type.param, pos, 1)
        fpk = fpk.set_tuple_name(cstmt)
        par2 = ", ".join(bnames + [c for c, _ in layout.coords])
        dist = " and ".join(layout.constraints) or "0 = 0"
        distset = isl.Set(f"[{par2}] -> {{ {cstmt}[{ints(kts + es)}] : {dist} }}", context=ctx)
        cdom = fpk.align_params(distset.get_space()).intersect(
            distset.align_params(fpk.get_space())
        )
        qs = [f"q{i}" for i in range(len(size))]
        copy_doms.append(CopyDomain(cstmt, cdom, len(size), layout.counters(lo_t, width, es, qs)))
        bank = (
            f"; last dim padded {size[-1]}->{size[-1] + pad} against bank conflicts" if pad else ""
        )
        other = sorted(reuse)
        floats = size[0] * stride[0] if size else 1
        promotions.append(
            Promotion(
                key,
                cstmt,
                lo_c,
                size,
                stride,
                tshape,
                check,
                layout.per_dim,
                layout.coords,
                f"reused across threads along data dims {other}; per-block k-tile footprint "
                f"box {'x'.join(map(str, size)) or '1'} ({4 * floats} B), each element "
                f"copied once by a {layout.label} thread grid, innermost dim fastest{bank}; "
                + "".join(f"{n}; " for n in box.notes)
                + proof.reason,
                pad,
                width,
                box.merge,
                name,
                reads,
                box_notes=tuple(box.notes),
            )
        )
    return promotions, copy_doms


def _no(tensor: str, why: str) -> Refusal:
    """A promotion refused for ``tensor``: its reason starts with the tensor's name."""
    return refused(DecisionKind.GEMM_TILE, f"{tensor} {why}", tensor)


def copy_schedule(
    umap: isl.UnionMap, copies: list[CopyDomain], kts: list[str], at: list[str], n: int
) -> isl.UnionMap:
    """``umap`` with the copies: copy ``sub`` of k-tile ``kts`` runs at ``[at, 0, sub, q..]``
    (``at``: the k-tile it runs in, earlier when pipelined), each thread's copies in loops of
    constant trip count (``q`` from 0), not over the elements themselves (whose bounds depend
    on the thread)."""
    for sub, c in enumerate(copies):
        es = [f"e{i}" for i in range(c.rank)]
        qs = [f"q{i}" for i in range(c.rank)]
        npar = c.domain.dim(isl.dim_type.param)
        cpar = [c.domain.get_dim_name(isl.dim_type.param, i) for i in range(npar)]
        cm = isl.Map(
            f"[{', '.join(cpar)}] -> {{ {c.stmt}[{ints(kts + es)}] -> "
            f"[{ints(at)}, 0, {sub}, {tail(qs, n)}] : "
            f"{' and '.join(c.counters) or '0 = 0'} }}",
            context=c.domain.get_ctx(),
        ).intersect_domain(c.domain)
        umap = umap.union(isl.UnionMap.from_map(cm))
    return umap


def copy_extension(copies: list[CopyDomain], kts: list[str], early: list[int]) -> isl.UnionMap:
    """``{ [kt...] -> C_x[kt' ..., e...] : kt = kt' + early }`` for every copy: the copies of
    k-tile kt' run in k-tile kt' + ``early`` (0: their own; -(S-1) along the pipelined loop),
    over the k-tile band's schedule."""
    out = isl.UnionMap("{ }", context=copies[0].domain.get_ctx())
    us = [f"u{j}" for j in range(len(kts))]
    for c in copies:
        es = [f"e{i}" for i in range(c.rank)]
        shift = " and ".join(f"{k} = {u} + {d}" for k, u, d in zip(kts, us, early, strict=True))
        m = isl.Map(
            f"{{ [{ints(kts)}] -> {c.stmt}[{ints(us + es)}] : {shift or '0 = 0'} }}",
            context=c.domain.get_ctx(),
        )
        m = m.align_params(c.domain.get_space()).intersect_range(c.domain)
        out = out.union(isl.UnionMap.from_map(m))
    return out


def copy_tree(
    tree: isl.Schedule,
    copies: list[CopyDomain],
    kts: list[str],
    n: int,
    early: list[int] | None = None,
) -> isl.Schedule:
    """The promotion pass on the schedule tree: the copy statements grafted before the
    phases as an extension node (:func:`copy_extension`; PPCG's way), copy ``sub`` of k-tile
    kt' run in k-tile kt' + ``early`` (the pipelining pass's shift, decided before the graft)
    at position ``sub``, its loops the copy counters (:func:`copy_schedule`; ``n`` tail
    dims). Pipelined, the async-group statements are in phase 0 of every k-tile from 1-S on,
    so the prologue k-tiles run and build their copies."""
    if not copies:
        return tree
    early = early or [0] * len(kts)
    rows = copy_schedule(isl.UnionMap("{ }", context=tree.get_ctx()), copies, kts, kts, n)
    return graft_copies(tree, copy_extension(copies, kts, early), rows)
