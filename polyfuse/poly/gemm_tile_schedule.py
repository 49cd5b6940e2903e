"""Tiling of a GEMM's flattened schedule: isl's band rewritten as block, thread, register and
k-tile coordinates (the first step of :func:`polyfuse.poly.promote.build_gemm_kernel`; the
rows become the bands of the kernel's schedule tree, :func:`polyfuse.poly.gemm_tree.tile_tree`).

Every statement of the micrograph runs the data dims of isl's band in order (the update also
its reduction dims after them; :func:`polyfuse.poly.tiling.detect_gemm` checked it), so one
affine map per statement turns the loop vector into the tiled schedule::

    update    S[d, r] -> [kt, 1, 0, kk, ii, 0]   d = B*b + t + T*ii, r = TK*kt + kk
    init      S[d]    -> [-1, 0, 0, 0, ii, 0]
    epilogue  S[d]    -> [KT, 0, 0, 0, ii, pos]

with ``b``/``t`` the block and thread coordinates (isl parameters, left out where their extent
is 1), data and reduction ranges padded to whole tiles. Where isl proves every run of
``VECTOR_WIDTH`` output columns aligned and inside or wholly outside the array
(:func:`vector_stores`), each thread's columns are runs of vectors (loop ``VECTOR_VAR``)
instead of a cyclic spread. :func:`padded_reduction_reads` says when padding the reduction to
whole k-tiles would change the sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from polyfuse.base.decision import DecisionKind, Refusal, refused
from polyfuse.poly.gemm_shape import GemmShape, GemmTiling, access_function
from polyfuse.poly.model import Statement
from polyfuse.poly.vectorize import VECTOR_WIDTH, prove_vector_copy

VECTOR_VAR = "iv"  # the micro-tile loop over one vector's elements (vectorised stores)


def ints(names: list[str]) -> str:
    """``names`` as an isl tuple's body (``a, b, c``)."""
    return ", ".join(names)


def tail(vals: list[str], n: int) -> str:
    """``vals`` padded with zeros to ``n`` schedule dims (the fixed-width tail)."""
    return ", ".join(vals + ["0"] * (n - len(vals)))


@dataclass(frozen=True)
class TileFrame:
    """The coordinates of a tiled GEMM and their constraints, as isl text and sets.

    Names: data dims ``d*``, reduction dims ``r*``, block ``b*`` (``"0"`` where the grid has
    one block along the dim), thread ``t*`` (``"0"`` likewise), register ``ii*``, k-tile
    ``kt*`` and in-tile step ``kk*``."""

    ctx: isl.Context
    grid: list[int]  # blocks per data dim
    ktiles: list[int]  # k-tiles per reduction dim
    bs: list[str]
    ts: list[str]
    bused: list[tuple[str, int]]  # the block parameters and their extents
    tused: list[tuple[str, int]]  # the thread parameters and their extents
    kts: list[str]
    kks: list[str]
    ds: list[str]
    rs: list[str]
    dpad: list[str]  # data dims padded to whole block tiles
    rpad: list[str]  # reduction dims padded to whole k-tiles
    on_thread: list[str]  # d = lo + B b + t + T ii (or runs of vectors)
    on_ktile: list[str]  # r = lo + TK kt + kk
    #: the padded update instances of one block tile and one k-tile (parameters b*, kt*)
    tile: isl.Set
    ranges: isl.Set  # the ranges of b* and kt*
    regs: list[str]  # the micro-tile's loops (register dims of extent > 1, then VECTOR_VAR)
    reg_shape: list[int]  # the accumulator array's shape
    vector_stores: dict[str, str]  # epilogue statement -> the tensor it stores as vectors
    store_why: str

    @property
    def bnames(self) -> list[str]:
        return [b for b, _ in self.bused]

    @property
    def tnames(self) -> list[str]:
        return [t for t, _ in self.tused]

    def tiled(
        self, stmt: Statement, out: str, cons: list[str], pad: list[str], params: str
    ) -> isl.UnionMap:
        """``stmt``'s loop vector → the tiled schedule ``[out]`` under ``cons`` and ``pad``."""
        dims = self.ds + (self.rs if stmt.role == "update" else [])
        tmap = isl.Map(
            f"[{params}] -> {{ {stmt.name}[{ints(dims)}] -> [{out}] : "
            f"{' and '.join(cons)} and {' and '.join(pad)} }}",
            context=self.ctx,
        )
        return isl.UnionMap.from_map(tmap)

    def update_at(self, update: Statement, n: int, params: str) -> isl.UnionMap:
        """The update's schedule ``[kt, 1, 0, kk, ii, 0...]`` (phase 1) with ``n`` tail dims."""
        return self.tiled(
            update,
            f"{ints(self.kts)}, 1, 0, {tail(self.kks + self.regs, n)}",
            self.on_thread + self.on_ktile,
            self.dpad + self.rpad,
            params,
        )

    def reduction_band(self, shape: GemmShape, tk: list[int], params: str) -> isl.UnionMap:
        """The reduction band the k-tiles tile (:func:`polyfuse.poly.gemm_tree.tile_tree`):
        ``r - lo`` per reduction dim for the update, -TK for the init (k-tile -1), KT x TK
        for the epilogue (after the last k-tile)."""
        ups = ", ".join(
            f"{r} - {lo}" if lo >= 0 else f"{r} + {-lo}"
            for r, (lo, _) in zip(self.rs, shape.red, strict=True)
        )
        before = ", ".join(str(-k) for k in tk)
        after = ", ".join(str(n * k) for n, k in zip(self.ktiles, tk, strict=True))
        dims = ints(self.ds)
        text = [f"{shape.update.name}[{ints(self.ds + self.rs)}] -> [{ups}]"]
        text.append(f"{shape.init.name}[{dims}] -> [{before}]")
        text += [f"{s.name}[{dims}] -> [{after}]" for s in shape.epilogue]
        return isl.UnionMap(f"[{params}] -> {{ {'; '.join(text)} }}", context=self.ctx)

    def statement_schedule(self, shape: GemmShape, n: int, params: str) -> isl.UnionMap:
        """The update, the init (at k-tile -1, before every copy; the pipelining pass moves it
        earlier) and the epilogue (after the last k-tile, one position per statement) in the
        tiled schedule."""
        nr = len(self.kts)
        umap = self.update_at(shape.update, n, params)
        umap = umap.union(
            self.tiled(
                shape.init,
                f"{ints(['-1'] * nr)}, 0, 0, {tail(['0'] * nr + self.regs, n)}",
                self.on_thread,
                self.dpad,
                params,
            )
        )
        for pos, s in enumerate(shape.epilogue):
            out = tail(["0"] * nr + self.regs + [str(pos)], n)
            umap = umap.union(
                self.tiled(
                    s, f"{ints([str(k) for k in self.ktiles])}, 0, 0, {out}", self.on_thread,
                    self.dpad, params,
                )
            )  # fmt: skip
        return umap

    def epilogue_guards(self, shape: GemmShape, block: list[int]) -> dict[str, list]:
        """Per epilogue statement, the data dims whose padded tiles pass the extent: (lo, hi)
        there, (lo, None) where whole tiles fit."""
        return {
            s.name: [
                (lo, hi) if lo + g * b - 1 > hi else (lo, None)
                for (lo, hi), g, b in zip(shape.data, self.grid, block, strict=True)
            ]
            for s in shape.epilogue
        }


def tile_frame(shape: GemmShape, model, tiling: GemmTiling) -> TileFrame:
    """The tiled coordinates of ``shape`` under ``tiling`` (vector stores where isl proves
    them)."""
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
    stores, store_why = vector_stores(shape, model, B, R[-1], bs, bused)
    vw = VECTOR_WIDTH if stores else 1
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

    # The padded block tile per k-tile (its footprints are the shared tiles) and the ranges
    # of its parameters.
    ppar = ", ".join(bnames + kts)
    tile = isl.Set(
        f"[{ppar}] -> {{ {shape.update.name}[{ints(ds + rs)}] : "
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
    return TileFrame(
        ctx, G, KT, bs, ts, bused, tused, kts, kks, ds, rs, dpad, rpad, on_thread, on_ktile,
        tile, ranges, regs, reg_shape, stores, store_why,
    )  # fmt: skip


def padded_reduction_reads(shape: GemmShape, tk: list[int], model) -> Refusal | None:
    """Why k-tiles of ``tk`` would give a wrong sum (a refusal about the update), or None
    when they are sound.

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
    return refused(
        DecisionKind.GEMM_TILE,
        f"k-tile {'x'.join(map(str, tk))}: some padded reduction steps would read {reads} "
        "inside their arrays (not zeros)",
        up.prim,
    )


def vector_stores(shape: GemmShape, model, B, regs_n: int, bs, bused) -> tuple[dict[str, str], str]:
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
            f"{{ {s.name}[{ints(ds)}] -> {name}[{ints(ds)}] }}", context=ctx
        ).intersect_domain(s.domain)
        if len(tshape) != nd or not s.write.is_equal(ident):
            return {}, f"epilogue stores scalar: {name} is not stored at the data coordinates"
        lo = [f"{lo} + {b} * {bb}" for (lo, _), b, bb in zip(shape.data, B, bs, strict=True)]
        ranges = " and ".join([f"0 <= {b} < {g}" for b, g in bused] + ["0 = 0"])
        cons = " and ".join(
            f"{lo_i} <= {d} < {lo_i} + {b}" for d, lo_i, b in zip(ds, lo, B, strict=True)
        )
        box = isl.Set(
            f"[{ints(bnames)}] -> {{ {name}[{ints(ds)}] : {cons} and {ranges} }}", context=ctx
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
