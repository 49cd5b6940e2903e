"""Layer 2: parallel reductions and memory stitching.

Every norm/softmax pattern becomes one kernel whose reductions run in parallel, correct on
the emulator (also in race-check mode) and accepted by NVRTC/nvcc; long rows stay correct;
every stitch made or refused has its reason in the plan.
"""

import numpy as np
import pytest

import polyfuse
from polyfuse import ops, te
from polyfuse.cuda.toolchain.compiler import available_compilers

RNG = np.random.default_rng(7)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def np_ln(x, g, b, eps=1e-5):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * g + b


def np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def pattern(name):
    """(inputs, outputs, arrays, numpy reference outputs) of one pattern."""
    if name == "layer_norm":
        x, g, b = (
            te.placeholder((37, 300), name="x"),
            te.placeholder((300,), name="g"),
            te.placeholder((300,), name="b"),
        )
        arrs = [rand(37, 300), rand(300), rand(300)]
        return (
            [x, g, b],
            [ops.layer_norm(x, g, b)],
            arrs,
            [np_ln(*[a.astype(np.float64) for a in arrs])],
        )
    if name == "rms_norm":
        x, w = te.placeholder((40, 512), name="x"), te.placeholder((512,), name="w")
        arrs = [rand(40, 512), rand(512)]
        X, W = (a.astype(np.float64) for a in arrs)
        want = X / np.sqrt((X * X).mean(-1, keepdims=True) + 1e-6) * W
        return [x, w], [ops.rms_norm(x, w)], arrs, [want]
    if name == "softmax":
        x = te.placeholder((33, 1000), name="x")
        arrs = [rand(33, 1000)]
        return [x], [ops.softmax(x)], arrs, [np_softmax(arrs[0].astype(np.float64))]
    if name == "log_softmax":
        x = te.placeholder((50, 77), name="x")
        arrs = [rand(50, 77)]
        X = arrs[0].astype(np.float64)
        s = X - X.max(-1, keepdims=True)
        return [x], [ops.log_softmax(x)], arrs, [s - np.log(np.exp(s).sum(-1, keepdims=True))]
    if name == "residual_layer_norm":
        x, r = te.placeholder((20, 768), name="x"), te.placeholder((20, 768), name="r")
        g, b = te.placeholder((768,), name="g"), te.placeholder((768,), name="b")
        h = ops.add(x, r, name="h")
        arrs = [rand(20, 768), rand(20, 768), rand(768), rand(768)]
        X, R, G, B = (a.astype(np.float64) for a in arrs)
        return [x, r, g, b], [h, ops.layer_norm(h, g, b)], arrs, [X + R, np_ln(X + R, G, B)]
    if name == "attention_softmax":
        s = te.placeholder((16, 12, 128, 128), name="s")
        mask = te.placeholder((16, 1, 1, 128), name="mask")
        y = ops.softmax(ops.add(ops.mul(s, 0.125), mask))
        arrs = [rand(16, 12, 128, 128), rand(16, 1, 1, 128)]
        S, Mk = (a.astype(np.float64) for a in arrs)
        return [s, mask], [y], arrs, [np_softmax(S * 0.125 + Mk)]
    if name == "batch_norm_train_relu":
        x = te.placeholder((8, 16, 14, 14), name="x")
        g, b = te.placeholder((16, 1, 1), name="gamma"), te.placeholder((16, 1, 1), name="beta")
        mu = ops.reduce_mean(x, axis=(0, 2, 3), keepdims=True, name="mu")
        d = ops.sub(x, mu, name="d")
        var = ops.reduce_mean(ops.mul(d, d), axis=(0, 2, 3), keepdims=True, name="var")
        y = ops.relu(ops.add(ops.mul(ops.mul(d, ops.rsqrt(ops.add(var, 1e-5))), g), b))
        arrs = [rand(8, 16, 14, 14), rand(16, 1, 1), rand(16, 1, 1)]
        X, G, B = (a.astype(np.float64) for a in arrs)
        M = X.mean((0, 2, 3), keepdims=True)
        V = ((X - M) ** 2).mean((0, 2, 3), keepdims=True)
        want = np.maximum((X - M) / np.sqrt(V + 1e-5) * G + B, 0)
        return [x, g, b], [y, mu, var], arrs, [want, M, V]
    raise KeyError(name)


PATTERNS = [
    "layer_norm",
    "rms_norm",
    "softmax",
    "log_softmax",
    "residual_layer_norm",
    "attention_softmax",
    "batch_norm_train_relu",
]
_fns: dict[str, tuple] = {}


def compiled(name):
    if name not in _fns:
        ins, outs, arrs, want = pattern(name)
        _fns[name] = (polyfuse.compile(ins, outs, name=name), arrs, want)
    return _fns[name]


def check(fn, arrs, want, race_check=False, rtol=1e-4, atol=1e-5):
    got = fn(*arrs, device="emulate", race_check=race_check)
    got = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w.reshape(g.shape), rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", PATTERNS)
def test_pattern_is_one_parallel_kernel(name):
    fn, arrs, want = compiled(name)
    assert len(fn.kernels) == 1, str(fn.plan)
    (mm,) = fn.plan.mapped
    assert mm.strategy is not None  # a parallel reduction layout
    assert mm.strategy.serial_per_thread() <= 1024
    assert any(d.stitched for d in fn.plan.stitches)


@pytest.mark.parametrize("race_check", [False, True])
@pytest.mark.parametrize("name", PATTERNS)
def test_pattern_matches_numpy(name, race_check):
    fn, arrs, want = compiled(name)
    check(fn, arrs, want, race_check)


@pytest.mark.parametrize("name", PATTERNS)
def test_pattern_moves_compulsory_bytes(name):
    fn, arrs, _ = compiled(name)
    assert fn.global_bytes() == fn.compulsory_bytes()


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", PATTERNS)
def test_pattern_compiles(name, arch):
    if not available_compilers():
        pytest.skip("no CUDA compiler")
    fn, _, _ = compiled(name)
    binary = fn.check_cuda(arch)
    assert binary.resources[fn.kernels[0].name].registers > 0


@pytest.mark.slow  # 6 s each
@pytest.mark.parametrize("which", ["softmax", "layer_norm"])
def test_rows_too_long_for_shared_memory(which):
    M, N = 64, 262144
    x = te.placeholder((M, N), name="x")
    if which == "softmax":
        ins, outs = [x], [ops.softmax(x)]
        arrs = [rand(M, N)]
        want = np_softmax(arrs[0].astype(np.float64))
    else:
        g, b = te.placeholder((N,), name="g"), te.placeholder((N,), name="b")
        ins, outs = [x, g, b], [ops.layer_norm(x, g, b)]
        arrs = [rand(M, N), rand(N), rand(N)]
        want = np_ln(*[a.astype(np.float64) for a in arrs])
    fn = polyfuse.compile(ins, outs)
    assert len(fn.kernels) == 1
    text = str(fn.plan)
    assert "recomputed in" in text  # the row does not fit: recomputed from x, not spilled
    assert "does not fit" in text or "recomputed" in text
    assert fn.global_bytes() == fn.compulsory_bytes()
    check(fn, arrs, [want], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "shape, axis",
    [((300, 500), 0), ((300, 500), 1), ((6, 70, 90), 1), ((6, 70, 90), (0, 2)), ((300, 500), None)],
)
def test_reductions_on_every_axis_are_parallel(shape, axis):
    x = te.placeholder(shape, name="x")
    fn = polyfuse.compile([x], [ops.reduce_sum(x, axis=axis), ops.reduce_max(x, axis=axis)])
    for mm in [mm for kp in fn.plan.kernel_plans for mm in kp.parts]:  # Layer 3 packs too
        assert mm.strategy is not None, str(fn.plan)
        assert mm.strategy.serial_per_thread() <= 1024
    X = rand(*shape)
    s, m = fn(X, device="emulate", race_check=True)
    np.testing.assert_allclose(s, X.astype(np.float64).sum(axis=axis), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(m, X.max(axis=axis))


@pytest.mark.parametrize(
    "shape, axis", [((1000, 1000), None), ((1_000_000, 3), 0), ((2, 1_000_000), 1)]
)
def test_sums_over_a_million_elements(shape, axis):
    x = te.placeholder(shape, name="x")
    fn = polyfuse.compile([x], [ops.reduce_sum(x, axis=axis)])
    assert len(fn.kernels) == 2  # partial sums across blocks, then the final sum
    assert "split into" in str(fn.plan)
    for mm in fn.plan.mapped:
        assert mm.strategy.serial_per_thread() <= 256
    X = RNG.random(shape, dtype=np.float32)
    got = fn(X, device="emulate")
    want = X.astype(np.float64).sum(axis=axis)
    assert np.max(np.abs(got - want) / np.abs(want)) < 1e-4


def test_shared_memory_matches_ptxas_and_plan():
    if not available_compilers():
        pytest.skip("no CUDA compiler")
    x = te.placeholder((10, 1000), name="x")
    fn = polyfuse.compile([x], [ops.softmax(x, name="sm")])
    (k,) = fn.kernels
    (kp,) = fn.plan.kernel_plans
    shared = [p for p in kp.placements.values() if p.space == "shared"]
    assert [p.tensor for p in shared] == ["sm_exp"]
    footprint = sum(p.smem_floats for p in shared) * 4
    assert footprint == 1000 * 4  # one row of exp per block (isl box)
    scratch = k.block[0] * 4  # the combine's scratch
    binary = fn.check_cuda("sm_80")
    assert binary.resources[k.name].shared_bytes == footprint + scratch
    assert k.static_shared_bytes == footprint + scratch


def test_large_footprint_uses_opt_in_dynamic_shared_memory():
    # 60 KB per row: more than the 48 KB static limit, within sm_80's opt-in 163 KB.
    x = te.placeholder((4, 15000), name="x")
    fn = polyfuse.compile([x], [ops.softmax(x, name="sm")])
    (k,) = fn.kernels
    assert k.dynamic_shared_bytes == 15000 * 4  # the launch's dynamic pool
    assert k.shared_bytes == 15000 * 4 + k.facts.static_shared_bytes
    assert fn.launches[0].shared_bytes == 15000 * 4
    assert "extern __shared__" in k.source
    X = rand(4, 15000)
    np.testing.assert_allclose(
        fn(X, device="emulate"), np_softmax(X.astype(np.float64)), rtol=1e-4, atol=1e-7
    )


def test_stitch_refusals_have_reasons():
    # Row sums then a column reduction of the result: forms differ (y vs x) -> no rule-8 stitch.
    x = te.placeholder((64, 48), name="x")
    rows = ops.reduce_sum(ops.exp(x), axis=1, keepdims=True, name="rows")
    y = ops.div(x, rows, name="y")
    col = ops.reduce_sum(y, axis=0, name="col")
    fn = polyfuse.compile([x], [col])
    reasons = [str(d) for d in fn.plan.stitches if not d.stitched]
    assert any("canonical forms differ" in r or "do not match" in r for r in reasons), reasons
    X = rand(64, 48)
    Xd = X.astype(np.float64)
    np.testing.assert_allclose(
        fn(X, device="emulate"), (Xd / np.exp(Xd).sum(1, keepdims=True)).sum(0), rtol=1e-4
    )


def test_stitching_can_be_disabled_for_comparison():
    x = te.placeholder((33, 100), name="x")
    on = polyfuse.compile([x], [ops.softmax(x)])
    off = polyfuse.compile([x], [ops.softmax(x)], stitch=False)
    assert len(on.kernels) == 1 and len(off.kernels) == 3
    assert off.global_bytes() > on.global_bytes() == on.compulsory_bytes()
