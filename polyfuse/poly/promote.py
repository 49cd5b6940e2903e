"""Shared-memory promotion of GEMM operands and the tiled kernel's isl schedule (PPCG style).

For each operand the update reads (:class:`polyfuse.poly.tiling.GemmShape`), isl computes
the footprint of one block tile for one k-tile: the image of the padded tile of update
instances (parameters ``b`` = block, ``kt`` = k-tile) under the read's access function. Its
bounding box (lower bound an affine function of ``b`` and ``kt``, constant size) becomes a
``__shared__`` buffer when the operand is reused across the block's threads; its last
dimension is padded by one word when its row stride is a multiple of the 32 banks. A copy
statement ``C_x[kt, e]`` whose domain is that footprint is added to the schedule before the
update of each k-tile, between barrier statements; its elements are partitioned over the
block's threads, each copied by exactly one, the innermost array dimension fastest (coalesced;
:mod:`polyfuse.poly.copy_layout`, any rank). An operand the reduction does not index (``s[i]``)
is not promoted: each thread holds its elements in registers for the whole reduction
(:func:`polyfuse.poly.fragments.hoisted_fragments`). Elements outside the array (partial
tiles, conv padding) are copied as zeros, so the padded update terms add 0.

isl then generates the whole kernel's loop AST from the schedule map (init, k-tile loop with
copies, barriers and the unrolled micro-tile, epilogue).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import islpy as isl

from polyfuse.poly.copy_layout import copy_layout
from polyfuse.poly.fragments import Fragment, hoisted_fragments, invariant_in, register_fragments
from polyfuse.poly.gemm_loops import GemmLoops
from polyfuse.poly.mapping import MappedMicrograph
from polyfuse.poly.model import Statement
from polyfuse.poly.placement import Placement
from polyfuse.poly.schedule import ScheduledMicrograph
from polyfuse.poly.tile_box import tile_box
from polyfuse.poly.tiling import GemmShape, GemmTiling
from polyfuse.poly.vectorize import VECTOR_WIDTH, prove_vector_copy

SYNC_BEFORE = "Sync_load"  # barrier statement: copies done before the micro-tile reads them
SYNC_AFTER = "Sync_use"  # barrier statement: reads done before the next k-tile's copies
COMMIT = "Cp_commit"  # pipelined: the copies issued for one k-tile form one async group
WAIT = "Cp_wait"  # pipelined: all groups but the S-1 newest (k-tiles kt+1..kt+S-1) have landed
#: shared-tile stages when pipelined, unless the stage model (:mod:`polyfuse.poly.costs.stages`)
#: chooses: k-tile kt+1 is copied (cp.async) while kt is used
PIPELINE_STAGES = 2
CP_ASYNC_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90")  # cp.async exists from sm_80 on


def pipeline_stages(arch: str) -> int:
    """Shared-tile stages on ``arch``: double buffering where cp.async exists."""
    return PIPELINE_STAGES if arch in CP_ASYNC_ARCHS else 1


VECTOR_VAR = "iv"  # the micro-tile loop over one vector's elements (vectorised stores)


@dataclass
class Promotion:
    """One operand in shared memory: box lower bounds (C text over b, kt), sizes, copy layout."""

    tensor: str
    copy_stmt: str
    lo: list[isl.PwAff]  # the box's lower bounds, in the block params b* and k-tiles kt*
    size: list[int]
    stride: list[int]  # of the shared buffer (last dim padded by ``pad``)
    shape: tuple[int, ...]  # of the global tensor
    bounds_check: list[bool]  # per dim: may the footprint leave the array?
    thread_grid: tuple[int, ...]  # threads along each footprint dim (product: the block's)
    grid: tuple[tuple[str, int], ...]  # the copying threads' coordinates (name, extent)
    reason: str
    pad: int = 0  # words added to the buffer's rows (bank conflicts)
    width: int = 1  # elements per copy instance (4: 128-bit vector copies, proven by isl)
    #: the tile's view of the array: per tile dim, its coefficient on each array dim (empty:
    #: the array's own dims; :mod:`polyfuse.poly.tile_box`)
    merge: tuple[tuple[int, ...], ...] = ()

    @property
    def floats(self) -> int:
        return self.size[0] * self.stride[0] if self.size else 1


@dataclass(frozen=True)
class GemmKernel(MappedMicrograph):
    """A GEMM-like micrograph tiled for blocks, threads, registers and shared memory."""

    shape: GemmShape | None = None
    tiling: GemmTiling | None = None
    schedule_map: isl.UnionMap | None = None
    iterators: list[str] = field(default_factory=list)
    promotions: list[Promotion] = field(default_factory=list)
    reg_iters: list[str] = field(default_factory=list)  # loop vars indexing the micro-tile
    guards: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # epilogue bounds
    tile_context: isl.Set | None = None  # ranges of b* and kt* (for the boxes' lower bounds)
    reg_shape: list[int] = field(default_factory=list)  # the accumulator array's shape
    stages: int = 1  # shared-tile stages (2: double-buffered, cp.async)
    pipelined: str = ""  # the k-tile loop the stages alternate over
    #: epilogue statements whose global stores are whole vectors (loop ``VECTOR_VAR``)
    vector_stores: dict[str, str] = field(default_factory=dict)  # statement -> tensor
    #: promoted operands whose per-kk fragment each thread keeps in registers
    fragments: list[Fragment] = field(default_factory=list)
    #: how the loops are emitted (unroll, peel, launch bounds; :mod:`polyfuse.poly.gemm_loops`)
    loops: GemmLoops = field(default_factory=GemmLoops)
    #: promoted operands whose selects-to-zero the update drops, with isl's reason
    #: (:mod:`polyfuse.poly.select_free`)
    select_free: dict[str, str] = field(default_factory=dict)


def _ints(names: list[str]) -> str:
    return ", ".join(names)


def access_function(acc: isl.Map) -> isl.Map:
    """The read's subscripts without the domain's bounds, valid on the padded tiles.

    Its affine hull when that is a function (affine subscripts; conv's padding guard is
    dropped, so out-of-array elements are copied as zeros); otherwise (grouped conv's channel,
    a floor division) the access gisted by its own domain.
    """
    hull = isl.Map.from_basic_map(acc.affine_hull())
    return hull if hull.is_single_valued() else acc.gist_domain(acc.domain())


def padded_reduction_reads(shape: GemmShape, tk: list[int], model) -> str | None:
    """Why k-tiles of ``tk`` would give a wrong sum, or None when they are sound.

    The reduction range is rounded up to whole k-tiles and the padded steps run unguarded:
    each padded term must be 0, so at least one of its factors must read outside its array
    (the shared tiles hold zeros there; their copies zero-fill them). A read through a folded
    layout (``q[b, s, 12h + k]`` with ``k < 12``) reaches the next head's elements in the
    padded steps ``k >= 12``, inside the array: when every factor of some padded term reads
    inside its array, those k-tiles are refused (isl decides, over the whole padded box)."""
    up = shape.update
    extents = [hi - lo + 1 for lo, hi in shape.red]
    if all(e % k == 0 for e, k in zip(extents, tk, strict=True)):
        return None
    nd = len(shape.data)
    names = [f"i{i}" for i in range(nd + len(shape.red))]
    cons = [f"{lo} <= {n} <= {hi}" for n, (lo, hi) in zip(names[:nd], shape.data, strict=True)]
    cons += [
        f"{lo} <= {n} < {lo + -(-e // k) * k}"
        for n, (lo, _), e, k in zip(names[nd:], shape.red, extents, tk, strict=True)
    ]
    padded = isl.Set(
        f"{{ {up.name}[{', '.join(names)}] : {' and '.join(cons)} }}", context=model.ctx
    )
    real = up.domain.project_out(isl.dim_type.param, 0, up.domain.dim(isl.dim_type.param))
    nonzero = padded.subtract(real)  # padded terms none of whose factors is known to be 0
    for name, acc in shape.operands:
        dims = model.tensors[name].shape
        box = isl.Set(
            f"{{ {name}[{', '.join(f'e{i}' for i in range(len(dims)))}] : "
            + " and ".join(f"0 <= e{i} < {n}" for i, n in enumerate(dims))
            + " }",
            context=model.ctx,
        )
        f = access_function(acc)
        f = f.project_out(isl.dim_type.param, 0, f.dim(isl.dim_type.param))
        nonzero = nonzero.intersect(f.intersect_range(box).domain())
    if nonzero.is_empty():
        return None
    reads = ", ".join(sorted({name for name, _ in shape.operands}))
    return (
        f"k-tile {'x'.join(map(str, tk))}: some padded reduction steps would read {reads} "
        "inside their arrays (not zeros)"
    )


def _invariant_operands(shape: GemmShape, model) -> list[tuple[str, isl.Map, tuple[int, ...]]]:
    """The update's operands that no reduction dimension indexes (``s[i]``, ``s[j]``), each
    read through one access function: (tensor, that function, the array's shape)."""
    nd, nr = len(shape.data), len(shape.red)
    out = []
    for name in dict.fromkeys(n for n, _ in shape.operands):
        accs = [access_function(m) for n, m in shape.operands if n == name]
        if all(a.is_equal(accs[0]) for a in accs) and invariant_in(accs[0], range(nd, nd + nr)):
            out.append((name, accs[0], tuple(model.tensors[name].shape)))
    return out


def build_gemm_kernel(
    sm: ScheduledMicrograph, shape: GemmShape, tiling: GemmTiling, stages: int = 1
):
    """The tiled, promoted kernel: schedule map, context, promotions; or why not (a string).

    ``stages`` S > 1 keeps S shared buffers per tile when exactly one k-tile loop has more
    than one iteration: the copies of k-tile kt+S-1 are issued asynchronously during k-tile
    kt (the schedule runs each copy S-1 k-tiles early; the first S-1 k-tiles' copies run in
    S-1 iterations before k-tile 0, the prologue the loop pass peels).
    """
    model = sm.model
    ctx = model.ctx
    nd, nr = len(shape.data), len(shape.red)
    B, T, R, TK = tiling.block, tiling.threads, tiling.regs, tiling.tk
    G = [-(-(hi - lo + 1) // b) for (lo, hi), b in zip(shape.data, B, strict=True)]
    KT = [-(-(hi - lo + 1) // k) for (lo, hi), k in zip(shape.red, TK, strict=True)]
    # Block/thread coordinates of extent 1 are the constant 0, not isl parameters (every
    # parameter costs isl's AST generator time).
    bs = [f"b{i}" if g > 1 else "0" for i, g in enumerate(G)]
    ts = [f"t{i}" if t > 1 else "0" for i, t in enumerate(T)]
    bused = [(b, g) for b, g in zip(bs, G, strict=True) if g > 1]
    tused = [(t, n) for t, n in zip(ts, T, strict=True) if n > 1]
    bnames = [b for b, _ in bused]
    kts = [f"kt{j}" for j in range(nr)]
    kks = [f"kk{j}" for j in range(nr)]
    iis = [f"ii{i}" for i in range(nd)]
    ds = [f"d{i}" for i in range(nd)]
    rs = [f"r{j}" for j in range(nr)]
    nthreads = tiling.nthreads

    # Padded domains (whole tiles) and the thread/register decomposition of data dims.
    dpad = [
        f"{lo} <= {d} < {lo + g * b}" for d, (lo, _), g, b in zip(ds, shape.data, G, B, strict=True)
    ]
    rpad = [
        f"{lo} <= {r} < {lo + k * t}"
        for r, (lo, _), k, t in zip(rs, shape.red, KT, TK, strict=True)
    ]
    # Vector stores: each thread's columns in runs of VECTOR_WIDTH (blocked, not cyclic) when
    # isl proves every run of every output the epilogue stores aligned and within or wholly
    # outside the array.
    vector_stores, store_why = _vector_stores(shape, model, B, R[-1], bs, bused)
    vw = VECTOR_WIDTH if vector_stores else 1
    Rv = [r // vw if i == nd - 1 else r for i, r in enumerate(R)]
    # (terms of size-1 thread or register extents are left out: fewer isl variables)
    on_thread = [
        f"{d} = {lo} + {b} * {bb}"
        + (f" + {t}" if tt > 1 else "")
        + (f" + {tt} * {ii} and 0 <= {ii} < {rr}" if rr > 1 else "")
        for d, (lo, _), b, bb, t, tt, ii, rr in zip(
            ds, shape.data, B, bs, ts, T, iis, R, strict=True
        )
    ]
    if vw > 1:  # d = lo + B b + vw t + iv + vw T ii: a thread's runs of vw columns
        d, (lo, _), b, bb = ds[-1], shape.data[-1], B[-1], bs[-1]
        t, tt, ii, rr = ts[-1], T[-1], iis[-1], Rv[-1]
        on_thread[-1] = (
            f"{d} = {lo} + {b} * {bb}"
            + (f" + {vw} * {t}" if tt > 1 else "")
            + f" + {VECTOR_VAR}"
            + (f" + {vw * tt} * {ii}" if rr > 1 else "")
            + f" and 0 <= {VECTOR_VAR} < {vw}"
            + (f" and 0 <= {ii} < {rr}" if rr > 1 else "")
        )
    on_ktile = [
        f"{r} = {lo} + {k} * {kt} + {kk} and 0 <= {kk} < {k}"
        for r, (lo, _), k, kt, kk in zip(rs, shape.red, TK, kts, kks, strict=True)
    ]

    # Shared-memory promotions: footprint of the padded block tile per k-tile.
    ppar = ", ".join(bnames + kts)
    tile = isl.Set(
        f"[{ppar}] -> {{ {shape.update.name}[{_ints(ds + rs)}] : "
        + " and ".join(
            [
                f"{lo} + {b} * {bb} <= {d} < {lo} + {b} * {bb} + {b}"
                for d, (lo, _), b, bb in zip(ds, shape.data, B, bs, strict=True)
            ]
            + [
                f"{lo} + {k} * {kt} <= {r} < {lo} + {k} * {kt} + {k}"
                for r, (lo, _), k, kt in zip(rs, shape.red, TK, kts, strict=True)
            ]
        )
        + " }",
        context=ctx,
    )
    ranges = isl.Set(
        f"[{ppar}] -> {{ : "
        + " and ".join(
            [f"0 <= {b} < {g}" for b, g in bused]
            + [f"0 <= {k} < {n}" for k, n in zip(kts, KT, strict=True)]
            + ["0 = 0"]
        )
        + " }",
        context=ctx,
    )
    # Only register dims (R > 1) get a micro-tile loop in the schedule.
    regs = [ii for ii, r in zip(iis, Rv, strict=True) if r > 1] + ([VECTOR_VAR] * (vw > 1))
    reg_shape = [r for r in Rv if r > 1] + ([vw] * (vw > 1))

    def tailv(vals: list[str], n: int) -> str:
        return ", ".join(vals + ["0"] * (n - len(vals)))

    def tiled(stmt: Statement, out: str, cons: list[str], pad: list[str], P: str):
        # detect_gemm checked that isl's band runs the data dims of every statement in this
        # order (reduction dims after them): the tiling map applies to the loop vector.
        dims = ds + (rs if stmt.role == "update" else [])
        tmap = isl.Map(
            f"[{P}] -> {{ {stmt.name}[{_ints(dims)}] -> [{out}] : "
            f"{' and '.join(cons)} and {' and '.join(pad)} }}",
            context=ctx,
        )
        return isl.UnionMap.from_map(tmap)

    # k-invariant operands: register fragments loaded once per thread, not shared tiles.
    invariant = _invariant_operands(shape, model)
    hoisted: list[Fragment] = []
    not_hoisted: dict[str, str] = {}
    if invariant:
        n0 = nr + len(regs) + 1
        up0 = tiled(
            shape.update,
            f"{_ints(kts)}, 2, 0, {tailv(kks + regs, n0)}",
            on_thread + on_ktile,
            dpad + rpad,
            ", ".join(bnames + [t for t, _ in tused]),
        )
        hoisted, not_hoisted = hoisted_fragments(
            shape.update,
            up0,
            kts + ["ph", "sub"] + kks + regs + ["pos"],
            regs,
            reg_shape,
            invariant,
            tiling.accumulators,
            math.prod(k * t for k, t in zip(KT, TK, strict=True)),
        )
    in_registers = {f.tensor for f in hoisted}
    promotions: list[Promotion] = []
    copy_doms: list[tuple[str, isl.Set, int, list[str]]] = []
    seen: set[str] = set()
    for k, ((name, acc), reuse) in enumerate(zip(shape.operands, shape.reuse, strict=True)):
        if name in seen:
            first = next(m for n, m in shape.operands if n == name)
            if not access_function(first).is_equal(access_function(acc)):
                # One shared tile per tensor: a tensor read at two places (matmul(a, a))
                # would need the union of two footprints.
                return f"{name} is read through two different accesses: not promoted"
            continue
        seen.add(name)
        if name in in_registers:
            continue
        if not reuse:
            held = f" nor held in registers ({not_hoisted[name]})" if name in not_hoisted else ""
            return f"{name} is not reused across threads{held}: not promoted"
        box = tile_box(name, access_function(acc), tile, ranges, tuple(model.tensors[name].shape))
        if isinstance(box, str):
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
        cstmt = f"C_{name}"
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
        distset = isl.Set(f"[{par2}] -> {{ {cstmt}[{_ints(kts + es)}] : {dist} }}", context=ctx)
        cdom = fpk.align_params(distset.get_space()).intersect(
            distset.align_params(fpk.get_space())
        )
        qs = [f"q{i}" for i in range(len(size))]
        copy_doms.append((cstmt, cdom, len(size), layout.counters(lo_t, width, es, qs)))
        bank = (
            f"; last dim padded {size[-1]}->{size[-1] + pad} against bank conflicts" if pad else ""
        )
        other = sorted(reuse)
        floats = size[0] * stride[0] if size else 1
        promotions.append(
            Promotion(
                name,
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
            )
        )

    # Tiled schedule: isl's band composed with the tiling map (fixed width W).
    tail_n = max([nr + len(regs) + 1] + [n for _, _, n, _ in copy_doms])
    tail_names = kks + regs + ["pos"] + [f"x{i}" for i in range(tail_n - nr - len(regs) - 1)]
    iterators = kts + ["ph", "sub"] + tail_names
    params = bnames + [t for t, _ in tused] + [c for pr in promotions for c, _ in pr.grid]
    P = ", ".join(params)

    multi = [j for j, n in enumerate(KT) if n > 1]
    if stages > 1 and (len(multi) != 1 or not copy_doms):
        stages = 1  # nothing to overlap, or k-tiles over several loops
    # Pipelined, the first S-1 k-tiles' copies run at k-tiles 1-S..-1: the init before them.
    first = str(-stages) if stages > 1 else "-1"
    umap = tiled(
        shape.update,
        f"{_ints(kts)}, 2, 0, {tailv(kks + regs, tail_n)}",
        on_thread + on_ktile,
        dpad + rpad,
        P,
    )
    umap = umap.union(
        tiled(
            shape.init,
            f"{_ints([first] * nr)}, 0, 0, {tailv(['0'] * nr + regs, tail_n)}",
            on_thread,
            dpad,
            P,
        )
    )
    for pos, s in enumerate(shape.epilogue):
        out = tailv(["0"] * nr + regs + [str(pos)], tail_n)
        umap = umap.union(
            tiled(s, f"{_ints([str(k) for k in KT])}, 0, 0, {out}", on_thread, dpad, P)
        )
    at = list(kts)  # where the copies of k-tile kts run: S-1 k-tiles early when pipelined
    if stages > 1:
        at[multi[0]] = f"{kts[multi[0]]} - {stages - 1}"
    for sub, (cstmt, cdom, n, counters) in enumerate(copy_doms):
        # each thread's copies in loops of constant trip count (q from 0), not over the
        # elements themselves (whose bounds depend on the thread)
        es = [f"e{i}" for i in range(n)]
        qs = [f"q{i}" for i in range(n)]
        npar = cdom.dim(isl.dim_type.param)
        cpar = [cdom.get_dim_name(isl.dim_type.param, i) for i in range(npar)]
        cm = isl.Map(
            f"[{', '.join(cpar)}] -> {{ {cstmt}[{_ints(kts + es)}] -> "
            f"[{_ints(at)}, 0, {sub}, {tailv(qs, tail_n)}] : "
            f"{' and '.join(counters) or '0 = 0'} }}",
            context=ctx,
        ).intersect_domain(cdom)
        umap = umap.union(isl.UnionMap.from_map(cm))
    if stages > 1:  # one async group per k-tile (the last S-1 empty), then wait for kt's
        j = multi[0]
        groups = ((len(copy_doms), COMMIT, 1 - stages), (len(copy_doms) + 1, WAIT, 0))
        for sub, sname, first in groups:
            kdom = " and ".join(
                f"{first if i == j else 0} <= {k} < {n}"
                for i, (k, n) in enumerate(zip(kts, KT, strict=True))
            )
            umap = umap.union(
                isl.UnionMap(
                    f"{{ {sname}[{_ints(kts)}] -> [{_ints(kts)}, 0, {sub}, {tailv([], tail_n)}] : "
                    f"{kdom} }}",
                    context=ctx,
                )
            )
    for ph, sname in ((1, SYNC_BEFORE), (3, SYNC_AFTER)):
        kdom = " and ".join(f"0 <= {k} < {n}" for k, n in zip(kts, KT, strict=True))
        umap = umap.union(
            isl.UnionMap(
                f"{{ {sname}[{_ints(kts)}] -> [{_ints(kts)}, {ph}, 0, {tailv([], tail_n)}] : "
                f"{kdom} }}",
                context=ctx,
            )
        )
    cons = [f"0 <= {b} < {g}" for b, g in bused]
    cons += [f"0 <= {t} < {n}" for t, n in tused]
    cons += [f"0 <= {c} < {g}" for pr in promotions for c, g in pr.grid]
    context = isl.Set(f"[{P}] -> {{ : {' and '.join(cons)} }}", context=ctx)
    umap = umap.coalesce()  # the context (parameter ranges) goes to the AST build
    guards = {
        s.name: [
            (lo, hi) if lo + g * b - 1 > hi else (lo, None)  # type: ignore[misc]
            for (lo, hi), g, b in zip(shape.data, G, B, strict=True)
        ]
        for s in shape.epilogue
    }
    reg_iters = regs
    notes = list(tiling.reasons) + [f"{p.tensor}: shared ({p.reason})" for p in promotions]
    notes += [f"{f.tensor}: {f.reason}" for f in hoisted]
    notes += [
        f"{t}: not held in registers ({why}); a shared tile instead"
        for t, why in not_hoisted.items()
        if any(p.tensor == t for p in promotions)
    ]
    notes.append(store_why)
    if stages > 1:
        ahead = "kt+1" if stages == 2 else f"kt+1..kt+{stages - 1}"
        notes.append(
            f"shared tiles in {stages} stages over k-tile loop {kts[multi[0]]}: k-tiles {ahead} "
            f"are copied with cp.async while kt is used "
            f"({stages} x {4 * sum(p.floats for p in promotions)} B)"
        )
    notes.append(
        f"epilogue on the register tile before the single store: "
        f"{', '.join(s.prim for s in shape.epilogue)}"
    )
    promoted = {p.tensor for p in promotions}
    fragments, fragment_notes = register_fragments(
        shape.update,
        umap,
        iterators,
        reg_iters,
        reg_shape,
        [(n, access_function(m)) for n, m in shape.operands if n in promoted],
        tiling.accumulators,
        sum(f.floats for f in hoisted),
    )
    notes += fragment_notes
    fragments = hoisted + fragments
    return GemmKernel(
        sm,
        isl.Schedule.from_domain(umap.domain()),
        context,
        bnames,
        [t for t, _ in tused],
        [g for _, g in bused],
        [n for _, n in tused],
        shape.data,
        notes=notes,
        shape=shape,
        tiling=tiling,
        schedule_map=umap,
        iterators=iterators,
        promotions=promotions,
        reg_iters=reg_iters,
        guards=guards,
        tile_context=ranges,
        reg_shape=reg_shape,
        vector_stores=vector_stores,
        stages=stages,
        pipelined=kts[multi[0]] if stages > 1 else "",
        fragments=fragments,
        layout=tiling.decision(math.prod(g for _, g in bused), stages),
    )


def _vector_stores(
    shape: GemmShape, model, B, regs_n: int, bs, bused
) -> tuple[dict[str, str], str]:
    """The epilogue statements whose stores may be whole vectors (all or none), and why:
    ``regs_n`` (each thread's columns) must be a multiple of the vector width."""
    ctx = model.ctx
    nd = len(shape.data)
    if regs_n % VECTOR_WIDTH:
        return {}, f"epilogue stores scalar: {regs_n} columns per thread"
    storing = [
        s
        for s in shape.epilogue
        if model.tensors[s.write.get_tuple_name(isl.dim_type.out)].role == "output"
    ]
    if not storing:
        return {}, "epilogue stores: none to global memory"
    out: dict[str, str] = {}
    ds = [f"d{i}" for i in range(nd)]
    bnames = [b for b, _ in bused]
    for s in storing:
        name = s.write.get_tuple_name(isl.dim_type.out)
        tshape = tuple(model.tensors[name].shape)
        if model.tensors[name].dtype != "float32":  # a float4 run holds four floats
            return {}, f"epilogue stores scalar: {name} is {model.tensors[name].dtype}"
        ident = isl.Map(
            f"{{ {s.name}[{_ints(ds)}] -> {name}[{_ints(ds)}] }}", context=ctx
        ).intersect_domain(s.domain)
        if len(tshape) != nd or not s.write.is_equal(ident):
            return {}, f"epilogue stores scalar: {name} is not stored at the data coordinates"
        lo = [f"{lo} + {b} * {bb}" for (lo, _), b, bb in zip(shape.data, B, bs, strict=True)]
        ranges = " and ".join([f"0 <= {b} < {g}" for b, g in bused] + ["0 = 0"])
        cons = " and ".join(
            f"{lo_i} <= {d} < {lo_i} + {b}" for d, lo_i, b in zip(ds, lo, B, strict=True)
        )
        box = isl.Set(
            f"[{_ints(bnames)}] -> {{ {name}[{_ints(ds)}] : {cons} and {ranges} }}", context=ctx
        )
        # Each thread's runs start VECTOR_WIDTH apart from the tile's first column.
        proof = prove_vector_copy(box, lo, list(B), tshape)
        if proof.width == 1:
            return {}, f"epilogue stores scalar: {name}: {proof.why}"
        out[s.name] = name
    return out, (
        f"epilogue stores {', '.join(sorted(set(out.values())))} as {VECTOR_WIDTH * 32}-bit "
        f"vectors: each thread owns runs of {VECTOR_WIDTH} columns; isl proves every run "
        f"16-byte aligned and never straddling the array's edge"
    )


def gemm_placements(gk: GemmKernel) -> dict[str, Placement]:
    """Where each tensor of a GEMM kernel lives, with the reason."""
    model = gk.scheduled.model
    shape, tiling = gk.shape, gk.tiling
    assert shape is not None and tiling is not None
    promoted = {p.tensor: p for p in gk.promotions}
    hoisted = {f.tensor: f for f in gk.fragments if f.hoisted}
    acc = f"{shape.update.prim}_acc"
    out: dict[str, Placement] = {}
    read_inside = {m.get_tuple_name(isl.dim_type.out) for s in shape.epilogue for _, m in s.reads}
    for name, role in model.tensors.items():
        if name in promoted:
            out[name] = Placement(name, "shared", promoted[name].reason)
        elif name in hoisted:
            out[name] = Placement(name, "global", f"k-invariant operand: {hoisted[name].reason}")
        elif role.role == "input":
            out[name] = Placement(name, "global", "micrograph input (epilogue operand)")
        elif name == acc:
            tile = "x".join(str(r) for r in tiling.regs if r > 1) or "1"
            out[name] = Placement(
                name,
                "register",
                f"register micro-tile {tile} per thread ({tiling.accumulators} accumulators)",
            )
        elif role.role == "output":
            out[name] = Placement(
                name,
                "global",
                "micrograph output",
                register_copy=name in read_inside,
            )
        else:
            out[name] = Placement(
                name, "register", "one element per micro-tile iteration (epilogue)"
            )
    return out
