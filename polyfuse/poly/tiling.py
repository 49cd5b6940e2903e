"""Two-level tiling of GEMM-like micrographs: block tile → per-thread register micro-tile.

A micrograph is *GEMM-like* (:func:`detect_gemm`) when isl's model shows one sum reduction
whose update multiplies reads of micrograph inputs, at least two of them reused across
threads (each read ignores some data dimension of extent > 1, so neighbouring threads read
the same element: matmul, batched matmul, attention's products, conv as implicit GEMM), and
every other statement is an elementwise consumer of the reduction's result on the same data
domain (bias, GELU, residual, scale: the *epilogue*). Everything else keeps the one-element-
per-thread mapping of :mod:`polyfuse.poly.mapping`.

Tiling. The band isl computed for the micrograph is permutable; its data members are tiled
twice (block tile ``B``, then ``T`` threads × ``R = B / T`` registers, cyclic so that
neighbouring threads touch neighbouring elements) and its reduction members by ``TK`` (the
k-tile loop). The tiled schedule is an affine map of isl's band (:func:`tiled_schedule`)::

    update   S[d, r] -> [kt, 2, 0, kk, ii, 0]   d = B*b + t + T*ii, r = TK*kt + kk
    init     S[d]    -> [-1, 0, 0, 0, ii, 0]
    epilogue S[d]    -> [KT, 0, 0, 0, ii, pos]

Data and reduction ranges are rounded up to whole tiles (*padded*), so every loop of the
micro-tile has a constant trip count and unrolls into registers; padded reduction terms
read zeros from the shared tiles (see :mod:`polyfuse.poly.promote`) and padded outputs are
never stored (the printer guards the epilogue with the original domain).

Tile sizes come from :func:`choose_gemm_tiles`: every candidate is priced by the cost model
(:mod:`polyfuse.poly.costs`) on a description of the kernel it would become — its instruction
mix per k-tile, registers and occupancy, shared-memory wavefronts, L2 fills and waves over the
SMs. Every choice is recorded with its reason.
"""

from __future__ import annotations

import math

import islpy as isl

from polyfuse.base.decision import DecisionKind, Refusal, noted, refused
from polyfuse.base.decision_data import GemmTileData
from polyfuse.base.errors import ScheduleError
from polyfuse.graph.dtypes import DTYPES
from polyfuse.graph.expr import Binary, zero_padded_read
from polyfuse.poly.costs import KernelDesc, Mix, model_kernel
from polyfuse.poly.costs.gemm import GemmProblem, gemm_loop_code, gemm_tile_desc, ktile_mix
from polyfuse.poly.costs.gemm_code import NO_PERIOD, LoopCode, Operand, TileLayout
from polyfuse.poly.costs.ops import ExprOps, count_ops, global_read
from polyfuse.poly.device import DeviceSpec
from polyfuse.poly.gemm_shape import (
    GemmShape,
    GemmTiling,
    access_function,
    access_groups,
    tile_label,
)
from polyfuse.poly.policy import GEMM_REG_BUDGET, gemm_tile_budget, gemm_tile_registers
from polyfuse.poly.schedule import ScheduledMicrograph
from polyfuse.poly.tile_fit import fit_tiling

#: why a tiling was not ranked but given (``MappingConfig.gemm_tile``), unless the config
#: carries its own reason (``MappingConfig.gemm_tile_reason``: a tuned tiling)
FORCED_TILE_REASON = "tile sizes forced by MappingConfig.gemm_tile"


def _box(s: isl.Set) -> list[tuple[int, int]]:
    return [
        (s.dim_min_val(i).to_python(), s.dim_max_val(i).to_python())
        for i in range(s.dim(isl.dim_type.set))
    ]


def _is_box(s: isl.Set) -> bool:
    b = _box(s)
    cons = " and ".join(f"{lo} <= x{i} <= {hi}" for i, (lo, hi) in enumerate(b))
    names = ", ".join(f"x{i}" for i in range(len(b)))
    full = isl.Set(f"{{ [{names}] : {cons} }}", context=s.get_ctx())
    return s.reset_tuple_id().is_equal(full)


def _factors(e) -> list:
    if isinstance(e, Binary) and e.op == "mul":
        return _factors(e.a) + _factors(e.b)
    return [e]


def _zero_padded_read(e) -> bool:
    """A factor that is a read, a byte read widened to int32, or either under
    ``where(cond, ., 0)`` (conv's padding): :func:`polyfuse.graph.expr.zero_padded_read`."""
    return zero_padded_read(e) is not None


def _independent_dims(m: isl.Map, ndata: int) -> set[int]:
    """Data dims of the update the access function (its affine hull) does not depend on."""
    h = isl.Map.from_basic_map(m.affine_hull()).reset_tuple_id(isl.dim_type.in_)
    n = h.dim(isl.dim_type.in_)
    ins = ", ".join(f"i{k}" for k in range(n))
    out = set()
    for d in range(ndata):
        moved = ", ".join(f"i{k} + 1" if k == d else f"i{k}" for k in range(n))
        shift = isl.Map(f"{{ [{ins}] -> [{moved}] }}", context=h.get_ctx())
        if shift.apply_range(h).is_equal(h):
            out.add(d)
    return out


#: the shortest reduction :func:`vector_contraction` puts on lanes: one warp's worth
VECTOR_REDUCTION_MIN = 32


def vector_contraction(sm: ScheduledMicrograph) -> bool:
    """Whether ``sm`` is a matrix-vector product: one sum reduction, at most one of its data
    dims longer than 1 (no register tile has anything to reuse, :func:`detect_gemm` declines
    it), reducing at least :data:`VECTOR_REDUCTION_MIN` elements per output. Its op kind is
    opaque (the vector's access broadcasts into every row), but its loops are a reduction's:
    mapped with lanes along the reduced dims, not one serial loop per output (a classifier's
    logit, 512 x 256 times a vector: 2 blocks of 256 threads each reading a row alone,
    modelled 47 us on an H100; a warp per row, 3.1 us)."""
    ups = [s for s in sm.model.statements if s.role == "update"]
    if len(ups) != 1:
        return False
    t = ups[0].tensor
    red = t.op.reduce if t.op is not None else None
    if red is None or red.op != "sum":
        return False
    assert t.op is not None
    data = [a for a in t.op.axes if a.extent > 1]
    return len(data) <= 1 and math.prod(a.extent for a in red.axes) >= VECTOR_REDUCTION_MIN


def detect_gemm(
    sm: ScheduledMicrograph,
    dtypes: tuple[str, ...] = ("float32",),
    only: frozenset[str] | None = None,
) -> GemmShape | Refusal:
    """The micrograph's GEMM structure, or why it is not GEMM-like (a :class:`Refusal` about
    the micrograph); its operands must be of one of ``dtypes`` (the float32 tiles;
    tensorization asks for 16-bit ones). ``only``: the primitives to consider (the others'
    statements left out: what a micrograph of those alone would be,
    :func:`epilogue_split`)."""
    model = sm.model
    statements = [s for s in model.statements if only is None or s.prim in only]

    def no(why: str) -> Refusal:
        return refused(DecisionKind.GEMM_TILE, why, sm.name)

    ups = [s for s in statements if s.role == "update"]
    if len(ups) != 1:
        return no("not exactly one reduction")
    up = ups[0]
    prim = up.prim
    t = up.tensor
    red = t.op.reduce if t.op is not None else None
    if red is None or red.op != "sum":
        return no("the reduction is not a sum")
    if any(r.tensor.dtype not in dtypes for r, _ in up.reads if r is not None):
        listed = ", ".join(dtypes[:-1]) + " or " * (len(dtypes) > 1) + dtypes[-1]
        return no(f"the operands are not {listed}")
    init = next(s for s in statements if s.prim == prim and s.role == "init")
    final = next(s for s in statements if s.prim == prim and s.role == "final")
    order = [p for p in model.micrograph.prims if only is None or p in only]
    if order[0] != prim:
        return no("statements run before the reduction (producers in the micrograph)")
    nd = init.dims
    nr = up.dims - nd
    if nd < 2 or nr < 1:
        return no("fewer than two data dimensions")
    if not _is_box(up.domain) or not _is_box(init.domain):
        return no("the domain is not a box")
    data = _box(init.domain)
    redb = _box(up.domain)[nd:]
    epilogue = [final] + [s for s in statements if s.prim != prim]
    for s in epilogue:
        if s.role not in ("compute", "final") or s.dims != nd or _box(s.domain) != data:
            return no(f"{s.name} is not elementwise on the reduction's domain")
        if not _is_box(s.domain):
            return no(f"{s.name}'s domain is not a box")
        for _r, m in s.reads:
            # Values computed inside the micrograph are read at the statement's own element
            # (they live in one register per micro-tile iteration).
            name = m.get_tuple_name(isl.dim_type.out)
            if model.tensors[name].role == "input":
                continue
            writer = next(
                w
                for w in statements
                if w.write.get_tuple_name(isl.dim_type.out) == name and w.dims == nd
            )
            wrote = writer.write.set_tuple_name(isl.dim_type.in_, s.name)
            if not m.reset_tuple_id(isl.dim_type.out).is_equal(
                wrote.reset_tuple_id(isl.dim_type.out)
            ):
                return no(f"{s.name} reads {name} at another element")
    factors = _factors(red.body)
    if not all(_zero_padded_read(f) for f in factors):
        return no("the update is not a product of reads")
    operands = []
    reuse = []
    for r, m in up.reads:
        if r is None:
            continue
        name = m.get_tuple_name(isl.dim_type.out)
        if model.tensors[name].role != "input":
            return no(f"the update reads {name}, which the micrograph computes")
        if m.intersect_domain(up.domain).range().is_empty():  # every read on the padding
            return no(f"the update never reads {name} inside its array")
        if m.dim(isl.dim_type.out) == 0:  # no shared tile to stage it in
            return no(f"the update reads {name}, a 0-d tensor (a scalar, not a matrix)")
        operands.append((name, m))
        reuse.append({d for d in _independent_dims(m, nd) if data[d][1] > data[d][0]})
    if sum(1 for r in reuse if r) < 2:
        return no("fewer than two operands are reused across threads (memory-bound)")
    # isl's band must be permutable with the data members coincident (tiling is then legal).
    root = sm.schedule.get_root()
    band = root.child(0) if root.has_children() else None
    if band is None or band.get_type() != isl.schedule_node_type.band:
        return no("no outer band")
    # The data members must lead isl's permutable band, coincident and in the update's loop
    # order; the reduction members may follow in this band or in nested ones (a sum may be
    # reassociated, so the k-tiled order of its terms is legal too).
    nb = band.band_n_member()
    if not band.band_get_permutable() or nb < nd:
        return no("the outer band is not permutable over the data dims")
    if not all(band.band_member_get_coincident(i) for i in range(nd)):
        return no("data members are not coincident")
    part = isl.UnionMap.from_multi_union_pw_aff(band.band_get_partial_schedule())
    for s in [init, up, *epilogue]:
        got = part.intersect_domain(isl.UnionSet.from_set(s.domain))
        lst = got.get_map_list()
        if lst.n_map() != 1:
            return no("unexpected band")
        gm = lst.get_at(0).reset_tuple_id(isl.dim_type.out)
        gm = gm.project_out(isl.dim_type.out, nd, gm.dim(isl.dim_type.out) - nd)
        dims = ", ".join(f"i{k}" for k in range(s.dims))
        data_ids = ", ".join(f"i{k}" for k in range(nd))
        want = isl.Map(
            f"{{ {s.name}[{dims}] -> [{data_ids}] }}", context=s.domain.get_ctx()
        ).intersect_domain(s.domain)
        if not gm.is_equal(want):
            return no(f"isl's band is not the data loops of {s.name}")
    return GemmShape(init, up, epilogue, data, redb, operands, reuse)


def epilogue_split(sm: ScheduledMicrograph) -> list[list[str]] | None:
    """``[contraction and epilogue, rest]`` where :func:`detect_gemm` declines ``sm`` for its
    epilogue alone: the contraction with the longest run of its following primitives that is
    elementwise on its domain is a GEMM (of any dtype), the rest reads it at other elements
    (an LSTM's gate slices of its gate projection, 32 x 2048: the fused micrograph ran one
    output per thread, a serial loop over 512 terms each). None where the whole micrograph is
    GEMM-like, or no prefix of it is."""
    dtypes = tuple(DTYPES)
    order = list(sm.model.micrograph.prims)
    if len(order) < 2 or not isinstance(detect_gemm(sm, dtypes, frozenset(order[:1])), GemmShape):
        return None  # not a contraction the GEMM path takes alone
    if not isinstance(detect_gemm(sm, dtypes), Refusal):
        return None
    for n in range(len(order) - 1, 0, -1):  # the longest GEMM-like prefix
        if isinstance(detect_gemm(sm, dtypes, frozenset(order[:n])), GemmShape):
            return [order[:n], order[n:]]
    return None


def affine_coefficients(
    aff: isl.Aff | isl.Constraint, n_in: int
) -> tuple[tuple[int, ...], int] | None:
    """``aff``'s integer coefficients on the input dims and its constant, or None (a
    division, a rational coefficient)."""
    vals = [aff.get_coefficient_val(isl.dim_type.in_, j) for j in range(n_in)]
    vals.append(aff.get_constant_val())
    divs = aff.get_local_space().dim(isl.dim_type.div)
    if any(not aff.get_coefficient_val(isl.dim_type.div, j).is_zero() for j in range(divs)):
        return None
    if not all(v.is_int() for v in vals):
        return None
    ints = [v.to_python() for v in vals]
    return tuple(ints[:-1]), ints[-1]


def _bounded_row(m: isl.Map, n_in: int) -> tuple[tuple[int, ...], int, int] | None:
    """For a one-dim access ``m`` that is no affine function (a grouped conv's input channel,
    ``16 * floor(co / 16) + ci``): an affine ``f`` and a slack ``s`` with ``f - s <= m <= f``
    from the convex hull of ``m`` without its divisions (``co + ci - 15 <= c <= co + ci``),
    the pair of bounds with the least slack; None when the hull has no such pair."""
    hull = m.remove_divs().simple_hull()
    upper: dict[tuple[int, ...], int] = {}
    lower: dict[tuple[int, ...], int] = {}
    for c in hull.get_constraints():
        if c.is_equality():
            continue
        out = c.get_coefficient_val(isl.dim_type.out, 0)
        if not (out.is_one() or out.is_negone()):
            continue
        row = affine_coefficients(c, n_in)
        if row is None:
            continue
        coef, const = row
        if out.is_negone():  # -c + f(x) + k >= 0: c <= f(x) + k
            upper[coef] = min(upper.get(coef, const), const)
        else:  # c + g(x) + k >= 0: c >= -g(x) - k
            key = tuple(-x for x in coef)
            lower[key] = max(lower.get(key, -const), -const)
    pairs = [(upper[k] - lower[k], k) for k in upper if k in lower and upper[k] >= lower[k]]
    if not pairs:
        return None
    slack, coef = min(pairs)
    return coef, upper[coef], slack


def _periodic_row(
    aff: isl.Aff, n_in: int
) -> tuple[tuple[int, ...], int, tuple[int, int, int]] | None:
    """For a one-dim subscript ``a * x_j + c + e * floor(x_j / D)`` of one input dim (a
    reshape's ``k // D`` or ``k % D``): its form within a tile of ``x_j`` that stays inside
    one period of ``D`` — coefficients (``a`` on ``x_j``), the constant ``c`` — and the period
    ``(j, D, e)``; None for any other form."""
    divs = aff.get_local_space().dim(isl.dim_type.div)
    if divs != 1:
        return None
    div = aff.get_div(0)
    e = aff.get_coefficient_val(isl.dim_type.div, 0)
    den = div.get_denominator_val()
    if not (e.is_int() and den.is_int()) or not div.get_constant_val().is_zero():
        return None
    d = den.to_python()
    on = [j for j in range(n_in) if not div.get_coefficient_val(isl.dim_type.in_, j).is_zero()]
    if len(on) != 1 or d < 2:
        return None
    (j,) = on
    if div.get_coefficient_val(isl.dim_type.in_, j).inv().to_python() != d:
        return None  # floor(x_j / D) itself, not floor(m x_j / D)
    vals = [aff.get_coefficient_val(isl.dim_type.in_, x) for x in range(n_in)]
    const = aff.get_constant_val()
    if any(not v.is_zero() for x, v in enumerate(vals) if x != j) or not all(
        v.is_int() for v in (*vals, const)
    ):
        return None
    coef = tuple(vals[x].to_python() if x == j else 0 for x in range(n_in))
    return coef, const.to_python(), (j, d, e.to_python())


def _single_piece(m: isl.Map) -> isl.Aff | None:
    """The one (quasi-)affine piece of a single-valued one-dim access ``m``, or None."""
    if not m.is_single_valued():
        return None
    pieces = isl.PwMultiAff.from_map(m).get_pw_aff(0).get_pieces()
    return pieces[0][1] if len(pieces) == 1 else None


def affine_rows(
    m: isl.Map,
) -> tuple[
    tuple[tuple[tuple[int, ...], int], ...], tuple[int, ...], tuple[tuple[int, int, int], ...]
]:
    """Per output dim of access ``m``, its subscript as coefficients on the input dims and a
    constant (the affine hull, without the domain's bounds), a slack and a period: slack and
    period ``(-1, 0, 0)`` for an affine subscript; for a reshape's ``k // D`` or ``k % D``,
    its form within a tile inside one period and the period (:func:`_periodic_row`); for
    another division, the affine upper bound of :func:`_bounded_row` and how far below it the
    subscript may fall. ``((), (), ())`` when some subscript has none of these."""
    n_in = m.dim(isl.dim_type.in_)
    n_out = m.dim(isl.dim_type.out)
    rows, slack, periods = [], [], []
    for i in range(n_out):
        one = m.project_out(isl.dim_type.out, i + 1, n_out - i - 1).project_out(
            isl.dim_type.out, 0, i
        )
        hull = _single_piece(isl.Map.from_basic_map(one.affine_hull()))
        got = affine_coefficients(hull, n_in) if hull is not None else None
        if got is not None:
            rows.append(got)
            slack.append(0)
            periods.append(NO_PERIOD)
            continue
        quasi = _single_piece(one)
        periodic = _periodic_row(quasi, n_in) if quasi is not None else None
        if periodic is not None:
            rows.append(periodic[:2])
            slack.append(0)
            periods.append(periodic[2])
            continue
        bounded = _bounded_row(one, n_in)
        if bounded is None:
            return (), (), ()
        rows.append(bounded[:2])
        slack.append(bounded[2])
        periods.append(NO_PERIOD)
    return tuple(rows), tuple(slack), tuple(periods)


def gemm_problem(shape: GemmShape, m_dim: int, kin: int) -> GemmProblem:
    """What ``shape`` computes, for the cost model: the extents, each operand's subscripts
    (affine rows, :func:`affine_rows`) and array shape, one per access group (a tensor read
    through two access functions, ``q @ k^T`` of a merged ``qkv``, is two operands with a
    tile each, as the kernel copies them), the matrix plane's rows ``m_dim``,
    the tiled reduction dim ``kin``, the distinct bytes (isl footprints of the operands, one
    output) and the epilogue's instructions per output element (inputs such as a bias read
    from global memory, values computed in the kernel from registers)."""
    ext = [hi - lo + 1 for lo, hi in shape.data]
    rext = [hi - lo + 1 for lo, hi in shape.red]
    reads = operand_elements(shape)  # each operand's bounding box (a box, or nearly)
    arrays = {
        m.get_tuple_name(isl.dim_type.out): tuple(r.tensor.shape)
        for r, m in shape.update.reads
        if r is not None
    }
    operands = []
    for g in access_groups(shape):  # q @ k^T of a merged qkv: two operands of one array
        m = next(
            m for n, m in shape.operands if n == g.tensor and access_function(m).is_equal(g.access)
        )
        rows, slack, periods = affine_rows(m)
        operands.append(Operand(g.key, arrays[g.tensor], rows, slack, periods))
    return GemmProblem(
        data=tuple(ext),
        red=tuple(rext),
        operands=tuple(operands),
        m_dim=m_dim,
        kin=kin,
        bytes_read=4 * reads,
        bytes_written=4 * math.prod(ext),
        epilogue=epilogue_mix(shape),
    )


def epilogue_mix(shape: GemmShape) -> Mix:
    """The instructions of ``shape``'s epilogue per output element: its tensor expressions
    (inputs such as a bias read from global memory, values the kernel computed from
    registers), without the store."""
    written = {st.write.get_tuple_name(isl.dim_type.out) for st in shape.epilogue}
    ops = ExprOps()
    for st in shape.epilogue:
        t = st.tensor
        if st.role != "compute" or t.op is None:
            continue
        inner = {id(r) for r, m in st.reads if m.get_tuple_name(isl.dim_type.out) in written}
        count_ops(
            t.op.body,
            ops,
            lambda r, c, inner=inner: None if id(r) in inner else global_read(r, c),
        )
    return ops.mix()


def operand_elements(shape: GemmShape) -> int:
    """The elements ``shape``'s operands read: each access's bounding box over the data and
    reduction bounds, taken in the access's own domain (a grouped conv's split dims
    included)."""
    total = 0
    for _, m in shape.operands:
        dom = isl.Set.universe(m.domain().get_space())
        for i, (lo, hi) in enumerate([*shape.data, *shape.red]):
            dom = dom.lower_bound_val(isl.dim_type.set, i, lo).upper_bound_val(
                isl.dim_type.set, i, hi
            )
        total += math.prod(hi - lo + 1 for lo, hi in _box(m.intersect_domain(dom).range()))
    return total


def rank_gemm_tiles(
    shape: GemmShape,
    device: DeviceSpec,
    forced: tuple[int, int, int, int, int] | None = None,
    limit: int = 8,
    forced_reason: str = "",
    stages: int = 1,
) -> list[GemmTiling]:
    """The ``limit`` best tile sizes by the cost model (or ``forced``, for ``forced_reason``:
    default :data:`FORCED_TILE_REASON`), best first, each with the reasons for its choice.

    Every candidate is priced by the one cost model (:mod:`polyfuse.poly.costs`) on a
    description of the kernel it would become (:func:`polyfuse.poly.costs.gemm.gemm_tile_desc`:
    per-tile instruction mix, registers and occupancy, shared-memory wavefronts, L2 fills,
    waves), with its shared tiles in ``stages`` buffers where they fit the GEMM budget."""
    forced_reason = forced_reason or FORCED_TILE_REASON
    nd = len(shape.data)
    ext = [hi - lo + 1 for lo, hi in shape.data]
    rext = [hi - lo + 1 for lo, hi in shape.red]
    # The two innermost data dims that some operand reuses form the matrix (m, n) plane;
    # other data dims (batch, heads, conv's n/oh) get block tiles of 1.
    reused = sorted({d for r in shape.reuse for d in r})
    # Columns: the innermost data dim (coalesced stores). Rows: a dim along which the operand
    # that depends on the columns is reused (matmul: A's rows; conv: output channels).
    n_dim = nd - 1
    col_ops = [r for r in shape.reuse if n_dim not in r and r]
    rows = sorted({d for r in col_ops for d in r if d != n_dim and ext[d] > 1})
    m_dim = rows[-1] if rows else next((d for d in reversed(range(nd - 1)) if ext[d] > 1), nd - 2)
    gemm = shape.update.prim
    reasons: list[str] = [
        noted(
            DecisionKind.GEMM_TILE,
            f"matrix plane: data dims {m_dim} (rows, extent {ext[m_dim]}) x {n_dim} "
            f"(columns, extent {ext[n_dim]}); reused dims {reused}",
            gemm,
        )
    ]
    # Reduction tiles: the longest reduction dim by TK, the others whole (outer ones by 1
    # where no tiling fits with them whole).
    kin = max(range(len(rext)), key=lambda j: rext[j])  # the longest reduction dim is tiled
    problem = gemm_problem(shape, m_dim, kin)
    cands: dict[tuple[int, int, int, int, int], tuple] = {}
    space = [
        (bm, bn, tm, tn, tk)
        for bm in (16, 32, 64, 128)
        for bn in (16, 32, 64, 128)
        for tm in (1, 2, 4, 8)
        for tn in (1, 2, 4, 8)
        for tk in (8, 16, 32)
    ]
    if forced is not None:
        space = [tuple(forced)]
        reasons.append(noted(DecisionKind.GEMM_TILE, f"{forced_reason}={tuple(forced)}", gemm))
    budget = gemm_tile_budget(device)

    def candidates(outer: bool) -> None:
        """Price every tiling of ``space`` into ``cands`` (``outer``: the reduction dims
        outside ``kin`` tiled by 1 instead of whole)."""
        for bm, bn, tm, tn, tk in space:
            thr = (bm // tm) * (bn // tn)
            if bm % tm or bn % tn or (forced is None and thr not in (64, 128, 256)):
                continue
            if gemm_tile_registers(tm, tn) > GEMM_REG_BUDGET and forced is None:
                continue
            kt = min(tk, rext[kin])
            if (bm, bn, tm, tn, kt) in cands:
                continue  # k-tiles past the reduction's extent are the same tiling
            tiling = _tiling(nd, m_dim, n_dim, kin, rext, (bm, bn, tm, tn, kt), outer)
            folded = fit_tiling(shape, tiling)  # the column tile over two dims, as built
            lay = TileLayout(tuple(folded.block), tuple(folded.threads), tuple(folded.tk), stages)
            code = gemm_loop_code(problem, lay, device)
            if code.shared_bytes > budget and forced is None:
                continue
            desc = gemm_tile_desc(problem, code)
            m = model_kernel(desc, device)
            if m.occupancy.blocks_per_sm < 1 and forced is None:
                continue
            cands[(bm, bn, tm, tn, kt)] = (m.us, -thr, bm, bn, tm, tn, kt, tiling, code, desc, m)

    candidates(False)
    outer = [j for j in range(kin) if rext[j] > 1]
    if not cands and outer and forced is None:
        # whole, the outer reduction dims make every shared tile too large (ViT's patch
        # embedding: 3 channels x a 16 x 16 window): one k-tile loop per outer dim instead
        candidates(True)
        if cands:
            dims = ", ".join(f"{j} (extent {rext[j]})" for j in outer)
            reasons.append(
                noted(
                    DecisionKind.GEMM_TILE,
                    f"reduction dims {dims} tiled by 1: whole, with the k-tile of dim {kin}, "
                    f"no tiling fits {budget} B of shared memory per block",
                    gemm,
                )
            )
    ranked = []
    for c in sorted(cands.values(), key=lambda c: c[:7]):
        if ranked and math.isclose(c[0], ranked[-1][0], rel_tol=1e-9):
            # the model cannot tell them apart (mirror images of one loop code): one of them
            # is ranked, the one with more threads, then the smaller block rows
            continue
        ranked.append(c)
    good = [c for c in ranked if loop_share(c[8]) >= LOOP_FFMA_FLOOR]
    low = [c for c in ranked if loop_share(c[8]) < LOOP_FFMA_FLOOR]
    if good and low and good[0][0] > max(FLOOR_SLACK * low[0][0], low[0][0] + FLOOR_SLACK_US):
        t0, c0, t1 = low[0][0], low[0][8], good[0][0]
        reasons.append(
            noted(
                DecisionKind.GEMM_TILE,
                f"tilings below {LOOP_FFMA_FLOOR:.0%} FFMA ranked too: the best of them, "
                f"{tile_label(*low[0][2:7])} at {loop_share(c0):.0%} FFMA, is modelled "
                f"{t0:.1f} us, the best at or above the floor {t1:.1f} us (more than "
                f"{FLOOR_SLACK:g}x and {FLOOR_SLACK_US:g} us: a small GEMM whose larger "
                "tiles leave SMs idle)",
                gemm,
            )
        )
    elif good and low:
        t0, c0 = low[0][0], low[0][8]
        reasons.append(
            noted(
                DecisionKind.GEMM_TILE,
                f"{len(low)} tilings not ranked: their k-tile loop would be below "
                f"{LOOP_FFMA_FLOOR:.0%} FFMA (the loop-quality floor of GEMM-like loops, issue "
                f"20 item 2; the best of them, {tile_label(*low[0][2:7])}, modelled {t0:.1f} us "
                f"at {loop_share(c0):.0%} FFMA)",
                gemm,
                made=False,
            )
        )
        ranked = good
    out = []
    for rank, cand in enumerate(ranked[:limit]):
        t, _, bm, bn, tm, tn, kt, tiling, code, desc, m = cand
        why = list(reasons)
        if rank:
            why.append(
                noted(
                    DecisionKind.GEMM_TILE,
                    f"cost-model rank {rank + 1} (better-ranked tiles did not fit, see below)",
                    gemm,
                )
            )
        data = GemmTileData(
            [bm, bn], [tm, tn], kt, (bm // tm) * (bn // tn), desc.blocks, stages, t
        )
        why += [
            noted(
                (DecisionKind.COST_MODEL, DecisionKind.GEMM_TILE),
                f"{tile_label(bm, bn, tm, tn, kt)}: {m} on {device.name}",
                gemm,
                data=data,
            ),
            f"estimated {desc.registers} registers/thread, {desc.shared_bytes} B shared/block -> "
            f"{m.occupancy.blocks_per_sm} blocks/SM ({m.occupancy.limiter}); {desc.blocks} "
            f"blocks = {m.waves:.2f} waves over {device.sms} SMs",
            loop_code_reason(code, desc),
        ]
        tiling.reasons = why
        tiling.modelled_us = t
        tiling.code = code
        tiling.estimate = desc
        out.append(tiling)
    return out


#: The FFMA share of a k-tile loop below which a tiling is not ranked while another reaches
#: it: item 2 of issue 20 holds GEMM-like hot loops to at least 80 % FFMA (85 % for plain
#: matmuls); a loop below it spends one slot in five or more on loads, addresses and loop
#: control that another tiling of the same micrograph avoids. The loop-code estimate predicts
#: the share within a few percent of the SASS (``python benchmarks/tile_check.py``), and on an
#: FP32-pipe-bound device (A100: 2 warp FFMA per clock, 4 issue slots) the model alone cannot
#: tell such loops apart: the floor keeps the choice where both the model and the instrument
#: put it.
LOOP_FFMA_FLOOR = 0.80
#: How much slower (modelled) the best tiling at or above :data:`LOOP_FFMA_FLOOR` may be than
#: the best below it for the floor to hold. The floor separates loops the model prices alike;
#: where every tiling that meets it is modelled far slower (DeepFM's 512 x 390 x 400 layer:
#: 64 x 64 tiles, 56 blocks for 132 SMs, 41.7 us; 32 x 32 tiles at 70 % FFMA, 14.1 us), the
#: idle SMs, which the model does see, decide.
FLOOR_SLACK = 1.25
#: ... and by more than this many microseconds: a GEMM of a few microseconds (64 x 64 x 64,
#: 3.2 against 4.5 us modelled) is launch- and latency-bound whatever its tile, where the model
#: is least sure, and keeps the floor.
FLOOR_SLACK_US = 5.0


def loop_share(code: LoopCode, worst: bool = True) -> float:
    """The FFMA share of one k-tile of ``code`` as the loop-code estimate predicts it; with
    ``worst``, its lower end: window fragments loaded word by word (what NVRTC merges of them
    varies with the tiling)."""
    m = ktile_mix(code, worst)
    return m.ffma / m.slots if m.slots else 0.0


def _tiling(
    nd: int,
    m_dim: int,
    n_dim: int,
    kin: int,
    rext: list[int],
    tile: tuple[int, ...],
    outer: bool = False,
) -> GemmTiling:
    """The (unfolded) tiling of candidate ``tile`` = (BM, BN, TM, TN, TK): reduction dim
    ``kin`` by TK, the others whole (``outer``: those before ``kin`` by 1)."""
    bm, bn, tm, tn, kt = tile
    block, threads = [1] * nd, [1] * nd
    block[m_dim], block[n_dim] = bm, bn
    threads[m_dim], threads[n_dim] = bm // tm, bn // tn
    tk = [1 if outer and j < kin else e for j, e in enumerate(rext)]
    tk[kin] = kt
    return GemmTiling(block, threads, tk, [], 0.0, (bm, bn, tm, tn, kt))


def loop_code_reason(code: LoopCode, desc: KernelDesc) -> str:
    """The loop code the estimate priced, in words (per k-tile and thread)."""
    ktile = ktile_mix(code)
    loads = ", ".join(
        f"{n} LDS.{32 * w}" for w, n in sorted(code.fragment_loads.items(), reverse=True)
    )
    tiles = ", ".join(
        f"{t.tensor} {'x'.join(map(str, t.size))} {'float4' if t.width == 4 else 'scalar'}"
        f" ({t.copies} per thread)"
        for t in code.tiles
    )
    body = f"{code.body_steps} steps unrolled" + (
        f", {code.bodies} iterations of the loop kept" if code.bodies > 1 else ""
    )
    bound = (
        f"__launch_bounds__({code.threads}, {code.min_blocks})" if code.min_blocks else "no bound"
    )
    return (
        f"loop code (GEMM tile estimate): per k-tile and thread about {ktile.slots:.0f} "
        f"instructions, {ktile.ffma / max(1.0, ktile.slots):.0%} FFMA (at worst "
        f"{loop_share(code):.0%}); {body}; fragments "
        f"{loads or 'none'}; tiles {tiles or 'none'}, {code.stages} stage(s); {bound}; "
        f"padding {code.padding:.1%}"
    )


def choose_gemm_tiles(
    shape: GemmShape,
    device: DeviceSpec,
    forced: tuple[int, int, int, int, int] | None = None,
    stages: int = 1,
) -> GemmTiling:
    """The cost model's best tile sizes (or ``forced``); the reasons name every choice.

    Raises :class:`~polyfuse.base.errors.ScheduleError` when no candidate fits the device (the
    untiled reduction dims make every shared tile too large)."""
    ranked = rank_gemm_tiles(shape, device, forced, limit=1, stages=stages)
    if not ranked:
        raise ScheduleError(
            f"{shape.update.prim}: no GEMM tiling fits {device.name} (reduction extents "
            f"{[hi - lo + 1 for lo, hi in shape.red]}: only the longest is tiled); force one "
            "with MappingConfig.gemm_tile or map it without tiles"
        )
    return ranked[0]
