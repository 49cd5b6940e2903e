"""A plain-language line beside every decision reason of the report.

The plan's reasons speak isl and cost-model terms ("outer members are not parallel", "no
partition rule for opaque -> opaque"). Each gets one sentence for people, built from the typed
record only — its :class:`~polyfuse.base.decision.DecisionKind` values and its data (op kinds,
access kinds, canonical forms, placements, launch figures) — never from the reason's wording,
so rewording a reason changes no sentence. :func:`add_plain` writes them into the report data
(a ``plain`` field beside each ``reason``/``text``); the functions below are one per stage.
"""

from __future__ import annotations

from typing import Any

from polyfuse.base.decision import DecisionKind as K
from polyfuse.graph.kinds import AccessKind, OpKind

#: What a reduction of each canonical form combines for one result, and what it keeps.
_SPAN = {"y": "a whole row", "x": "a whole column", "all": "all of its input"}
_KEPT = {"y": "rows", "x": "columns", "all": "the whole tensor"}
_ONE = {"y": "row", "x": "column", "all": "result"}
_ALONG = {"y": "along rows (y-reduce)", "x": "along columns (x-reduce)", "all": "everything"}


def _kinds(rec: dict[str, Any]) -> set[K]:
    return {K(k) for k in rec.get("kinds", ())}


def _bytes(n: int | None) -> str:
    if not n:
        return "0 B"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} B"


def _a(word: str) -> str:
    """``word`` with its indefinite article."""
    return f"an {word}" if word[:1] in set("aeiou") else f"a {word}"


def _names(names: list[str], most: int = 3) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


class _Index:
    """The report data, indexed the way the sentences look things up."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.prim = {p["id"]: p for p in data["prims"]}
        self.mg = {m["id"]: m for m in data["micrographs"]}
        self.kernel = {k["id"]: k for k in data["kernels"]}
        self.mg_succ: dict[str, set[str]] = {}
        self.prim_succ: dict[str, set[str]] = {}
        for d in data["decisions"]:
            self.prim_succ.setdefault(d["producer"], set()).add(d["consumer"])
            if d["mg_producer"] != d["mg_consumer"]:
                self.mg_succ.setdefault(d["mg_producer"], set()).add(d["mg_consumer"])

    def form(self, mgs: list[str]) -> dict[str, Any] | None:
        """The canonical form of the first reduction among micrographs ``mgs``."""
        for m in mgs:
            f = self.mg[m].get("form")
            if f:
                return f
        return None

    def op_kind(self, mgs: list[str]) -> OpKind:
        """The kind of a group of micrographs: a reduction if any is, else the first's."""
        kinds = [OpKind(self.mg[m]["kind"]) for m in mgs]
        return OpKind.REDUCTION if OpKind.REDUCTION in kinds else kinds[0]

    @staticmethod
    def between(succ: dict[str, set[str]], a: str, b: str) -> str | None:
        """The first node after ``a`` on a path from ``a`` to ``b`` other than the edge a→b
        (what a merge of ``a`` and ``b`` would have to run both before and after)."""
        for first in sorted(succ.get(a, ())):
            if first == b:
                continue
            seen, stack = {first}, [first]
            while stack:
                x = stack.pop()
                nxt = succ.get(x, set())
                if b in nxt:
                    return first
                for y in nxt - seen:
                    seen.add(y)
                    stack.append(y)
        return None


def _op(p: dict[str, Any]) -> str:
    """A primitive as the sentences name it: ``softmax14_max (softmax)``, ``matmul12`` (its
    composite tag only where the name does not already say it)."""
    comp = p["composite"]
    return f"{p['id']} ({comp})" if comp and p["id"].rstrip("0123456789") != comp else p["id"]


def _access(consumer: dict[str, Any], tensor: str) -> set[AccessKind]:
    return {AccessKind(r["access"]) for r in consumer["reads"] if r["tensor"] == tensor}


# --------------------------------------------------------------------------- Layer 1


def partition_line(ix: _Index, d: dict[str, Any]) -> str:
    """Why two primitives share a micrograph, or do not (``d``: an edge of the report)."""
    p, c, t = ix.prim[d["producer"]], ix.prim[d["consumer"]], d["tensor"]
    kinds = {K(k) for k in d["partition"]["kinds"]}
    pk, ck = OpKind(p["kind"]), OpKind(c["kind"])
    access = _access(c, t)
    if K.FUSED in kinds:
        if pk == OpKind.OPAQUE:
            return (
                f"fused: {_op(c)} runs as an epilogue on {_op(p)}'s result while it is still "
                "in registers, before anything is stored"
            )
        if ck == OpKind.REDUCTION:
            return (
                f"fused: {_op(c)} folds each value of {t} into its running result as soon as "
                f"it is computed, so {t} is never stored"
            )
        if AccessKind.INJECTIVE in access:
            return (
                f"fused: {_op(c)} uses each value of {t} at several outputs (a broadcast); "
                "each thread recomputes the value it needs instead of loading it"
            )
        return (
            f"fused: each value of {t} is used by the thread that computes it, so it stays "
            "in a register and never goes to memory"
        )
    if K.CYCLE in kinds:
        via = ix.between(ix.prim_succ, p["id"], c["id"])
        other = f"{via}" if via else "another op"
        return (
            f"not fused: {other} needs {p['id']}'s output and (directly or not) feeds "
            f"{c['id']}, so a group holding both would have to run before and after it"
        )
    if K.ISL_FEEDBACK in kinds:
        return (
            f"not fused: isl could not schedule {p['id']} and {c['id']} together within its "
            "operation budget, so the compiler split them and keeps them apart"
        )
    # the rules saw micrographs: name their kinds
    pk, ck = ix.op_kind([d["mg_producer"]]), ix.op_kind([d["mg_consumer"]])
    form = ix.form([d["mg_producer"]])
    if pk == OpKind.REDUCTION and form:
        return (
            f"not fused: each value of {t} is final only after {_op(p)} has combined "
            f"{_SPAN[form['kind']]}, and {c['id']} needs final values, which needs a barrier "
            "between them (Layer 2 may still stitch them into one kernel)"
        )
    if AccessKind.GENERAL in access:
        return (
            f"not fused: {_op(c)} combines many values of {t} for each of its outputs, so all "
            f"of {t} must be written first: a barrier across the whole grid, i.e. a new kernel"
        )
    if AccessKind.LAYOUT in access:
        return (
            f"not fused: {_op(c)} reads {t} with its indices rearranged (a reshape or "
            "transpose), so the thread computing an output is not the one that computed the "
            "value it reads, which needs a barrier between them"
        )
    if pk == OpKind.OPAQUE:
        return (
            f"not fused: {_op(p)} is computed tile by tile and no rule lets {_a(ck.value)} "
            f"micrograph run on its tiles, so {t} goes through memory"
        )
    return (
        f"not fused: no rule joins {_a(pk.value)} micrograph to {_a(ck.value)} one, so {t} "
        "passes between two micrographs"
    )


# --------------------------------------------------------------------------- Layer 2


def stitch_line(ix: _Index, s: dict[str, Any]) -> str:
    """Why two kernel groups were stitched into one kernel, or not (``s``: a stitch)."""
    kinds = _kinds(s)
    pg, cg = "+".join(s["producer"]), "+".join(s["consumer"])
    fp, fc = ix.form(s["producer"]), ix.form(s["consumer"])
    tensors = _names(s["tensors"]) or "the intermediate"
    if K.STITCHED in kinds:
        mg = ix.mg[s["producer"][0]]
        block = ix.kernel[mg["kernel"]]["block"][0] if mg["kernel"] in ix.kernel else None
        threads = f" of {block} threads" if block else ""
        kept = _KEPT[fp["kind"]] if fp else "points"
        return (
            f"stitched: one kernel runs both; each block{threads} works on the same {kept} in "
            f"both parts, so {tensors} pass through on-chip memory with a barrier inside the "
            "block instead of a round trip through global memory"
        )
    if K.CYCLE in kinds:
        via = ix.between(ix.mg_succ, s["producer"][-1], s["consumer"][0])
        other = f"{via} (another kernel group)" if via else "another kernel group"
        return (
            f"not stitched: {other} needs {pg}'s output and feeds {cg}, so no single kernel "
            "can run both"
        )
    if K.FORM_MISMATCH in kinds:
        if fp and fc and fp["kind"] != fc["kind"]:
            return (
                f"not stitched: {pg} reduces {_ALONG[fp['kind']]} but {cg} "
                f"{_ALONG[fc['kind']]}: a block of one does not hold what a block of the other "
                "needs"
            )
        if fp and fc and fp["kept"] != fc["kept"]:
            return (
                f"not stitched: both reduce {_ALONG[fp['kind']]} but keep different extents "
                f"({fp['kept']} vs {fc['kept']}), so their blocks do not line up"
            )
        return (
            "not stitched: both are the same kind of reduction, but each is fastest with a "
            "different number of threads per row, and one kernel has one block shape"
        )
    if K.TILE_MISMATCH in kinds:
        return (
            f"not stitched: isl found a dependence that crosses blocks (a block of {cg} needs "
            f"values other blocks of {pg} compute), so sharing a launch would need a barrier "
            "across the whole grid"
        )
    pk, ck = ix.op_kind(s["producer"]), ix.op_kind(s["consumer"])
    if K.NO_RULE in kinds:
        return (
            "not stitched: Layer 2 only joins a reduction with the elementwise or broadcast "
            f"ops after it, or with a reduction of the same shape; {pk.value} -> {ck.value} "
            "is neither"
        )
    if fp is None:
        return f"not stitched: {pg} is not a reduction, and Layer 2 stitches after reductions"
    return "not stitched: Layer 2 kept the two groups in separate kernels"


def recompute_line(tensor: str, readers: int, kinds: set[K]) -> str:
    """Why an intermediate is recomputed by its readers instead of stored."""
    why = " (one block's share does not fit in shared memory)" if K.FOOTPRINT in kinds else ""
    who = f"each of its {readers} readers" if readers > 1 else "its reader"
    return (
        f"recomputed: rather than store {tensor}, {who} computes it again{why}; the cost model "
        "finds that cheaper than a round trip through global memory"
    )


def placement_line(d: dict[str, Any]) -> str:
    """Where an edge's intermediate lives, and why (``d``: an edge with its placement)."""
    pl, t = d["placement"], d["tensor"]
    kinds = _kinds(pl)
    if d["outcome"] == "separate":
        return (
            f"{t} goes through global memory: {d['kernel_producer']} writes it "
            f"({_bytes(pl['bytes'])}) and {d['kernel_consumer']} reads it back in a later launch"
        )
    if pl["space"] == "recomputed":
        return recompute_line(t, pl.get("readers", 0), kinds)
    if pl["space"] == "register":
        return f"{t} lives in registers: each thread reads only values it computed itself"
    if pl["space"] == "shared":
        return (
            f"{t} lives in shared memory ({_bytes(pl['bytes'])} per block): the threads of a "
            "block exchange it after a barrier, without going through global memory"
        )
    if K.FOOTPRINT in kinds:
        return (
            f"{t} stays in global memory: one block's share of it does not fit in the shared "
            "memory left"
        )
    return f"{t} stays in global memory, written and read back inside the same kernel"


# --------------------------------------------------------------------------- Layer 3


def pack_line(pk: dict[str, Any]) -> str:
    """Why kernels were packed into one launch, or not (``pk``: a pack decision)."""
    kinds, n, names = _kinds(pk), len(pk["kernels"]), _names(pk["kernels"])
    gain = pk.get("gain_us")
    if K.PACKED in kinds:
        saved = f", about {gain:.2f} µs saved (modelled)" if gain is not None else ""
        return (
            f"packed: {n} independent kernels run as one launch, each on its own range of "
            f"blocks: one launch instead of {n}{saved}"
        )
    if K.CYCLE in kinds:
        return (
            f"not packed: {names} depends on (or feeds) the other candidates, so they cannot "
            "run side by side"
        )
    if K.FOOTPRINT in kinds:
        need = sum(pk.get("data", {}).get(k, 0) for k in ("static_bytes", "dynamic_bytes"))
        return (
            f"not packed: side by side they would need {_bytes(need)} of shared memory per "
            "block, more than a block may have"
        )
    if K.FORM_MISMATCH in kinds:
        return "not packed: their blocks cannot be padded to one launch shape"
    if K.SHARED_BUFFER in kinds:
        return (
            "not packed: both read a buffer that one stages in shared memory or registers, so "
            "the memory traffic of the pack could not be counted"
        )
    if K.COST_MODEL in kinds:
        g = f" ({gain:+.2f} µs, modelled)" if gain is not None else ""
        return f"not packed: the cost model predicts no time saved by one launch{g}"
    return f"not packed: Layer 3 kept {names} in separate launches"


# --------------------------------------------------------------------------- launch layouts


def layout_line(ix: _Index, lay: dict[str, Any]) -> str:
    """A kernel's launch layout in words (``lay``: a launch-layout record with its data)."""
    kinds, data = _kinds(lay), lay.get("data", {})
    made = lay.get("made", True)
    if K.REGISTER_FRAGMENT in kinds and K.TENSOR_CORES in kinds:  # poly/tensorize_fragments.py
        if made:
            return (
                "tensor-core operand fragments double-buffered in registers: the next step's "
                "load from shared memory while the current ones multiply"
            )
        return "tensor-core operand fragments single-buffered: one step's at a time"
    if K.REGISTER_FRAGMENT in kinds:
        if made:
            return (
                f"{data['tensor']}: each thread keeps the {data['elements']} value(s) it reads "
                f"{data['reads']} times per step in registers instead of re-reading shared memory"
            )
        return "an operand read from shared memory at every use: no register copy of it pays"
    if K.TENSOR_CORES in kinds:
        if made:
            return "the multiply-adds run on tensor cores"
        return "no tensor cores: the multiply-adds run on the ordinary FP32 units"
    if K.PIPELINE_STAGES in kinds:
        if made:
            return "shared-memory stages: the next tiles load while the current ones are used"
        return "a stage count the pipeline model passed over (it does not fit or does not pay)"
    if K.GEMM_TILE in kinds and not made:  # a refusal: no tiles
        return "a GEMM tiling passed over: the kernel runs another tiling or the plain mapping"
    if K.GEMM_TILE in kinds and data.get("block_tile") is not None:
        (bm, bn), (tm, tn) = data["block_tile"], data["micro_tile"]
        return (
            f"each block computes a {bm}×{bn} tile of the output with "
            f"{data['threads_per_block']} threads, each thread a {tm}×{tn} patch in registers; "
            f"the reduction runs {data['k_tile']} at a time through shared memory "
            f"({data['stages']} stages, so loads overlap the math); {data['blocks']} blocks"
        )
    if K.REDUCTION_LAYOUT in kinds:
        k = ix.kernel.get(lay["kernel"])
        form = ix.form(k["micrographs"]) if k else None
        kept = _KEPT[form["kind"]] if form else "kept points"
        one = _ONE[form["kind"]] if form else "kept point"
        return (
            f"{data['lanes']} threads share the work of each {one} and combine their partial "
            f"results; a block of {data['threads_per_block']} threads handles "
            f"{data['kept_tile']} {kept if data['kept_tile'] != 1 else one}; "
            f"{data['blocks']} blocks"
        )
    if K.SPLIT_REDUCTION in kinds:
        us = data.get("modelled_us")
        if data["chunks"] > 1:
            t = f" ({us[0]:.1f} -> {us[1]:.1f} µs, modelled)" if us else ""
            return (
                f"split: {data['tensor']} is reduced in {data['chunks']} partial results by "
                f"separate blocks, then combined, so every SM helps{t}"
            )
        t = f" (split would take {us[1]:.1f} vs {us[0]:.1f} µs, modelled)" if us else ""
        return f"not split: {data['tensor']} is reduced in one pass{t}"
    if K.ELEMENTS_PER_THREAD in kinds:
        vec = data.get("vector", [])
        v = f"; {_names(vec)} move 4 floats per access (float4)" if vec else ""
        e = data.get("factor", 1)
        if e > 1:
            return (
                f"each thread computes {e} elements: fewer threads, each with more work, so "
                f"their memory accesses overlap{v}"
            )
        return f"one element per thread: fewer threads would leave the GPU partly idle{v}"
    return "launch layout chosen by the cost model"


def feedback_line(fb: dict[str, Any]) -> str:
    """What an isl feedback event did."""
    n = len(fb["groups"])
    return (
        f"isl could not schedule {fb['micrograph']} as one group within its operation budget; "
        f"the compiler split it into {n} groups and keeps them apart from now on"
    )


def add_plain(data: dict[str, Any]) -> None:
    """Write a ``plain`` sentence beside every reason of report ``data`` (in place)."""
    ix = _Index(data)
    for s in data["stitches"]:
        s["plain"] = stitch_line(ix, s)
    for d in data["decisions"]:
        d["partition"]["plain"] = partition_line(ix, d)
        if d["placement"]:
            d["placement"]["plain"] = placement_line(d)
        # the edge's headline: what decided its outcome
        d["plain"] = d["stitch"]["plain"] if d["stitch"] else d["partition"]["plain"]
    for pk in data["packs"]:
        pk["plain"] = pack_line(pk)
    for lay in data["launch_layouts"]:
        lay["plain"] = layout_line(ix, lay)
    for fb in data["feedback"]:
        fb["plain"] = feedback_line(fb)
    for c in data["cost_model"]:
        kinds = _kinds(c)
        if K.REDUCTION_LAYOUT in kinds:
            c["plain"] = layout_line(ix, c)
        elif K.COST_MODEL in kinds:
            readers = c.get("data", {}).get("readers", [])
            c["plain"] = recompute_line(c["data"]["tensor"], len(readers), kinds)
