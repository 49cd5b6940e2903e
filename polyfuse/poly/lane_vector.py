"""Runs of consecutive elements per lane in reduction kernels, with 128-bit accesses.

A run is one 128-bit word of the narrowest global tensor the kernel reads or writes
(:func:`run_length`): 4 elements of float32 (below, "4" stands for it), 8 of float16 or
bfloat16, so a 16-bit row moves 128 bits per lane step; 8-byte dtypes keep runs of 4.

Policy. A reduction kernel's lanes stride the flattened loop index ``f`` of every part
(:mod:`polyfuse.poly.compose`): lane ``l0`` runs ``f = l0 + lanes * c0`` and loads one 4-byte
element per step. Where isl proves it exact, each lane instead takes runs of
:data:`~polyfuse.poly.coarsen.VECTOR` consecutive ``f``: ``f = 4 * (l0 + lanes * c0) + j`` with
``0 <= j < 4`` an inner loop (marked ``coarsen:4``), so a run's global accesses become one
``float4`` each (:mod:`polyfuse.cuda.codegen.lower_vectorize`). The combine of the lanes' partial
accumulators is unchanged (a sum, max or min does not depend on which lane saw which element).

The proof reuses :func:`polyfuse.poly.coarsen.prove` per part, over the map from a loop
statement instance to the band point ``(kept..., f)`` — every kept point (so every block and
thread row) and every ``f`` (so every lane and run): the offset touched is single-valued,
``offset - f`` is a multiple of 4 (each run starts 16-byte aligned; fails for a row length that
is not a multiple of 4, e.g. 47 or 1001, in every row but the first) and consecutive ``f`` of a
run touch consecutive elements. A tensor is loaded (or stored) as float4 only when every part
that touches it inside its loops proves it; the rest stay scalar inside the run. A run cut
short by the loop's end takes the scalar loop (the lowering guards the vector form).

The cost model (:func:`choose_lane_vectors`) takes runs when some input or output tensor is
proven in a part with at least one whole run, and the lanes stride a contiguous space (y- and
all-reductions; an x-reduction's lanes stride the outer, reduced dimension). The lanes keep
their count (block size, occupancy and waves as before) unless a row has fewer runs than lanes
(:func:`polyfuse.poly.cost.lanes_over_runs`).
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from polyfuse.poly.coarsen import VECTOR, Coarsening, prove
from polyfuse.poly.cost import ReductionStrategy, lanes_over_runs
from polyfuse.poly.device import DeviceSpec
from polyfuse.poly.model import PolyModel
from polyfuse.poly.policy import SCALAR_DTYPES
from polyfuse.poly.schedule import ScheduledMicrograph


@dataclass
class LaneVectors:
    """The decision for one reduction kernel: its record and the strategy to map with."""

    coarsening: Coarsening  # factor 1: lanes stride single elements as before
    strategy: ReductionStrategy


def part_band(
    outer: isl.MultiUnionPwAff | None, loop: isl.MultiUnionPwAff, domain: isl.UnionSet
) -> isl.UnionMap:
    """Loop statement instance -> band point ``(kept..., f)`` of one part."""
    f = isl.UnionMap.from_multi_union_pw_aff(loop).intersect_domain(domain)
    if outer is None:
        return f
    kept = isl.UnionMap.from_multi_union_pw_aff(outer).intersect_domain(f.domain())
    return kept.flat_range_product(f)


def run_length(model: PolyModel) -> int:
    """Elements per run: one 128-bit word of the narrowest global tensor the kernel reads or
    writes with vector words — 8 where that is a 16-bit float (so a 16-bit row moves 128 bits
    per access rather than 64), else :data:`VECTOR` (4 floats; 8-byte dtypes take two words).
    Tensors of :data:`~polyfuse.poly.policy.SCALAR_DTYPES` stay scalar (see
    :mod:`polyfuse.cuda.codegen.lower`), so they do not count."""
    sizes = [
        r.itemsize
        for r in model.tensors.values()
        if r.role in ("input", "output") and r.dtype not in SCALAR_DTYPES
    ]
    return 8 if sizes and min(sizes) == 2 else VECTOR


def choose_lane_vectors(
    model: PolyModel,
    schedule: isl.Schedule,
    bands: list[isl.UnionMap],
    strategy: ReductionStrategy,
    device: DeviceSpec,
) -> LaneVectors:
    """Runs of 4 per lane, or not, for the reduction kernel whose parts' loops have ``bands``
    (each from :func:`part_band`), with the reason."""
    if strategy.form.kind == "x":
        why = "lanes stride the outer (reduced) dimension of an x-reduction, not a contiguous one"
        return LaneVectors(Coarsening(1, reason=f"one element per lane step: {why}"), strategy)
    sm = ScheduledMicrograph(model, schedule)
    roles = model.tensors
    run = run_length(model)
    vector: dict[str, bool] = {}
    why_scalar: dict[str, str] = {}
    uniform: dict[str, bool] = {}
    whole = False  # some part has a proven input/output and at least one whole run
    tail = False
    for band in bands:
        if band.is_empty():
            continue
        n = isl.Set.from_union_set(band.range()).dim(isl.dim_type.set)
        c = prove(sm, band, n, run)
        tail |= c.tail
        points = isl.Set.from_union_set(band.range())
        extent = points.dim_max_val(n - 1).to_python() + 1
        for t, ok in c.vector.items():
            vector[t] = vector.get(t, True) and ok
            uniform[t] = uniform.get(t, True) and c.uniform.get(t, False)
            if not ok:
                why_scalar.setdefault(t, c.why_scalar[t])
            elif roles[t].role in ("input", "output") and extent >= run:
                whole = True
    io = sorted(t for t, ok in vector.items() if ok and roles[t].role in ("input", "output"))
    if not io:
        why = "; ".join(f"{t}: {w}" for t, w in sorted(why_scalar.items())) or "runs too short"
        reason = f"one element per lane step: no float4 access ({why})"
        return LaneVectors(Coarsening(1, vector, why_scalar, tail, reason), strategy)
    if not whole:  # proven, but every part's loop is shorter than one run
        reason = (
            f"one element per lane step: float4 proven for {', '.join(io)}, but no loop runs "
            f"a whole run of {VECTOR}"
        )
        return LaneVectors(Coarsening(1, vector, why_scalar, tail, reason), strategy)
    lanes = lanes_over_runs(strategy, run)
    scalar = "; ".join(f"{t} ({why_scalar[t]})" for t in sorted(why_scalar))
    reason = (
        f"{run}-element runs per lane along the reduced/row axis (lanes {strategy.lanes} -> "
        f"{lanes.lanes}, combine unchanged) on {device.name}; float4 proven for {', '.join(io)}"
        + (f"; scalar: {scalar}" if scalar else "")
        + (f"; scalar tail where a loop's extent is not a multiple of {run}" if tail else "")
    )
    c = Coarsening(run, vector, why_scalar, tail, reason, uniform)
    return LaneVectors(c, lanes)
