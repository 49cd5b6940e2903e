"""Rule 9's stitch stage: every GEMM group whose output one y-reduce group alone reads is
tried with it as one kernel, the float32 GEMMs on whole-row CUDA-core tiles
(:mod:`polyfuse.stitch.gemm_rows`), the 16-bit ones on whole-row tensor-core tiles
(:mod:`polyfuse.stitch.mma_rows`); every stitch made or refused is a :class:`StitchDecision`.
"""

from __future__ import annotations

from dataclasses import replace

import networkx as nx

from polyfuse.base.decision import DecisionKind, Refusal
from polyfuse.base.decision_data import NO_DATA, RowStitchData
from polyfuse.graph.graph import Graph
from polyfuse.graph.kinds import OpKind
from polyfuse.graph.structure import structural_key
from polyfuse.poly.device import DeviceSpec
from polyfuse.poly.kernel_map import HALF_OPERANDS
from polyfuse.poly.mapping import MappingConfig
from polyfuse.poly.tiling import detect_gemm
from polyfuse.stitch.gemm_rows import (
    GEMM_ROWS_RULE,
    ROW_COST_REVISION,
    GemmRowsGroup,
    try_gemm_rows,
)
from polyfuse.stitch.memory import KernelGroup, Memo, StitchDecision
from polyfuse.stitch.mma_rows import NO_TENSOR_CORES, Pricer, try_mma_rows


def try_rows(
    graph: Graph,
    gp: KernelGroup,
    gc: KernelGroup,
    tensor: str,
    device: DeviceSpec,
    cfg: MappingConfig,
    price: Pricer | None,
) -> tuple[bool, str, dict]:
    """The GEMM group ``gp`` with the y-reduce group ``gc`` reading ``tensor``: on tensor
    cores where its operands are 16-bit, or float32 with tf32 allowed and matched (as the
    mapping would run it alone), priced by ``price``; else on CUDA-core tiles (stitched?,
    reason, data)."""
    shape = detect_gemm(gp.parts[0])
    half = isinstance(shape, Refusal) and shape.reason == HALF_OPERANDS
    if half or (cfg.allow_tf32 and not isinstance(shape, Refusal)):
        if price is None:
            return False, "no pricer for tensorized tiles was given (stitch_gemm_rows)", {}
        got = try_mma_rows(graph, gp, gc, tensor, device, cfg, price)
        if half or not got[1].startswith(NO_TENSOR_CORES):
            return got
    return try_gemm_rows(graph, gp, gc, tensor, device, cfg)


def _consumers(graph: Graph, prims: list[str]) -> set[str]:
    return {c for p in prims for c in graph.consumers(p)}


def stitch_gemm_rows(
    graph: Graph,
    groups: list[KernelGroup],
    device: DeviceSpec,
    cfg: MappingConfig | None = None,
    cache: Memo | None = None,
    salt: str = "",
    price: Pricer | None = None,
) -> tuple[list[KernelGroup], list[StitchDecision]]:
    """Stitch every GEMM group with the y-reduce group that alone reads its output, where
    :func:`try_rows` says so (``price``: the tensorized tiles' pricer; without it 16-bit
    GEMMs are not stitched, saying so); the groups stay in a dependence order."""
    cfg = cfg or MappingConfig()
    if not cfg.gemm or not cfg.gemm_rows:
        return groups, []
    owner = {
        p: i for i, g in enumerate(groups) for sm in g.parts for p in sm.model.micrograph.prims
    }
    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(groups)))
    for a, b in graph.dag.edges:
        if a in owner and b in owner and owner[a] != owner[b]:
            dag.add_edge(owner[a], owner[b])
    decisions: list[StitchDecision] = []
    merged: dict[int, int] = {}  # GEMM group -> the consumer group it joins
    out: dict[int, KernelGroup] = {}
    for i, gp in enumerate(groups):
        if gp.kind != OpKind.OPAQUE or len(gp.parts) != 1:
            continue
        prims = gp.parts[0].model.micrograph.prims
        readers = {owner[c] for c in _consumers(graph, prims) if c in owner} - {i}
        if len(readers) != 1:
            continue
        (c,) = readers
        gc = groups[c]
        if gc.strategy is None or gc.form is None or gc.form.kind != "y" or c in out:
            continue
        written = [p for p in prims if any(owner.get(x) == c for x in graph.consumers(p))]
        if len(written) != 1:
            continue
        tensor = written[0]
        decide = _decider(gp, gc, tensor)
        if graph.is_output(graph.prims[tensor].tensor):
            decisions.append(decide(False, f"{tensor} is a graph output", DecisionKind.NO_RULE))
            continue
        if any(nx.has_path(dag, s, c) for s in dag.successors(i) if s != c):
            decisions.append(decide(False, "stitching would create a cycle", DecisionKind.CYCLE))
            continue
        all_prims = [p for sm in gp.parts + gc.parts for p in sm.model.micrograph.prims]
        key = structural_key(graph, all_prims, f"{salt}|gemm-rows {ROW_COST_REVISION}|{cfg}").digest
        known = cache.get(key, (("ok", "reason", "data"),)) if cache is not None else None
        if known is None:
            ok, why, data = try_rows(graph, gp, gc, tensor, device, cfg, price)
            known = {"ok": ok, "reason": why, "data": data}
            if cache is not None and price is not None:  # no pricer: not a decision to keep
                cache.put(key, known)
        if known["data"]:
            kinds: tuple[DecisionKind, ...] = (DecisionKind.COST_MODEL,)
        elif "shared memory" in known["reason"]:
            kinds = (DecisionKind.FOOTPRINT,)
        else:
            kinds = (DecisionKind.TILE_MISMATCH,)
        figures = RowStitchData.from_dict(known["data"]) if known["data"] else NO_DATA
        decisions.append(replace(decide(known["ok"], known["reason"], *kinds), data=figures))
        if known["ok"]:
            merged[i] = c
            out[c] = GemmRowsGroup(
                [*gp.parts, *gc.parts],
                gc.kind,
                gc.form,
                gc.strategy,
                tensor=tensor,
                tile=tuple(known["data"]["tile"]),  # type: ignore[arg-type]
                figures=figures,
                tensor_cores=bool(known["data"].get("tensor_cores")),
            )
    result = [out.get(i, g) for i, g in enumerate(groups) if i not in merged]
    return result, decisions


def _decider(gp: KernelGroup, gc: KernelGroup, tensor: str):
    def decide(ok: bool, reason: str, *kinds: DecisionKind) -> StitchDecision:
        if ok:
            kinds = (DecisionKind.STITCHED, *kinds)
        return StitchDecision(
            gp.names, gc.names, GEMM_ROWS_RULE, ok, reason, [tensor], tuple(kinds)
        )

    return decide
