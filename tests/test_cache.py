"""The compile cache: identical layers are scheduled and generated once, in memory and on disk."""

import numpy as np

import polyfuse
from polyfuse import ops, te
from polyfuse.cache import CompileCache, rename
from polyfuse.graph.graph import build_graph
from polyfuse.graph.structure import structural_key


def two_layers(n=24, m=40):
    """softmax(h @ w) twice: the matmuls keep the layers in separate kernels."""
    x = te.placeholder((n, m), name="x")
    ws = [te.placeholder((m, m), name=f"w{i}") for i in range(2)]
    h = x
    for i, w in enumerate(ws):
        h = ops.softmax(ops.matmul(h, w, name=f"mm{i}"), name=f"layer{i}")
    return x, ws, h


def test_structural_key_ignores_names_but_not_shapes():
    a, b = te.placeholder((4, 8), name="a"), te.placeholder((4, 8), name="b")
    c = te.placeholder((4, 9), name="c")
    ka = structural_key(build_graph([a], [ops.exp(a, name="p")]), ["p"])
    kb = structural_key(build_graph([b], [ops.exp(b, name="q")]), ["q"])
    kc = structural_key(build_graph([c], [ops.exp(c, name="r")]), ["r"])
    assert ka.digest == kb.digest != kc.digest
    assert kb.canonical() == {"q": "pfT0", "b": "pfT1"}


def test_rename_covers_derived_names():
    text = "S_x_update(c0); r_x_acc = r_x; s_y[c0 - s_y_lo0] = x[blockIdx.x] * 1e-05f; r_xy;"
    out = rename(text, {"x": "pfT0", "y": "pfT1", "e": "pfT2"})
    assert out == (
        "S_pfT0_update(c0); r_pfT0_acc = r_pfT0; s_pfT1[c0 - s_pfT1_lo0] = pfT0[blockIdx.x]"
        " * 1e-05f; r_xy;"
    )


def test_identical_layers_are_generated_once():
    x, ws, h = two_layers()
    fn = polyfuse.compile([x] + ws, [h])
    assert len(fn.kernels) == 4  # matmul, softmax, matmul, softmax
    assert fn.cache_stats["hits"] >= 4  # layer 1 reuses layer 0's schedules and kernels
    cached = [kp.cached for kp in fn.plan.kernel_plans]
    assert cached == [False, False, True, True]
    a = fn.kernels[1]
    names_a = {"layer0": "L", "mm0": "M", "layer0_max": "A"}
    assert rename(a.source.replace(a.name, "K"), names_a).count("pf_allreduce") == 2
    rng = np.random.default_rng(0)
    xv, w0, w1 = (rng.standard_normal(t.shape).astype(np.float32) for t in [x] + ws)

    def sm(v):
        e = np.exp(v - v.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    want = sm(sm(xv.astype(np.float64) @ w0) @ w1)
    np.testing.assert_allclose(fn(xv, w0, w1, device="emulate"), want, rtol=1e-5)


def test_persistent_cache_warm_compile(tmp_path):
    x, ws, h = two_layers()
    cold = polyfuse.compile([x] + ws, [h], cache=CompileCache(tmp_path))
    x2, ws2, h2 = two_layers()
    warm = polyfuse.compile([x2] + ws2, [h2], cache=CompileCache(tmp_path))
    assert cold.cache_stats["misses"] > 0
    assert warm.cache_stats["misses"] == 0
    strip = lambda fn: [k.source.replace(k.name, "K") for k in fn.kernels]  # noqa: E731
    assert strip(warm) == strip(cold)
    assert "from the compile cache" in str(warm.plan.kernel_plans[0])
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(t.shape).astype(np.float32) for t in [x] + ws]
    np.testing.assert_allclose(warm(*args, device="emulate"), cold(*args, device="emulate"))
