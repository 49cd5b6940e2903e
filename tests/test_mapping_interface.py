"""The one mapping interface, module hygiene, and compile() leaving its stage objects alone.

Before/after tests call :func:`polyfuse.poly.kernel_map.map_kernel` directly on the scheduled
micrographs of small graphs (a plain and a reduction kernel) and check the fields every later
stage reads; the hygiene test walks the AST of every polyfuse module for imports of another
module's private names; the mutation test snapshots the graph when partitioning starts and
checks code generation (including a recompute) left it as it was.
"""

from __future__ import annotations

import ast
from pathlib import Path

import islpy as isl
import pytest

import polyfuse
import polyfuse.driver as driver
from polyfuse import ops, te
from polyfuse.cuda.codegen.astgen import generate_ast
from polyfuse.cuda.codegen.lower import kernel_ir
from polyfuse.graph.graph import build_graph
from polyfuse.graph.partition import PARTITION_RULES, partition
from polyfuse.poly import kernel_map
from polyfuse.poly.compose import CompositionError
from polyfuse.poly.device import A100
from polyfuse.poly.kernel_map import map_kernel, place_kernel
from polyfuse.poly.mapping import MappedKernel, MappingConfig
from polyfuse.poly.model import build_model
from polyfuse.poly.policy import reduction_tile_budget
from polyfuse.poly.promote import GemmKernel
from polyfuse.poly.schedule import DEFAULT_BUDGET, compute_schedule, configure
from polyfuse.stitch.memory import stitch_memory
from polyfuse.stitch.recompute import recompute_spills

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = ["polyfuse"]  # every package lives under it


def _groups(ins, outs):
    """The kernel groups of a small graph after Layer 2 stitching (no driver involved)."""
    ctx = configure(isl.Context())
    graph = build_graph(ins, outs, ctx)
    part = partition(graph, PARTITION_RULES, set())
    scheduled = [
        compute_schedule(build_model(graph, mg, ctx), DEFAULT_BUDGET) for mg in part.micrographs
    ]
    groups, _ = stitch_memory(graph, part, scheduled, A100)
    return graph, groups


def _band_members(sched: isl.Schedule) -> int:
    """Band members on the path of first children from the root (the outer loop nest)."""
    node, n = sched.get_root(), 0
    while node.has_children():
        node = node.child(0)
        if node.get_type() == isl.schedule_node_type.band:
            n += node.band_n_member()
    return n


def test_plain_kernel_maps_onto_blocks_and_threads():
    x = te.placeholder((64, 300), name="x")
    y = te.compute((64, 300), lambda i, j: x[i, j] * 2.0 + 1.0, name="y")
    graph, (g,) = _groups([x], [y])
    assert g.strategy is None
    (sm,) = g.parts
    before = _band_members(sm.schedule)
    assert before == 2  # isl's band over (i, j), both coincident

    mm = map_kernel(graph, g.parts, g.strategy, A100, MappingConfig(max_threads=256))
    assert isinstance(mm, MappedKernel)
    assert mm.parts == [sm] and mm.scheduled is sm and mm.strategy is None
    assert mm.lanes == 1 and not mm.lane_params and not mm.laneless and not mm.combined
    # the 300-wide inner member takes 2 tiles of 150 threads; 64 rows are blocks
    assert mm.tile_sizes == [1, 150] and mm.grid_dims == [64, 2]
    assert mm.thread_order == [("t0", 1), ("t1", 150)]
    assert (mm.grid, mm.block) == (128, 150)
    assert _band_members(mm.schedule) == 0  # after: both members bound to b/t parameters
    want = "[b0, b1, t0, t1] -> { : t0 = 0 and 0 <= b0 < 64 and 0 <= b1 < 2 and 0 <= t1 < 150 }"
    assert mm.context.is_equal(isl.Set(want, context=mm.context.get_ctx()))
    placements = place_kernel(mm, A100)
    assert {p.space for p in placements.values()} == {"global"}
    ir = kernel_ir("k", mm, generate_ast(mm)[1])
    assert ir.threads == 150 and ir.blocks == 128 and not ir.reduction


def test_reduction_kernel_maps_lanes_through_the_same_interface():
    x = te.placeholder((32, 1024), name="x")
    graph, (g,) = _groups([x], [ops.softmax(x, name="sm")])
    assert g.strategy is not None and len(g.parts) > 1  # max, exp-sum, divide stitched

    mm = map_kernel(graph, g.parts, g.strategy, A100)
    assert isinstance(mm, MappedKernel)
    assert mm.parts == g.parts and mm.strategy == g.strategy
    assert mm.lanes == g.strategy.lanes > 1 and mm.lane_params == ["l0"]
    assert mm.block == g.strategy.threads == mm.kept_tile * mm.lanes
    assert [p for p, _ in mm.thread_order] == ["r0", "l0"]  # lanes fastest (y-reduce)
    assert mm.grid == 32 // mm.kept_tile
    assert mm.notes == [f"reduction layout: {g.strategy}", mm.coarsening.reason]
    assert mm.coarsening.factor == 4  # runs of 4 per lane (poly/lane_vector.py)
    assert mm.combined  # the lanes' partial max and sum are combined
    # the union model runs every part's statements
    names = {s.name for sm in g.parts for s in sm.model.statements}
    assert {s.name for s in mm.scheduled.model.statements} == names
    placements = place_kernel(mm, A100)
    shared = [p for p in placements.values() if p.space == "shared"]
    assert shared  # the row lives in shared memory between the parts
    assert sum(p.smem_floats for p in shared) * 4 <= reduction_tile_budget(A100, mm.block)
    ir = kernel_ir("k", mm, generate_ast(mm)[1])
    assert ir.reduction and ir.lane_params == ("l0",) and ir.micrographs == tuple(g.names)


def test_gemm_like_micrograph_maps_through_the_same_interface():
    a, w = te.placeholder((64, 96), name="a"), te.placeholder((96, 128), name="w")
    graph, (g,) = _groups([a, w], [ops.matmul(a, w)])
    (sm,) = g.parts
    gk = map_kernel(graph, g.parts, g.strategy, A100)
    assert isinstance(gk, GemmKernel) and isinstance(gk, MappedKernel)
    assert gk.parts == [sm] and gk.strategy is None and gk.lanes == 1
    assert gk.thread_order == list(zip(gk.thread_params, gk.tile_sizes, strict=True))
    assert any(n.startswith("block tile") for n in gk.notes)
    shared = {t for t, p in place_kernel(gk, A100).items() if p.space == "shared"}
    assert shared == {p.tensor for p in gk.promotions} and shared <= {"a", "w"}

    plain = map_kernel(graph, g.parts, g.strategy, A100, MappingConfig(gemm=False))
    assert not isinstance(plain, GemmKernel) and plain.parts == [sm]


def test_a_reduction_without_layout_falls_back_to_serial_loops_without_mutation(monkeypatch):
    x = te.placeholder((32, 1024), name="x")
    graph, (g,) = _groups([x], [ops.reduce_sum(x, axis=1)])
    (sm,) = g.parts
    notes = list(sm.notes)

    def refuse(graph, parts, strategy, *rest):
        raise CompositionError("probe: no shared outer band")

    monkeypatch.setattr(kernel_map, "map_reduction_kernel", refuse)
    mm = map_kernel(graph, g.parts, g.strategy, A100)
    assert mm.strategy is None and mm.lanes == 1  # the plain mapping: one thread per row
    (part,) = mm.parts
    assert part.notes == [
        *notes,
        "no parallel reduction layout (probe: no shared outer band); reduction loops stay serial",
    ]
    assert part.model is sm.model and part.schedule is sm.schedule
    assert sm.notes == notes  # the scheduled micrograph itself is unchanged
    with pytest.raises(CompositionError):  # a stitched group always composes: no fallback
        map_kernel(graph, [sm, sm], g.strategy, A100)


def test_recompute_pass_inlines_into_a_view_before_lowering():
    # Rows of 65536 floats do not fit shared memory next to the combine scratch: the divide
    # recomputes exp(x - max) from x instead of reading a spilled row back.
    x = te.placeholder((2, 65536), name="x")
    graph, (g,) = _groups([x], [ops.softmax(x, name="sm")])
    before = _snapshot(graph)
    first = map_kernel(graph, g.parts, g.strategy, A100)
    spilled = [t for t, p in place_kernel(first, A100).items() if p.spill_why]
    assert spilled  # before: a scratch buffer in global memory

    r = recompute_spills(graph, g.parts, g.strategy, A100)
    assert _snapshot(graph) == before  # the compile's graph is untouched
    # exp is inlined into the divide first, which exposes the subtraction's spill next
    assert [(d.data["tensor"], d.data["readers"]) for d in r.decisions] == [
        ("sm_exp", ["sm"]),
        ("sm_sub", ["sm"]),
    ]
    assert r.mapped.notes[-2:] == [d.reason for d in r.decisions]
    assert sorted(graph.dag.predecessors("sm")) == ["sm_exp", "sm_sum"]
    assert sorted(r.graph.dag.predecessors("sm")) == ["sm_max", "sm_sum"]  # reads x again
    assert {r.placements[t].space for t in ("sm_exp", "sm_sub")} == {"register"}
    assert r.mapped.parts == g.parts and r.mapped.strategy == g.strategy


def _imports_of_private_names(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("polyfuse"):
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}.{a.name}")
        elif isinstance(node, ast.ImportFrom) and node.level:  # relative imports
            out += [f"{path}:{node.lineno}: .{a.name}" for a in node.names if a.name[0] == "_"]
    return out


def test_no_module_imports_another_modules_private_name():
    files = [p for d in PACKAGE_DIRS for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 50
    bad = [hit for p in files for hit in _imports_of_private_names(p)]
    assert not bad, "\n".join(bad)


def test_the_private_import_check_can_fail(tmp_path):
    f = ROOT / "polyfuse" / "poly" / "_probe_private_import.py"
    try:
        f.write_text("from polyfuse.poly.mapping import _hidden\n")
        assert _imports_of_private_names(f)
    finally:
        f.unlink()


def _snapshot(graph):
    return (
        {n: (id(p), p.tensor) for n, p in graph.prims.items()},
        sorted(graph.dag.edges),
    )


def test_compile_does_not_rewrite_the_graph_during_code_generation(monkeypatch):
    # Rows of 65536 floats do not fit shared memory: the stitched softmax recomputes the
    # exponentials in the divide instead of spilling them (a view of the graph is inlined).
    seen = {}
    partition_ = driver.partition

    def spy(graph, *args, **kw):
        seen.setdefault("before", _snapshot(graph))
        seen["graph"] = graph
        return partition_(graph, *args, **kw)

    monkeypatch.setattr(driver, "partition", spy)
    x = te.placeholder((2, 65536), name="x")
    fn = polyfuse.compile([x], [ops.softmax(x, name="sm")], check_cuda=False)
    assert any(kp.recomputes for kp in fn.plan.kernel_plans), str(fn.plan)
    assert fn.plan.graph is seen["graph"]
    assert _snapshot(seen["graph"]) == seen["before"]


def test_feedback_rounds_do_not_rewrite_scheduled_micrographs(monkeypatch):
    # A tiny budget splits the chain over several partition rounds; schedules of micrographs
    # that fused are kept by primitive list and reused in later rounds (whose micrograph ids
    # are renumbered): the round gets a copy, the schedule it came from stays as it was.
    seen = []
    schedule_ = driver._schedule

    def spy(*args, **kw):
        sm = schedule_(*args, **kw)
        seen.append((sm, sm.model, sm.model.micrograph, list(sm.notes)))
        return sm

    monkeypatch.setattr(driver, "_schedule", spy)
    x, b = te.placeholder((6, 40), name="x"), te.placeholder((40,), name="b")
    c = te.compute((6, 40), lambda i, j: x[i, j] * 2.0 + b[j], name="c")
    for n in range(4):
        c = te.compute((6, 40), lambda i, j, c=c: te.exp(c[i, j]) - 1.0, name=f"c{n}")
    fn = polyfuse.compile([x, b], [c], budget=10, check_cuda=False)
    assert fn.plan.feedback and len(seen) > 1
    for sm, model, mg, notes in seen:
        assert sm.model is model and model.micrograph is mg and sm.notes == notes
    ids = {sm.model.micrograph.id for sm in fn.plan.scheduled}
    assert ids == {mg.id for mg in fn.plan.partition.micrographs}


@pytest.mark.parametrize("threads", [32, 1024])
def test_reduction_tile_budget_leaves_the_combine_scratch(threads):
    assert reduction_tile_budget(A100, threads) == A100.smem_per_block_optin - 4 * threads


def test_mapped_kernels_are_frozen_records():
    """Mapping results are not edited after construction: trying two tilings from one schedule
    needs no deep copy."""
    import dataclasses

    a, w = te.placeholder((64, 96), name="a"), te.placeholder((96, 128), name="w")
    graph, (g,) = _groups([a, w], [ops.matmul(a, w)])
    gk = map_kernel(graph, g.parts, g.strategy, A100)
    plain = map_kernel(graph, g.parts, g.strategy, A100, MappingConfig(gemm=False))
    for mk in (gk, plain):
        with pytest.raises(dataclasses.FrozenInstanceError):
            mk.tile_sizes = [1]  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        gk.tiling = None  # type: ignore[misc]
    wider = dataclasses.replace(plain, grid_dims=[1])
    assert wider.grid == 1 and plain.grid != 1 and wider.thread_order == plain.thread_order


def test_check_cuda_builds_new_kernel_records(monkeypatch):
    """Compiler-reported resources go into new Kernel objects (the plan's too); the kernels the
    code generator returned keep their fields."""
    import polyfuse.cuda.toolchain.compiler as compiler
    from polyfuse.cuda.toolchain.compiler import CudaBinary, KernelResources

    x = te.placeholder((64, 300), name="x")
    y = te.compute((64, 300), lambda i, j: x[i, j] * 2.0 + 1.0, name="y")
    fn = polyfuse.compile([x], [y], "sm_80", check_cuda=False)
    (old,) = fn.kernels
    name = old.function or old.name

    def fake(source: str, arch: str) -> CudaBinary:
        res = {name: KernelResources(name, registers=21)}
        return CudaBinary(arch, "fake", "cubin", b"", None, res, "", 0.0)

    monkeypatch.setattr(compiler, "compile_cuda", fake)
    fn.check_cuda("sm_80")
    (new,) = fn.kernels
    assert new is not old and new.registers == 21 and old.registers is None
    assert fn.plan.kernels == [new]


def test_a_given_gemm_tiling_carries_its_reason_as_data():
    """The reason of a given tiling (forced, or tuned by ``polyfuse tune``) travels in the
    config to the tiling's notes: nothing downstream matches note text to replace it."""
    a, w = te.placeholder((64, 96), name="a"), te.placeholder((96, 128), name="w")
    graph, (g,) = _groups([a, w], [ops.matmul(a, w)])
    tile = (32, 32, 2, 2, 8)
    forced = map_kernel(graph, g.parts, g.strategy, A100, MappingConfig(gemm_tile=tile))
    assert any(n == f"tile sizes forced by MappingConfig.gemm_tile={tile}" for n in forced.notes)
    cfg = MappingConfig(gemm_tile=tile, gemm_tile_reason="measured fastest; tile sizes")
    tuned = map_kernel(graph, g.parts, g.strategy, A100, cfg)
    assert f"measured fastest; tile sizes={tile}" in tuned.notes
    assert not any("forced" in n for n in tuned.notes)


def test_spilled_tensors_say_why_as_data():
    """A scratch placement carries why it is spilled (recompute reads it, not the prose)."""
    x = te.placeholder((2, 65536), name="x")  # rows too long for shared memory: spills
    graph, (g,) = _groups([x], [ops.softmax(x, name="sm")])
    pl = place_kernel(map_kernel(graph, g.parts, g.strategy, A100), A100)
    assert any(p.spill_why for p in pl.values())
    for p in pl.values():
        assert bool(p.spill_why) == p.reason.startswith("scratch buffer"), p
        if p.spill_why:
            assert p.reason == f"scratch buffer: {p.spill_why}"


def test_thresholds_are_declared_in_policy():
    """The shared-memory, thread and occupancy limits are stated once, in poly/policy.py (device
    specs aside): no module repeats them as bare numbers."""
    import re

    from polyfuse.poly.device import occupancy

    bare = re.compile(r"48 \* 1024|\b49152\b|REG_BUDGET =|REG_OVERHEAD =|threads > 1024\b")
    offenders = []
    for pkg in ("poly", "stitch", "cuda", "polyfuse"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path.name in ("policy.py", "device.py") and path.parent.name == "poly":
                continue
            if path.name == "limits.py" and path.parent.name == "runtime":
                continue  # the runtime leaf's own copy (test_runtime_leaf holds them equal)
            code = re.sub(r'"""(.|\n)*?"""', "", path.read_text())
            offenders += [f"{path.relative_to(ROOT)}: {m}" for m in bare.findall(code)]
    assert offenders == []
    # A100: 2048 threads, 64K registers, 164 KB shared per SM; 32 blocks at most (the one
    # occupancy formula, poly/device.occupancy)
    assert occupancy(A100, 256, 32, 0).blocks_per_sm == 8
    assert occupancy(A100, 64, 16, 0).blocks_per_sm == 32
    assert occupancy(A100, 256, 32, 100 * 1024).blocks_per_sm == 1
    assert occupancy(A100, 256, 32, 200 * 1024).blocks_per_sm == 0
