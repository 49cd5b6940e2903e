"""A kernel's on-chip memory as the visualizer shows it: shared buffers, pipeline stages and
the tensorized region.

Everything comes from the plan's typed records — the kernel's placements, its launch-layout
decisions (:class:`~polyfuse.base.decision_data.TensorCoreData` for a GEMM on tensor cores,
:class:`~polyfuse.base.decision_data.GemmTileData` for one on CUDA cores) and the facts
lowering recorded (:class:`~polyfuse.stitch.facts.KernelFacts`: the static ``__shared__``
arrays, the dynamic pool). Only the source lines of the tensorized region are found in the
printed source, to highlight them.
"""

from __future__ import annotations

from typing import Any

from polyfuse.base.decision_data import GemmTileData, TensorCoreData

#: what marks a line of the tensorized k-loop in the printed source (the intrinsics' names)
_TENSOR_CORE_CALLS = ("pf_mma_", "pf_ldmatrix_")


def tensorized_lines(source: str) -> list[int]:
    """0-based first and last line of ``source`` that issue tensor-core instructions (mma or
    ldmatrix), or [] when none does."""
    lines = source.splitlines()
    hits = [i for i, ln in enumerate(lines) if any(c in ln for c in _TENSOR_CORE_CALLS)]
    return [hits[0], hits[-1]] if hits else []


def kernel_memory(kernel_plan: Any, kernel: Any) -> dict[str, Any]:
    """The memory record of one kernel: ``engine`` ("tensor cores", "CUDA cores" for a tiled
    GEMM, "" otherwise), ``stages`` of its shared tiles (1: no pipeline), ``fill`` (how tiles
    are filled), ``intrinsic``/``block_tile``/``warps`` (tensor cores), ``buffers`` (one per
    shared tensor: its bytes per stage when the plan gives them, and the tile's ``layout`` —
    XOR-swizzled or padded rows — for tensor cores) and ``arrays`` (the static
    ``__shared__`` arrays' bytes, stages included) with ``dynamic`` (the dynamic pool), and
    ``region`` (the tensorized source lines)."""
    tc = next((d.data for d in kernel_plan.layout if isinstance(d.data, TensorCoreData)), None)
    tile = next((d.data for d in kernel_plan.layout if isinstance(d.data, GemmTileData)), None)
    facts = kernel.facts
    rec: dict[str, Any] = {
        "engine": "",
        "stages": 1,
        "fill": "",
        "intrinsic": "",
        "block_tile": [],
        "warps": [],
        "buffers": [
            {"tensor": t, "bytes": p.smem_bytes, "reason": p.reason}
            for t, p in kernel_plan.placements.items()
            if p.space == "shared"
        ],
        "arrays": [a.bytes for a in facts.shared_arrays] if facts is not None else [],
        "dynamic": facts.dynamic_shared_bytes if facts is not None else 0,
        "region": [],
    }
    if tc is not None:
        # the operand tiles: "<tensor>: <layout>" and bytes per stage, A then B
        tiles = {
            lay.split(": ", 1)[0]: (lay.split(": ", 1)[-1], n)
            for lay, n in zip(tc.layouts, tc.tile_bytes, strict=True)
        }
        for b in rec["buffers"]:
            if b["tensor"] in tiles:
                b["layout"], b["bytes"] = tiles[b["tensor"]]
        rec.update(
            engine="tensor cores",
            stages=tc.stages,
            fill=tc.fill,
            intrinsic=f"mma.sync.aligned.{tc.intrinsic}",
            block_tile=list(tc.block),
            warps=list(tc.warps),
            region=tensorized_lines(kernel.source),
        )
    elif tile is not None:
        rec.update(
            engine="CUDA cores",
            stages=tile.stages,
            fill="cp.async" if tile.stages > 1 else "loads and stores",
            block_tile=[*tile.block_tile, tile.k_tile],
        )
    return rec


def memory_line(mem: dict[str, Any]) -> str:
    """The record in one sentence (the page's and ``polyfuse explain``'s words)."""
    if not mem["engine"]:
        n = len(mem["buffers"])
        return f"{n} shared buffer(s), no pipelined loop" if n else "no shared memory tiles"
    m, n, k = (mem["block_tile"] + [0, 0, 0])[:3]
    head = f"{mem['engine']}: {m}×{n} block tile, k-tile {k}"
    if mem["engine"] == "tensor cores":
        wm, wn = mem["warps"]
        head += f", {mem['intrinsic']} on {wm}×{wn} warps"
    stages = (
        f"{mem['stages']} stages of shared tiles ({mem['fill']}): loads of the next k-tiles "
        "overlap the math"
        if mem["stages"] > 1
        else f"one shared stage ({mem['fill']})"
    )
    return f"{head}; {stages}"
