"""Layer 3 parallel stitching: independent kernels share one launch (block-range dispatch)."""

import random
import sys
from pathlib import Path

import numpy as np
import pytest

import polyfuse
from polyfuse import ops, te
from polyfuse.base.decision import DecisionKind, Refusal
from polyfuse.cuda.codegen.kernel_ast import Kernel, KParam
from polyfuse.cuda.codegen.kernel_function import KFunction, print_function
from polyfuse.cuda.codegen.layer3 import part_shape
from polyfuse.poly.device import device_for_arch
from polyfuse.stitch.facts import KernelFacts, SharedArray
from polyfuse.stitch.order import dependence_order, dependence_preds
from polyfuse.stitch.parallel import PackConfig, PartShape, pack_layout, plan_packs
from polyfuse.viz import extract

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import suite  # noqa: E402

PACKED = {"adam3": 3, "two_branches": 2, "rmsnorm_swiglu": 2}  # kernels without Layer 3
SCALE = 512  # every reduced axis keeps its full size
DEVICE = device_for_arch("sm_80")


@pytest.mark.parametrize("name", sorted(PACKED))
def test_independent_kernels_share_one_launch(name):
    inputs, outputs, ref = suite.build(name, SCALE)
    fn = polyfuse.compile(inputs, outputs, check_cuda=False, name=name)
    off = polyfuse.compile(inputs, outputs, check_cuda=False, name=name, pack=False)
    assert len(fn.kernels) == 1, str(fn.plan)
    assert len(off.kernels) == PACKED[name] and not off.plan.packs
    (made,) = [d for d in fn.plan.packs if d.packed]
    assert len(made.kernels) == PACKED[name] and made.name == fn.kernels[0].name
    assert "modelled" in made.reason and made.gain_us > 0
    # the packed launch's modelled time, each part on its blocks, as the reason gives it
    assert made.packed_us is not None and f"packed {made.packed_us:.2f} us" in made.reason
    assert [m for ms in made.micrographs for m in ms] == fn.kernels[0].micrographs
    arrays = suite.random_inputs(name, inputs)
    want = ref(*arrays)
    for order in (False, "reverse", "random", "shadow"):
        got = fn(*arrays, race_check=order)
        got = got if isinstance(got, tuple) else (got,)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-4, err_msg=f"{name} {order}")
    # the emulator's count of distinct global bytes equals the isl footprints
    (t,) = fn.last_traffic
    k = fn.kernels[0]
    assert (t.kernel, t.bytes_read, t.bytes_written) == (k.name, k.bytes_read, k.bytes_written)
    assert fn.global_bytes() == off.global_bytes()


def test_refusals_are_recorded_with_their_reasons():
    x, y = te.placeholder((64, 48), name="x"), te.placeholder((64, 48), name="y")
    w = te.placeholder((64, 64), name="w")
    a = ops.relu(x, name="a")
    b = ops.reduce_sum(ops.exp(x), axis=0, name="b")  # 192 threads with barriers: not with a
    c = ops.tanh(y, name="c")
    d = ops.reduce_sum(ops.mul(c, b, name="cb"), axis=1, name="d")  # after b
    e = ops.sigmoid(w, name="e")
    fn = polyfuse.compile([x, y, w], [a, c, d, e], check_cuda=False)
    text = [str(p) for p in fn.plan.packs]
    assert any("dependence path" in t for t in text), text
    assert any("launch shapes differ" in t for t in text), text
    assert any("packed into" in t for t in text), text
    assert len(fn.kernels) == 3 and "parallel stitching (" in str(fn.plan)
    data = extract(fn)
    kinds = {k for p in data["packs"] for k in p["kinds"]}
    assert {"parallel stitch", "packed", "cycle", "form mismatch"} <= kinds
    rng = np.random.default_rng(0)
    X, Y, W = (rng.standard_normal(t.shape, dtype=np.float32) for t in (x, y, w))
    Xd, Yd = X.astype(np.float64), Y.astype(np.float64)
    for order in ("reverse", "random"):
        ga, gc, gd, ge = fn(X, Y, W, race_check=order)
        np.testing.assert_allclose(ga, np.maximum(X, 0), rtol=1e-6)
        np.testing.assert_allclose(gc, np.tanh(Y), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(gd, (np.tanh(Yd) * np.exp(Xd).sum(0)).sum(1), rtol=1e-4)
        np.testing.assert_allclose(ge, 1 / (1 + np.exp(-W.astype(np.float64))), rtol=1e-5)


def test_branches_of_one_input_share_one_launch_and_read_it_once():
    """A multi-head op: three branches read x; the pack's distinct bytes count x once."""
    x = te.placeholder((64, 64), name="x")
    outs = [
        ops.relu(x, name="a"),
        ops.reduce_sum(ops.mul(x, x, name="xx"), axis=1, name="d"),
        ops.reduce_max(x, axis=0, name="e"),
        ops.relu(x, name="a2"),  # a's twin: its kernel comes from the compile cache
    ]
    fn = polyfuse.compile([x], outs, check_cuda=False)
    off = polyfuse.compile([x], outs, check_cuda=False, pack=False)
    assert len(fn.kernels) == 1 and len(off.kernels) == 4, str(fn.plan)
    assert any(kp.cached for kp in off.plan.kernel_plans)
    assert fn.global_bytes() == off.global_bytes() - 3 * 64 * 64 * 4
    X = np.random.default_rng(0).standard_normal((64, 64), dtype=np.float32)
    Xd = X.astype(np.float64)
    for order in (False, "reverse", "random", "shadow"):
        a, d, e, a2 = fn(X, race_check=order)
        np.testing.assert_array_equal(a, np.maximum(X, 0))
        np.testing.assert_array_equal(a2, np.maximum(X, 0))
        np.testing.assert_allclose(d, (Xd * Xd).sum(1), rtol=1e-5)
        np.testing.assert_array_equal(e, X.max(0))
    (t,) = fn.last_traffic
    k = fn.kernels[0]
    assert (t.bytes_read, t.bytes_written) == (k.bytes_read, k.bytes_written) == (16384, 33280)


def test_cached_stitched_kernels_sharing_an_input_pack_and_count_it_once():
    """A stitched kernel served by the compile cache (the second softmax) carries its read
    footprints in its plan, so it packs with its twin and the pack reads x once. Graph passes
    off: CSE would merge the twins' reductions into one stitched kernel, with nothing to pack."""
    x = te.placeholder((64, 64), name="x")
    outs = [ops.softmax(x), ops.softmax(x)]
    fn = polyfuse.compile([x], outs, check_cuda=False, passes=False)
    off = polyfuse.compile([x], outs, check_cuda=False, pack=False, passes=False)
    assert any(kp.cached for kp in off.plan.kernel_plans) and len(off.kernels) == 2
    assert len(fn.kernels) == 1, str(fn.plan)
    (d,) = fn.plan.packs
    assert d.packed
    assert fn.global_bytes() == off.global_bytes() - 64 * 64 * 4
    X = np.random.default_rng(0).standard_normal((64, 64), dtype=np.float32)
    e = np.exp(X.astype(np.float64) - X.max(1, keepdims=True))
    for got in fn(X, race_check="shadow"):
        np.testing.assert_allclose(got, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
    (t,) = fn.last_traffic
    assert (t.bytes_read, t.bytes_written) == (
        fn.kernels[0].bytes_read,
        fn.kernels[0].bytes_written,
    )


def test_gemm_parts_keep_their_block_and_staged_inputs_are_not_shared():
    """A GEMM (tiles of a staged in shared memory) packs with an elementwise kernel folded into
    its block; two GEMMs reading the same staged input stay apart (overlap not countable)."""
    a = te.placeholder((64, 96), name="a")
    w1, w2 = te.placeholder((96, 128), name="w1"), te.placeholder((96, 128), name="w2")
    z = te.placeholder((64, 128), name="z")
    outs = [ops.matmul(a, w1, name="y1"), ops.matmul(a, w2, name="y2"), ops.tanh(z, name="t")]
    fn = polyfuse.compile([a, w1, w2, z], outs, check_cuda=False)
    assert len(fn.kernels) == 2, str(fn.plan)
    assert any("both read a" in d.reason and not d.packed for d in fn.plan.packs)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(t.shape, dtype=np.float32) for t in (a, w1, w2, z)]
    A, W1, W2, Z = (x.astype(np.float64) for x in arrays)
    for order in ("reverse", "shadow"):
        g1, g2, gt = fn(*arrays, race_check=order)
        np.testing.assert_allclose(g1, A @ W1, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(g2, A @ W2, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(gt, np.tanh(Z), rtol=1e-5, atol=1e-6)
    for t, k in zip(fn.last_traffic, fn.kernels, strict=True):
        assert (t.bytes_read, t.bytes_written) == (k.bytes_read, k.bytes_written), k.name


def _part(name, threads, collective=False, grid=64, nbytes=1 << 20):
    return PartShape(name, grid, threads, nbytes, KernelFacts(barriers=collective))


def test_barrier_parts_are_not_padded():
    """A part with barriers needs every thread of its block: it is never padded."""
    assert isinstance(pack_layout([_part("r", 256, True), _part("s", 512, True)]), Refusal)
    # a free part larger than the barrier part's block is split over its blocks instead
    split = pack_layout([_part("r", 256, True), _part("e", 512)])
    assert not isinstance(split, Refusal)
    assert split.block == 256 and split.ranges == [(0, 64, 1), (64, 128, 1)]
    assert isinstance(pack_layout([_part("r", 256, True), _part("e", 384)]), Refusal)
    assert isinstance(pack_layout([_part("r", 256, True), _part("e", 96)]), Refusal)
    lay = pack_layout([_part("r", 1024, True, grid=8), _part("e", 256, grid=343)])
    assert lay.block == 1024 and lay.ranges == [(0, 8, 1), (8, 86, 4)]  # 4 blocks of 256 fold


def test_packing_never_closes_a_path():
    """A→C→B: A and B are independent of each other in neither direction's sense."""
    acc = [({"x"}, {"a"}), ({"c"}, {"b"}), ({"a"}, {"c"}), ({"y"}, {"e"})]
    parts = [_part(f"k{i}", 256) for i in range(4)]
    groups, decisions = plan_packs(parts, acc, DEVICE, PackConfig(min_gain_us=-1e9))
    assert not any({0, 1} <= set(g) for g in groups)
    assert any(len(g) > 1 for g in groups)
    # {A,B} and {C,D} with A→D and C→B: each pair is independent, both packs form a cycle
    acc = [({"x"}, {"a"}), ({"c"}, {"b"}), ({"y"}, {"c"}), ({"a"}, {"d"})]
    groups, _ = plan_packs(parts, acc, DEVICE, PackConfig(min_gain_us=-1e9))
    _check(groups, acc, 4)


@pytest.mark.slow  # 6 s
def test_deep_kernel_chains_need_no_recursion():
    """A 2200-kernel chain with a side branch per link (a deep model's shape): reachability is
    folded iteratively (it recursed once per kernel and hit Python's limit at ~1000)."""
    acc = []
    for i in range(1100):
        acc.append(({f"t{i}"}, {f"t{i + 1}"}))  # the chain
        acc.append(({f"t{i}"}, {f"s{i}"}))  # a branch off it, independent of the next link
    parts = [_part(f"k{i}", 256) for i in range(len(acc))]
    groups, _ = plan_packs(parts, acc, DEVICE, PackConfig(min_gain_us=-1e9))
    _check(groups, acc, len(acc))
    assert any(len(g) > 1 for g in groups)


def test_what_a_part_may_contain():
    """Eligibility and collectiveness come from the kernel's facts, not its text."""

    def kernel(facts: KernelFacts | None, printed: bool = True) -> Kernel:
        body = "  y[b0 * 64 + t0] = 1.0f;\n"
        fn = KFunction((("float*", "y"),), 64, 0, (("b0", 4),), (("t0", 64),), body)
        return Kernel(
            "k",
            [KParam("y", "float*", "y")],
            [],
            (4, 1, 1),
            (64, 1, 1),
            ["m"],
            facts=facts,
            source=print_function(fn, "k"),
            printed=fn if printed else None,
        )

    plain = part_shape(kernel(KernelFacts()))
    assert plain.ineligible is None and not plain.collective
    shfl = part_shape(kernel(KernelFacts(shuffles=True)))
    assert shfl.ineligible is None and shfl.collective  # lanes must stay real lanes
    smem = part_shape(kernel(KernelFacts(shared_arrays=(SharedArray(256, 4),))))
    assert smem.collective  # folded blocks would share the array
    assert part_shape(kernel(KernelFacts(registers=40))).registers == 40
    assert part_shape(kernel(KernelFacts(axes=("x", "y")))).ineligible
    assert "already a packed" in str(part_shape(kernel(KernelFacts(parts=2))).ineligible)
    assert "no kernel facts" in str(part_shape(kernel(None)).ineligible)
    # text alone (no printed function to print as a part) is not a part
    assert "not one printed kernel function" in str(
        part_shape(kernel(KernelFacts(), printed=False)).ineligible
    )


def test_parts_whose_shared_memory_does_not_fit_are_not_packed():
    tiles = KernelFacts(shared_arrays=(SharedArray(32 * 1024, 16),))
    big = [PartShape(f"r{i}", 64, 256, 1 << 20, tiles) for i in range(2)]
    acc = [({"x"}, {"a"}), ({"y"}, {"b"})]
    groups, decisions = plan_packs(big, acc, DEVICE, PackConfig(min_gain_us=-1e9))
    assert groups == [[0], [1]]
    (d,) = [d for d in decisions if "does not fit 48 KB" in d.reason]
    assert d.data == {"static_bytes": 64 * 1024, "dynamic_bytes": 0}
    assert DecisionKind.FOOTPRINT in d.decision_kinds
    pool = KernelFacts(dynamic_shared_bytes=200 * 1024)
    huge = [PartShape(f"d{i}", 64, 256, 1 << 20, pool) for i in range(2)]
    groups, decisions = plan_packs(huge, acc, DEVICE)
    assert groups == [[0], [1]] and not any(d.packed for d in decisions)


def _closure(preds: list[set[int]], n: int) -> list[set[int]]:
    """Ancestors of every kernel (plain DFS, independent of the code under test)."""
    anc: list[set[int]] = []
    for j in range(n):
        seen, stack = set(), list(preds[j])
        while stack:
            i = stack.pop()
            if i not in seen:
                seen.add(i)
                stack.extend(preds[i])
        anc.append(seen)
    return anc


def _check(groups, acc, n):
    preds = dependence_preds(acc)
    anc = _closure(preds, n)
    assert sorted(i for g in groups for i in g) == list(range(n))
    pos = {i: p for p, g in enumerate(groups) for i in g}
    for g in groups:
        for a in g:
            for b in g:
                assert a == b or a not in anc[b], (groups, acc)
    for j in range(n):
        for i in preds[j]:
            assert pos[i] < pos[j], (groups, acc)  # the launch order is topological
    # the driver re-derives the order from the packs' buffers: it must agree
    merged = [
        (set().union(*(acc[i][0] for i in g)), set().union(*(acc[i][1] for i in g))) for g in groups
    ]
    order = dependence_order(merged, [str(g) for g in groups])
    rank = {i: order.index(pos[i]) for i in range(n)}
    for j in range(n):
        for i in preds[j]:
            assert rank[i] < rank[j], (groups, acc)


@pytest.mark.parametrize("eager", [False, True])
def test_random_kernel_dags_never_pack_dependent_kernels(eager):
    rng = random.Random(14 + eager)
    cfg = PackConfig(min_gain_us=-1e9 if eager else 0.0)  # eager: pack whatever is legal
    packs = 0
    cases = 0
    while cases < 300:
        n = rng.randint(2, 12)
        pool = [f"b{i}" for i in range(rng.randint(2, 2 * n))]
        acc = []
        for _ in range(n):
            w = set(rng.sample(pool, min(len(pool), rng.randint(1, 2))))
            r = set(rng.sample(pool, min(len(pool), rng.randint(0, 3)))) - w
            acc.append((r, w))
        try:
            dependence_order(acc, [f"k{i}" for i in range(n)])
        except polyfuse.errors.CallError:
            continue  # a cycle through buffers: the driver refuses it before Layer 3
        cases += 1
        parts = [
            _part(
                f"k{i}",
                rng.choice([64, 128, 256, 512, 1024]),
                rng.random() < 0.3,
                rng.randint(1, 5000),
                rng.randint(1, 1 << 26),
            )
            for i in range(n)
        ]
        groups, decisions = plan_packs(parts, acc, DEVICE, cfg)
        _check(groups, acc, n)
        made = [set(d.kernels) for d in decisions if d.packed]
        multi = [{f"k{i}" for i in g} for g in groups if len(g) > 1]
        assert sorted(map(sorted, made)) == sorted(map(sorted, multi))
        packs += len(multi)
    assert packs > 50  # the test exercised packing, not just refusals


def test_packed_launches_compile_with_nvrtc():
    """The dispatch kernels are valid CUDA; ptxas reports them (skipped without a compiler)."""
    from polyfuse.cuda.toolchain.compiler import available_compilers

    if not available_compilers():
        pytest.skip("no CUDA compiler installed")
    for name in sorted(PACKED):
        inputs, outputs, _ = suite.build(name, SCALE)
        fn = polyfuse.compile(inputs, outputs, check_cuda=False, name=name)
        binary = fn.check_cuda("sm_80")
        assert binary.resources[fn.kernels[0].name].spill_stores == 0
        assert fn.kernels[0].registers > 0
