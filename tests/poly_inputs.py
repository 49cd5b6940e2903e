"""Small inputs for the poly passes' before/after tests (tests/test_poly_*.py).

The passes take a micrograph's isl model (:class:`polyfuse.poly.model.PolyModel`) and a
schedule; these helpers build the smallest real ones: a graph of one or two ``te`` ops
partitioned, modelled and scheduled by isl (milliseconds), or the same model under an isl
schedule written as text, so a test can hand a pass exactly the schedule its contract names.
"""

from __future__ import annotations

import islpy as isl

from polyfuse import te
from polyfuse.graph.graph import Graph, build_graph
from polyfuse.graph.partition import PARTITION_RULES, partition
from polyfuse.poly.model import build_model
from polyfuse.poly.schedule import (
    DEFAULT_BUDGET,
    ScheduledMicrograph,
    compute_schedule,
    configure,
)


def scheduled(inputs, outputs) -> tuple[Graph, list[ScheduledMicrograph]]:
    """The graph of ``outputs`` and its micrographs as isl schedules them."""
    ctx = configure(isl.Context())
    graph = build_graph(inputs, outputs, ctx)
    mgs = partition(graph, PARTITION_RULES, set()).micrographs
    return graph, [compute_schedule(build_model(graph, mg, ctx), DEFAULT_BUDGET) for mg in mgs]


def one(inputs, output) -> ScheduledMicrograph:
    """The one micrograph of a graph that partitions into one."""
    _, (sm,) = scheduled(inputs, [output])
    return sm


def with_schedule(sm: ScheduledMicrograph, text: str) -> ScheduledMicrograph:
    """``sm``'s model under the isl schedule tree ``text`` (instead of isl's own)."""
    return ScheduledMicrograph(sm.model, isl.Schedule.read_from_str(sm.model.ctx, text))


def matmul(m: int, k: int, n: int, name: str = "c"):
    """``c[i, j] = sum_r a[i, r] * b[r, j]``: (inputs, output)."""
    a = te.placeholder((m, k), name="a")
    b = te.placeholder((k, n), name="b")
    r = te.reduce_axis(k, name="r")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name=name)
    return [a, b], c


def isl_map(text: str, ctx: isl.Context | None = None) -> isl.Map:
    return isl.Map(text, context=ctx or isl.Context())


def isl_set(text: str, ctx: isl.Context | None = None) -> isl.Set:
    return isl.Set(text, context=ctx or isl.Context())


def modelled(inputs, outputs, prims: list[str] | None = None):
    """The isl model of the micrograph of ``prims`` (default: every primitive) of the graph
    of ``outputs``, with no schedule yet: (graph, model). For a pass's refusals of
    micrographs the partitioner would not form."""
    ctx = configure(isl.Context())
    graph = build_graph(inputs, outputs, ctx)
    return graph, model_of(graph, prims or graph.topo_order())


def model_of(graph: Graph, prims: list[str], ident: int = 0):
    """The isl model of a micrograph of ``prims`` of ``graph`` (in the graph's context)."""
    from polyfuse.graph.kinds import OpKind
    from polyfuse.graph.partition import Micrograph

    return build_model(graph, Micrograph(ident, prims, OpKind.OPAQUE), graph.ctx)


def unscheduled(model) -> ScheduledMicrograph:
    """``model`` under the schedule of its domain alone (no band)."""
    return ScheduledMicrograph(model, isl.Schedule.from_domain(model.domain))
