"""Several elements per thread for plain (reduction-free) kernels, with 128-bit accesses.

Policy. A memory-bound elementwise kernel with one element per thread issues one 4-byte load
per tensor per thread; the GPU reaches about 70 % of its copy bandwidth that way. Giving each
thread ``E`` consecutive elements of the innermost parallel band member — a strip-mine of that
member (``band_tile`` with sizes ``[1, ..., 1, E]``), the tile band mapped to blocks and threads
as before and the point band (``0 <= c < E``) left as a loop inside the thread — lets a thread
load ``E`` elements of a tensor as ``E/4`` 128-bit ``float4`` accesses, when isl proves that
this is exact.

The proof (:func:`vector_access`), per tensor and per statement touching it, over every band
point the kernel runs (so over every block and thread the mapping will bind): with ``v`` the
innermost band member and ``a`` the tensor's linear element offset that the statement at band
point ``(.., v)`` touches,

- the band → offset relation is single-valued (one element per band point);
- alignment: ``a - v ≡ 0 (mod 4)`` — lane ``c = v mod E`` of a group touches ``base + c``
  with ``base`` a multiple of 4 (16 bytes);
- contiguity: for ``v`` and ``v + 1`` in the same group, the offsets are ``a`` and ``a + 1``.

A tensor that fails (a broadcast along the innermost member, a row stride that is not a
multiple of 4, a transpose) keeps scalar accesses inside the loop. Groups cut short by the
band's end (an inner extent that is not a multiple of ``E``) run the scalar loop; the lowering
(:mod:`polyfuse.cuda.codegen.lower_vectorize`) guards the vector form with the loop's own bound.

:func:`choose_coarsening` coarsens only when some input or output tensor vectorises and enough
threads are left to fill the device: at least ``min_wave_fraction`` of one full-occupancy wave
(``sms × max_threads_per_sm``) after dividing the threads by ``E``. Among the factors that
pass, the cost model (:mod:`polyfuse.poly.costs`) decides: each ``E`` (and one element per
thread) is described as a stream of its launch shape, the kernel's bytes and the share of them
its float4 proofs move by 128-bit accesses (:func:`polyfuse.poly.costs.stream.stream_desc`),
and the factor with the least modelled time is taken — a larger one only when at least
``min_gain`` faster (4 over 8 otherwise: more parallelism).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import islpy as isl

from polyfuse.base.decision import Decided, DecisionKind, Refusal, refused
from polyfuse.base.decision_data import CoarsenData
from polyfuse.graph.access import affine_str, axis_names
from polyfuse.graph.expr import DataIndex, Read
from polyfuse.poly.costs import model_kernel
from polyfuse.poly.costs.stream import stream_desc
from polyfuse.poly.device import DeviceSpec
from polyfuse.poly.guard import Exhausted, Limits, bounded
from polyfuse.poly.islutil import maps_of, sets_of
from polyfuse.poly.model import PolyModel
from polyfuse.poly.schedule import ScheduledMicrograph

VECTOR = 4  # floats per 128-bit access
MARK = "coarsen"  # the isl mark above the point band: "coarsen:<E>"


@dataclass(frozen=True)
class CoarsenConfig:
    """Thresholds of the elements-per-thread cost model (one declared place)."""

    factors: tuple[int, ...] = (4, 8)
    min_wave_fraction: float = 0.25  # threads left after coarsening, in full-occupancy waves
    block_threads: int = 256  # the mapping's block size, for the wave count
    #: a larger factor is taken only when modelled at least this much faster (the model's
    #: resolution: its calibration errors are several per cent)
    min_gain: float = 0.03


@dataclass
class Coarsening:
    """The elements-per-thread decision for one kernel, with the isl proof per tensor."""

    factor: int  # E (1: not coarsened)
    vector: dict[str, bool] = field(default_factory=dict)  # tensor -> float4 accesses proven
    why_scalar: dict[str, str] = field(default_factory=dict)  # tensor -> why not
    tail: bool = False  # some group is cut short by the band's end (scalar loop there)
    reason: str = ""
    #: tensor -> every statement touching it at a band point touches the same element (so a
    #: run may keep the tensor's elements in registers between its writer and its readers)
    uniform: dict[str, bool] = field(default_factory=dict)

    @property
    def record(self) -> Decided:
        """This choice as the plan's decision record (made: more than one element)."""
        kinds = (DecisionKind.COST_MODEL, DecisionKind.ELEMENTS_PER_THREAD)
        vector = sorted(t for t, ok in self.vector.items() if ok)
        data = CoarsenData(self.factor, vector, dict(self.why_scalar), self.tail)
        return Decided(kinds, self.reason, data, made=self.factor > 1)

    decision = record  # the name poly's callers and tests use

    def __str__(self) -> str:
        return self.reason


def _linear(ident: str, shape: tuple[int, ...], ctx: isl.Context) -> isl.Map:
    """``T[i..] -> [a]``: the row-major element offset of tensor ``T``."""
    idx = [f"i{d}" for d in range(len(shape))]
    terms, stride = [], 1
    for d in reversed(range(len(shape))):
        terms.append(f"{stride}*{idx[d]}")
        stride *= shape[d]
    expr = " + ".join(terms) or "0"
    return isl.Map(f"{{ {ident}[{', '.join(idx)}] -> [{expr}] }}", context=ctx)


def _band_to_offsets(
    sm: ScheduledMicrograph, band: isl.UnionMap
) -> dict[str, list[isl.Map] | Refusal]:
    """Per tensor, one map per statement touching it: band point -> linear offset touched
    (statements may touch different parts, e.g. the four gate slices of an LSTM cell, each
    its own float4 stream), or why such a map cannot be built (a refusal about the tensor)."""
    model = sm.model
    ctx = model.ctx
    out: dict[str, list[isl.Map] | Refusal] = {}
    accesses = model.reads.union(model.writes)
    inverse = band.reverse()
    several = _read_through_several_subscripts(model)
    for ident, role in model.tensors.items():
        acc = [m for m in maps_of(accesses) if m.get_tuple_name(isl.dim_type.out) == ident]
        if not acc:
            continue
        if ident in several:
            out[ident] = refused(
                DecisionKind.ELEMENTS_PER_THREAD,
                f"{several[ident]} reads it through several subscripts (a select's branches: "
                "a lane's vector registers hold the elements of one)",
                ident,
            )
            continue
        lin = isl.UnionMap.from_map(_linear(ident, tuple(role.shape), ctx))
        rels: list[isl.Map] | Refusal = []
        for m in acc:  # one map per statement (reads and the write of one statement apart)
            rel = inverse.apply_range(isl.UnionMap.from_map(m)).apply_range(lin).coalesce()
            if rel.is_empty():  # a statement outside the band (a reduction kernel's lane-less)
                continue
            maps = maps_of(rel)
            if len(maps) != 1:
                rels = refused(
                    DecisionKind.ELEMENTS_PER_THREAD, "accessed through several spaces", ident
                )
                break
            rels.append(maps[0])
        if rels:  # touched inside the band
            out[ident] = rels
    return out


def _read_through_several_subscripts(model: PolyModel) -> dict[str, str]:
    """Tensor -> a statement that reads it through more than one distinct access (``where(i <
    8, x[i], x[i - 8])``, a concat of ``x`` with itself). Its read relation can still be one
    aligned, contiguous run per group, but the vector form loads one run per statement and
    tensor, so the other subscript would read the registers of the wrong elements.

    Subscripts are compared as written (their isl text), not as isl's functions on their
    guarded domains: the vector load runs for every band point, whichever branch it feeds. On
    their guards ``x[i0, i1]`` under ``i1 < 1`` and ``x[i0, 0]`` under ``i1 >= 1`` (an edge pad
    of an extent-1 axis) are one function, but a load written ``x[i0, i1]`` reads past ``x``
    where ``i1 = 1``. Text costs no isl work (a reshape fold's quasi-affine subscripts can make
    isl's comparison run for minutes) and only errs toward refusing."""
    out: dict[str, str] = {}
    for st in model.statements:
        names = axis_names(st.tensor)
        seen: dict[str, tuple[str, ...] | None] = {}
        for r, m in st.reads:
            if r is None:
                continue
            ident = m.get_tuple_name(isl.dim_type.out)
            written = _written(r, names)
            if ident in seen and (written is None or written != seen[ident]):
                out.setdefault(ident, st.name)
            seen.setdefault(ident, written)
    return out


def _written(r: Read, names: dict[int, str]) -> tuple[str, ...] | None:
    """Read ``r``'s subscripts as isl text, or None for a data-dependent one (a gather)."""
    if any(isinstance(i, DataIndex) for i in r.indices):
        return None
    return tuple(affine_str(i, names) for i in r.indices)


def vector_access(rel: isl.Map, n: int, factor: int, align: int = VECTOR) -> str:
    """'' when band → offset ``rel`` admits whole-word accesses for groups of ``factor``
    along the innermost of ``n`` band members (each word ``align`` elements, starting at a
    multiple of ``align``); otherwise why not."""
    if not rel.is_single_valued():
        return "several elements per band point"
    ctx = rel.get_ctx()
    vs = [f"v{i}" for i in range(n)]
    last = vs[-1]
    sig = f"[{', '.join(vs)}]"
    misaligned = isl.Map(f"{{ {sig} -> [a] : (a - {last}) mod {align} != 0 }}", context=ctx)
    if not rel.intersect(misaligned).is_empty():
        return f"start offset not a multiple of {align} for some thread"
    nxt = [*vs[:-1], f"{last} + 1"]
    step = isl.Map(
        f"{{ {sig} -> [{', '.join(nxt)}] : {last} mod {factor} != {factor - 1} }}", context=ctx
    )
    dom = rel.domain()
    step = step.intersect_domain(dom).intersect_range(dom)
    ahead = step.apply_range(rel)
    plus_one = rel.apply_range(isl.Map("{ [a] -> [a + 1] }", context=ctx))
    if not ahead.is_equal(plus_one.intersect_domain(step.domain())):
        return "not contiguous along the innermost parallel dimension"
    return ""


def word_elements(itemsize: int, factor: int) -> int:
    """Elements per aligned word of a group of ``factor`` elements: four 4-byte elements per
    float4; 16-bit elements one word per group (eight in 128 bits, four in 64)."""
    return VECTOR if itemsize == 4 else factor


#: isl limits of one tensor's float4 proof. Quasi-affine chains (a space-to-depth of a
#: depth-to-space of a reshape) can make isl's projections blow up: fuzz seed 2075 ran for
#: hours. Every proof of the tests and models ends within the in-process operations.
PROOF_LIMITS = Limits(operations=200_000, seconds=1.0, inline=30_000)


def _bounded_proof(rels: list[isl.Map], points: isl.Set, n: int, factor: int, align: int) -> str:
    """Why the relations ``rels`` (band point -> offset, one per statement) admit no vector
    accesses ('' when they do), under :data:`PROOF_LIMITS`: a proof over them is a refusal."""

    def proof() -> str:
        for rel in rels:
            if not rel.domain().is_equal(points):
                return "not touched at every band point (a guarded access)"
            why = vector_access(rel, n, factor, align)
            if why:
                return why
        return ""

    try:
        out = bounded(points.get_ctx(), proof, PROOF_LIMITS, str, str)
    except Exhausted as e:
        return f"no proof within isl's limits ({e.reason})"
    return out.value or ""


def prove(sm: ScheduledMicrograph, band: isl.UnionMap, n: int, factor: int) -> Coarsening:
    """The per-tensor float4 proof for groups of ``factor`` along the band's last member."""
    c = Coarsening(factor)
    points = isl.Set.from_union_set(band.range())
    for ident, rels in _band_to_offsets(sm, band).items():
        why = rels.reason if isinstance(rels, Refusal) else ""
        role = sm.model.tensors.get(ident)
        align = word_elements(role.itemsize if role is not None else 4, factor)
        if not why:
            why = _bounded_proof(rels, points, n, factor, align)
        if not why:
            c.uniform[ident] = all(r.is_equal(rels[0]) for r in rels[1:])
        c.vector[ident] = not why
        if why:
            c.why_scalar[ident] = why
    last = points.dim_max_val(n - 1).to_python()
    lo = points.dim_min_val(n - 1).to_python()
    c.tail = (last + 1) % factor != 0 or lo % factor != 0
    return c


def _plain_band(sm: ScheduledMicrograph, node: isl.ScheduleNode) -> isl.UnionMap | Refusal:
    """The band's statement → band point map when the kernel is a plain elementwise one, or
    why not (an ELEMENTS_PER_THREAD refusal about the micrograph)."""

    def no(why: str) -> Refusal:
        return refused(DecisionKind.ELEMENTS_PER_THREAD, why, sm.name)

    if any(s.role != "compute" for s in sm.model.statements):
        return no("has a reduction")
    n = node.band_n_member()
    if not all(node.band_member_get_coincident(i) for i in range(n)):
        return no("not every band member is parallel")
    domain = sm.schedule.get_domain()
    band = isl.UnionMap.from_multi_union_pw_aff(node.band_get_partial_schedule())
    band = band.intersect_domain(domain)
    points = band.range()
    for s in sets_of(domain):
        part = band.intersect_domain(isl.UnionSet.from_set(s))
        if not part.is_injective():
            return no(f"{s.get_tuple_name()} runs several instances per band point")
        if not part.range().is_equal(points):
            return no("statements cover different band points")
    if len(sets_of(points)) != 1:
        return no("band points in several spaces")
    return band


def _waves(threads: int, device: DeviceSpec, block: int) -> float:
    """Full-occupancy waves of ``threads`` in blocks of ``block``."""
    blocks = -(-threads // block)
    return blocks / (device.sms * max(1, device.max_threads_per_sm // block))


def _modelled(
    sm: ScheduledMicrograph, elements: int, e: int, vector: set[str], device: DeviceSpec, block: int
) -> float:
    """Modelled time (µs) of the kernel with ``e`` elements per thread, ``vector`` the tensors
    its float4 accesses move (:mod:`polyfuse.poly.costs`)."""
    sizes = {t: r.itemsize * math.prod(r.shape) for t, r in sm.model.tensors.items()}
    roles = sm.model.tensors
    read = sum(n for t, n in sizes.items() if roles[t].role == "input")
    written = sum(n for t, n in sizes.items() if roles[t].role == "output")
    moved = read + written
    share = sum(sizes[t] for t in vector if roles[t].role in ("input", "output"))
    threads = -(-elements // e)
    size = min((r.itemsize for r in roles.values() if r.role in ("input", "output")), default=4)
    word = 16 if size == 4 else min(16, size * e)  # float4, or one word of e 16-bit elements
    desc = stream_desc(
        f"E={e}",
        -(-threads // block),
        block,
        read,
        written,
        vector=share > 0,
        word_bytes=word,
        itemsize=size,
    )
    if 0 < share < moved:  # a part of the bytes moves by float4 accesses
        desc = desc.with_(vector_bytes=share)
    return model_kernel(desc, device).us


def choose_coarsening(
    sm: ScheduledMicrograph,
    node: isl.ScheduleNode,
    device: DeviceSpec,
    forced: int | None = None,
    cfg: CoarsenConfig | None = None,
) -> Coarsening:
    """Elements per thread for the kernel whose outer band is ``node`` (1 = keep one)."""
    cfg = cfg or CoarsenConfig()
    band = _plain_band(sm, node)
    if isinstance(band, Refusal):
        return Coarsening(1, reason=f"one element per thread: {band.reason}")
    n = node.band_n_member()
    elements = isl.Set.from_union_set(band.range()).count_val().to_python()
    roles = sm.model.tensors
    candidates = [forced] if forced else list(cfg.factors)
    best: tuple[float, Coarsening] | None = None
    one = _modelled(sm, elements, 1, set(), device, cfg.block_threads)
    for e in candidates:
        c = prove(sm, band, n, e)
        io = [t for t, ok in c.vector.items() if ok and roles[t].role in ("input", "output")]
        if not io:
            why = "; ".join(f"{t}: {w}" for t, w in sorted(c.why_scalar.items()))
            return Coarsening(1, reason=f"one element per thread: no float4 access ({why})")
        waves = _waves(-(-elements // e), device, cfg.block_threads)
        if not forced and waves < cfg.min_wave_fraction:
            continue
        us = _modelled(sm, elements, e, set(io), device, cfg.block_threads)
        scalar = "; ".join(f"{t} ({c.why_scalar[t]})" for t in sorted(c.why_scalar))
        c.reason = (
            f"{e} elements per thread along the innermost parallel dimension: "
            f"{waves:.2f} waves of {cfg.block_threads}-thread blocks on {device.name}, "
            f"modelled {us:.2f} us (one per thread: {one:.2f} us); "
            f"float4 proven for {', '.join(sorted(io))}"
            + (f"; scalar: {scalar}" if scalar else "")
            + ("; scalar tail where the extent is not a multiple" if c.tail else "")
            + (" (forced by MappingConfig.elements_per_thread)" if forced else "")
        )
        if best is None or us < best[0] * (1 - cfg.min_gain):
            best = (us, c)
    if best is None:
        threads = elements
        return Coarsening(
            1,
            reason=(
                f"one element per thread: {threads} threads; with {min(cfg.factors)} per thread "
                f"they would fill less than {cfg.min_wave_fraction} of a wave on {device.name}"
            ),
        )
    return best[1]


def strip_mine(node: isl.ScheduleNode, factor: int) -> isl.ScheduleNode:
    """Split the band's innermost member into groups of ``factor``: returns the outer (tile)
    band, above a ``coarsen:<factor>`` mark and a one-member point band ``0 <= c < factor``."""
    n = node.band_n_member()
    mv = isl.MultiVal.zero(node.band_get_space())
    for i in range(n):
        mv = mv.set_val(i, isl.Val.int_from_si(node.get_ctx(), factor if i == n - 1 else 1))
    node = node.band_tile(mv)
    point = node.child(0)
    if n > 1:
        point = point.band_split(n - 1).delete()  # the size-1 members are always 0
    mark = isl.Id(f"{MARK}:{factor}", context=node.get_ctx())
    return point.insert_mark(mark).parent()


def whole_warps(sizes: list[int], max_threads: int) -> list[int]:
    """Thread tile sizes with the innermost rounded up to whole warps (partial tiles guarded):
    a coarsened kernel's groups then start at 16-byte steps across whole warps, and its block
    divides the power-of-two blocks of the kernels Layer 3 may pack it with."""
    inner = sizes[-1]
    if inner <= 32 or inner % 32 == 0:
        return sizes
    block = 1
    for s in sizes[:-1]:
        block *= s
    rounded = -(-inner // 32) * 32
    if rounded * block > max_threads:
        return sizes
    return [*sizes[:-1], rounded]
