"""Everything the visualizer shows, as one JSON-able dict (the single source of truth).

The HTML report, ``--json`` and ``polyfuse explain`` all read :func:`extract`'s result. Every
decision text comes verbatim from the plan (partition decisions, stitch decisions, placements,
kernel notes, feedback events); this module only joins them per producer→consumer edge and
labels each with its *kinds* (see :data:`REASON_KINDS`). Times are modelled, never measured.
"""

from __future__ import annotations

import re
import time
from typing import Any

from polyfuse.base.decision import Decided, DecisionKind, note_records
from polyfuse.base.decision_data import DecisionData
from polyfuse.poly.costs import CONSTANTS
from polyfuse.poly.device import device_for_arch
from polyfuse.stitch.memory import reduction_form
from polyfuse.viz.groups import segments
from polyfuse.viz.layout import layout
from polyfuse.viz.memory import kernel_memory, memory_line
from polyfuse.viz.plain import add_plain

#: Every kind of reason an edge can carry.
REASON_KINDS = tuple(k.value for k in DecisionKind)  # see polyfuse.base.decision


def _kinds(kinds) -> list[str]:
    """A decision's typed kinds as the page's filter names (:data:`REASON_KINDS`)."""
    return [k.value for k in kinds]


def _jsonable(obj) -> Any:
    """A decision's data as JSON: containers as lists/dicts, other leaves as text."""
    if isinstance(obj, DecisionData):  # a decision's typed data: its fields as before
        obj = obj.as_dict()
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (set, frozenset)):
        return [_jsonable(v) for v in sorted(obj, key=str)]
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return _s(obj)


def _shape(t) -> list[int]:
    return [int(d) for d in t.shape]


def _nbytes(shape) -> int:
    n = 4
    for d in shape:
        n *= int(d)
    return n


def _s(obj) -> str:
    try:
        return str(obj)
    except Exception as e:  # pragma: no cover - printing isl objects should not fail
        return f"<unprintable: {e}>"


def _ast_c(ast) -> str:
    try:
        return ast.to_C_str()
    except Exception:
        return _s(ast)


def _parts_of_source(source: str, mgs: list[str]) -> list[dict[str, Any]]:
    """Line ranges (0-based, inclusive) of each micrograph's part in a kernel's source."""
    lines = source.splitlines()
    marks = [
        (i, m.group(1)) for i, ln in enumerate(lines) if (m := re.search(r"// part:(\S+)", ln))
    ]
    if not marks:
        return [{"mg": mgs[0], "start": 0, "end": max(0, len(lines) - 1)}] if mgs else []
    out = []
    for j, (i, mg) in enumerate(marks):
        end = marks[j + 1][0] - 1 if j + 1 < len(marks) else len(lines) - 2
        out.append({"mg": mg, "start": i, "end": max(i, end)})
    return out


#: Seconds the report may spend on isl flow analysis that the compile did not need (kernels
#: taken from the compile cache); past it, dependences are marked as not computed.
DEPENDENCE_BUDGET_S = 10.0


def _deps(model, which: str, clock: dict[str, float]) -> str:
    if getattr(model, "_deps", True) is None and clock["left"] <= 0:
        return "(not computed: compile-cache hit and the report's analysis budget is spent)"
    t0 = time.perf_counter()
    out = _s(getattr(model, which))
    clock["left"] -= time.perf_counter() - t0
    return out


def _points(stmt) -> int:
    """Statement instances from shapes (iteration box; isl counting is too slow at scale)."""
    n = 1
    for d in stmt.tensor.shape:
        n *= int(d)
    if stmt.role == "update" and stmt.tensor.op is not None:
        for ax in stmt.tensor.op.reduce_axes:
            n *= int(ax.extent)
    return n


def _modelled(kernel, sms, device) -> dict[str, Any]:
    """The cost model's time of ``kernel`` (:mod:`polyfuse.poly.costs`, on its IR work
    estimate): its memory (DRAM, L2, latency) and compute (issue, FP32) parts, the launch, and
    what bounds it."""
    from polyfuse.cuda.codegen.kernel_cost import kernel_modelled

    m = kernel_modelled(kernel, device)
    b = m.bounds_us
    memory = max((b.get(k, 0.0) for k in ("DRAM", "L2", "DRAM latency")), default=0.0)
    compute = max((b.get(k, 0.0) for k in ("issue", "FP32 pipe", "FP32 peak")), default=0.0)
    return {
        "label": "modelled",
        "device": device.name,
        "memory_s": memory * 1e-6,
        "compute_s": compute * 1e-6,
        "launch_s": m.launch_us * 1e-6,
        "instances": sum(_points(s) for sm in sms for s in sm.model.statements),
        "total_s": m.us * 1e-6,
        "bound": m.bound,
        "mix": m.source,
    }


def _composites(graph) -> list[dict[str, Any]]:
    """Composite-op instances: connected components of primitives with the same tag."""
    seen: dict[str, int] = {}
    out = []
    for n in graph.topo_order():
        tag = graph.prims[n].composite
        if not tag or n in seen:
            continue
        cid = len(out)
        members, stack = [], [n]
        seen[n] = cid
        while stack:
            x = stack.pop()
            members.append(x)
            for y in list(graph.dag.successors(x)) + list(graph.dag.predecessors(x)):
                if y not in seen and y in graph.prims and graph.prims[y].composite == tag:
                    seen[y] = cid
                    stack.append(y)
        out.append({"id": f"c{cid}", "tag": tag, "prims": members})
    return out


def extract(fn) -> dict[str, Any]:
    """The report data of a :class:`~polyfuse.CompiledGraph`."""
    plan = fn.plan
    graph = plan.graph
    part = plan.partition
    device = device_for_arch(fn.arch)
    order = graph.topo_order()
    mg_name = {p: f"mg{i}" for p, i in part.owner.items()}
    kernel_of_mg: dict[str, str] = {}
    for kp in plan.kernel_plans:
        for m in kp.micrographs:
            kernel_of_mg[m] = kp.name
    kernel_of = {p: kernel_of_mg.get(mg_name[p], "") for p in graph.prims}
    outputs = {graph.ident(t) for t in graph.outputs}
    const_ids = set(fn.constants)

    composites = _composites(graph)
    comp_of = {p: c["id"] for c in composites for p in c["prims"]}

    # ---- primitives and the graph inputs they read
    prims = []
    input_edges = []
    seen_in: set[tuple[str, str]] = set()
    input_ids = {graph.ident(t): t for t in graph.inputs}
    for n in order:
        pr = graph.prims[n]
        reads = []
        for (r, _), k in zip(pr.relations.reads, pr.access_kinds, strict=True):
            ident = graph.idents.get(r.tensor.uid, r.tensor.name)
            reads.append({"tensor": ident, "access": k.value})
            if ident in input_ids and (ident, n) not in seen_in:
                seen_in.add((ident, n))
                input_edges.append(
                    {"src": ident, "dst": n, "tensor": ident, "shape": _shape(r.tensor)}
                )
        prims.append(
            {
                "id": n,
                "kind": pr.kind.value,
                "composite": pr.composite,
                "comp": comp_of.get(n, ""),
                "shape": _shape(pr.tensor),
                "mg": mg_name[n],
                "kernel": kernel_of[n],
                "reads": reads,
                "output": n in outputs,
                "text": _s(pr),
            }
        )
    inputs = [
        {"id": i, "shape": _shape(t), "constant": i in const_ids} for i, t in input_ids.items()
    ]

    # ---- stitch decisions, and which one joined each pair of micrographs
    stitches = []
    comp: dict[str, set[str]] = {m: {m} for m in kernel_of_mg}
    joined_by: dict[frozenset[str], int] = {}
    for i, d in enumerate(plan.stitches):
        stitches.append(
            {
                "id": i,
                "producer": list(d.producer),
                "consumer": list(d.consumer),
                "rule": d.rule,
                "stitched": bool(d.stitched),
                "reason": d.reason,
                "tensors": list(d.tensors),
                "kinds": _kinds(d.kinds),
                "text": _s(d),
            }
        )
        if d.stitched:  # union the groups; record which decision joined each pair
            for m in list(d.producer) + list(d.consumer):
                a, b = comp.setdefault(d.producer[0], {d.producer[0]}), comp.setdefault(m, {m})
                if a is b:
                    continue
                for x in a:
                    for y in b:
                        joined_by.setdefault(frozenset((x, y)), i)
                a |= b
                for y in b:
                    comp[y] = a

    # ---- Layer 3 pack decisions (made and refused)
    packs = [
        {
            "id": i,
            "kernels": list(d.kernels),
            "packed": bool(d.packed),
            "name": d.name,
            "gain_us": d.gain_us,
            "reason": d.reason,
            "kinds": _kinds(d.decision_kinds),
            "data": _jsonable(getattr(d, "data", {})),
            "text": _s(d),
        }
        for i, d in enumerate(getattr(plan, "packs", []))
    ]

    # ---- launch layouts: reduction layouts, elements per thread / float4, reduction splits
    layouts = [
        {"kernel": kp.name, "kinds": _kinds(r.kinds), "text": r.reason, "data": _jsonable(r.data)}
        for kp in plan.kernel_plans
        for r in getattr(kp, "layout", [])
    ] + [
        {"kernel": "", "kinds": _kinds(r.kinds), "text": r.reason, "data": _jsonable(r.data)}
        for r in getattr(plan, "splits", [])
    ]
    # the choices the kernels' notes record (register fragments, tensor cores, stages, ...)
    # (those the layout holds already are left out: the same kinds, subject, data and outcome)
    for kp, k in zip(plan.kernel_plans, plan.kernels, strict=True):
        have = {_same(r) for r in getattr(kp, "layout", [])}
        layouts += [
            {
                "kernel": k.name,
                "kinds": _kinds(r.kinds),
                "text": r.reason,
                "data": _jsonable(r.data),
                "made": r.made,
            }
            for r in dict.fromkeys(note_records(k.notes))
            if _same(r) not in have
        ]

    placements: dict[tuple[str, str], Any] = {}
    recomputed: dict[str, Decided] = {}
    for kp in plan.kernel_plans:
        for t, p in kp.placements.items():
            placements[(kp.name, t)] = p
        for r in kp.recomputes:
            recomputed[r.data["tensor"]] = r  # RecomputeData

    # ---- one decision per producer→consumer primitive edge
    decisions = []
    for i, d in enumerate(part.decisions):
        mp, mc = mg_name[d.producer], mg_name[d.consumer]
        kp_, kc = kernel_of[d.producer], kernel_of[d.consumer]
        shape = _shape(graph.prims[d.producer].tensor)
        rec: dict[str, Any] = {
            "id": i,
            "producer": d.producer,
            "consumer": d.consumer,
            "tensor": d.tensor,
            "shape": shape,
            "mg_producer": mp,
            "mg_consumer": mc,
            "kernel_producer": kp_,
            "kernel_consumer": kc,
            "partition": {
                "fused": d.fused,
                "rule": d.rule,
                "reason": d.reason,
                "kinds": _kinds(d.kinds),
            },
            "stitch": None,
            "refusals": [],
            "placement": None,
            "notes": [],
        }
        kinds: list[str] = []
        if d.fused:
            outcome = "fused"
            kinds += _kinds(d.kinds)
            summary = f"fused in {mc}: {d.reason}"
        else:
            kinds += _kinds(d.kinds)
            if kp_ == kc:
                outcome = "stitched"
                kinds.append("stitched")
                j = joined_by.get(frozenset((mp, mc)))
                st = stitches[j] if j is not None else None
                rec["stitch"] = st
                why = f"rule {st['rule']}: {st['reason']}" if st else "same kernel"
                summary = f"stitched into {kc} ({why})"
            else:
                outcome = "separate"
                refs = [
                    s
                    for s in stitches
                    if not s["stitched"] and mp in s["producer"] and mc in s["consumer"]
                ]
                rec["refusals"] = refs
                for s in refs:
                    kinds += [k for k in s["kinds"] if k not in kinds]
                summary = f"not fused: {d.reason}"
                if refs:
                    summary += "; not stitched: " + "; ".join(s["reason"] for s in refs)
        # where the intermediate lives in the consumer's kernel
        p = placements.get((kc, d.tensor)) if outcome != "separate" else None
        if outcome == "separate":
            rec["placement"] = {
                "space": "global",
                "reason": f"written by {kp_}, read by {kc} (between kernels)",
                "bytes": _nbytes(shape),
                "kinds": [],
            }
        elif p is not None:
            nb = (
                p.smem_bytes
                if p.space == "shared"
                else (_nbytes(shape) if p.space == "global" else 0)
            )
            rec["placement"] = {
                "space": p.space,
                "reason": p.reason,
                "bytes": nb,
                "kinds": _kinds(p.kinds),
            }
            kinds += [k for k in _kinds(p.kinds) if k not in kinds]
        if d.tensor in recomputed and outcome != "separate":
            # the plan's note carries the exact per-block footprint that did not fit
            r = recomputed[d.tensor]
            rec["notes"].append(f"{r.reason}; the cost model recomputes it")
            rec["placement"] = {
                "space": "recomputed",
                "reason": r.reason,
                "bytes": 0,
                "kinds": _kinds(r.kinds),
                "readers": len(r.data.get("readers", ())),
            }
            kinds += [k for k in _kinds(r.kinds) if k not in kinds]
        if not d.fused and outcome == "fused":  # pragma: no cover
            outcome = "separate"
        rec["outcome"] = outcome
        rec["kinds"] = kinds
        rec["summary"] = summary
        decisions.append(rec)

    # ---- micrographs
    clock = {"left": DEPENDENCE_BUDGET_S}
    mapped_of: dict[str, Any] = {}
    for kp, mm in zip(plan.kernel_plans, plan.mapped, strict=True):
        for m in kp.micrographs:
            mapped_of.setdefault(m, (kp.name, mm))
    sched_of = {sm.name: sm for sm in plan.scheduled}
    micrographs = []
    for mg, sm in zip(part.micrographs, plan.scheduled, strict=True):
        model = sm.model
        form = reduction_form(sm, mg.kind)
        kname, mm = mapped_of.get(mg.name, ("", None))
        fbs = [_s(e) for e in plan.feedback if any(p in mg.prims for g in e.groups for p in g)]
        micrographs.append(
            {
                "id": mg.name,
                "kind": mg.kind.value,
                "prims": list(mg.prims),
                "kernel": kname,
                "canonical": _s(form) if form else "",
                "form": (
                    {"kind": form.kind, "kept": list(form.kept), "reduced": form.reduced}
                    if form
                    else None
                ),
                "domain": _s(model.domain),
                "writes": _s(model.writes),
                "reads": _s(model.reads),
                "flow": _deps(model, "flow", clock),
                "validity": _deps(model, "validity", clock),
                "tensors": {t.ident: t.role for t in model.tensors.values()},
                "statements": [
                    {"name": s.name, "prim": s.prim, "role": s.role, "domain": _s(s.domain)}
                    for s in model.statements
                ],
                "schedule": _s(sm.schedule.get_root()),
                "mapped_schedule": _s(mm.schedule.get_root()) if mm is not None else "",
                "budget_used": sm.budget_used,
                "notes": list(sm.notes),
                "feedback": fbs,
            }
        )

    # ---- kernels
    bufsize = {b.name: _nbytes(b.shape) for b in fn.buffers}
    kernels = []
    for k, kp, mm in zip(plan.kernels, plan.kernel_plans, plan.mapped, strict=True):
        params = [p.tensor for p in k.params if p.tensor]
        compulsory = sum(bufsize.get(t, 0) for t in params)
        ast = plan.asts.get(k.name)
        mem = kernel_memory(kp, k)
        mem["plain"] = memory_line(mem)
        kernels.append(
            {
                "id": k.name,
                "cached": bool(getattr(kp, "cached", False)),
                "micrographs": list(k.micrographs),
                "grid": list(k.grid),
                "block": list(k.block),
                "grid_dims": list(getattr(mm, "grid_dims", [])),
                "tile_sizes": list(getattr(mm, "tile_sizes", [])),
                "shared_bytes": k.shared_bytes,
                "registers": k.registers,
                "static_shared_bytes": k.static_shared_bytes,
                "spill_stores": k.spill_stores,
                "bytes_read": k.bytes_read,
                "bytes_written": k.bytes_written,
                "compulsory_bytes": compulsory,
                "modelled": _modelled(
                    k, [sched_of[m] for m in k.micrographs if m in sched_of], device
                ),
                "source": k.source,
                "parts": _parts_of_source(k.source, list(k.micrographs)),
                "ast": _ast_c(ast) if ast is not None else "",
                "schedule": _s(mm.schedule.get_root()) if mm is not None else "",
                "strategy": _s(getattr(mm, "strategy", "") or ""),
                "placements": [
                    {
                        "tensor": p.tensor,
                        "space": p.space,
                        "reason": p.reason,
                        "bytes": p.smem_bytes,
                    }
                    for p in kp.placements.values()
                ],
                "notes": list(k.notes),
                "params": params,
                "memory": mem,
            }
        )

    # cost-model decisions: reduction layouts and recomputes, picked by their typed kinds
    cost = [
        {"kernel": kp.name, "kinds": _kinds(r.kinds), "note": r.reason, "data": _jsonable(r.data)}
        for kp in plan.kernel_plans
        for r in [
            *(d for d in kp.layout if DecisionKind.REDUCTION_LAYOUT in d.kinds),
            *kp.recomputes,
        ]
    ] + [{"kernel": "", "kinds": [], "note": r} for r in plan.rewrites]

    data: dict[str, Any] = {
        "version": 1,
        "name": plan.name,
        "arch": fn.arch,
        "device": {
            "name": device.name,
            "dram_gbps": device.dram_gbps,
            "fp32_tflops": device.fp32_tflops,
            "model_gbps": device.bandwidth_gbps,
            "model_tflops": device.throughput_tflops,
            "figures": device.figures,
            "launch_us": CONSTANTS.launch_us,
            "smem_per_block_optin": device.smem_per_block_optin,
        },
        "counts": {
            "primitives": len(graph.prims),
            "micrographs": len(part.micrographs),
            "kernels": len(plan.kernels),
            "decisions": len(decisions),
            "stitches": len(stitches),
            "packs": len(packs),
            "feedback": len(plan.feedback),
        },
        "reason_kinds": list(REASON_KINDS),
        "inputs": inputs,
        "outputs": sorted(outputs),
        "prims": prims,
        "input_edges": input_edges,
        "composites": composites,
        "decisions": decisions,
        "stitches": stitches,
        "packs": packs,
        "launch_layouts": layouts,
        "micrographs": micrographs,
        "kernels": kernels,
        "feedback": [
            {"micrograph": e.micrograph, "reason": e.reason, "groups": e.groups, "text": _s(e)}
            for e in plan.feedback
        ],
        "rewrites": list(plan.rewrites),
        "cost_model": cost,
        "bytes": {"global": fn.global_bytes(), "compulsory": fn.compulsory_bytes()},
        "profile": {
            "stages": dict(plan.seconds),
            "total": sum(plan.seconds.values()),
            "per_micrograph_budget": {
                m["id"]: m["budget_used"] for m in micrographs if m["budget_used"] is not None
            },
        },
    }
    add_plain(data)
    data["groups"] = segments(data)
    data["layout"] = layout(data)
    return data


def _same(r: Decided) -> tuple:
    """What makes two records one decision, whatever their wording."""
    return (r.kinds, r.subject, r.data, r.made)


def kinds_present(data: dict[str, Any]) -> set[str]:
    """Every reason kind some edge, Layer 3 or launch-layout decision of the report carries."""
    more = data.get("packs", []) + data.get("launch_layouts", [])
    return {k for d in data["decisions"] + more for k in d["kinds"]}
