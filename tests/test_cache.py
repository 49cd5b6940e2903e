"""The compile cache: identical layers are scheduled and generated once, in memory and on disk."""

import numpy as np
import pytest

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
    # per layer one kernel: the matmul's whole-row tile takes the softmax (stitch/gemm_rows.py)
    assert len(fn.kernels) == 2
    assert fn.cache_stats["hits"] >= 4  # layer 1 reuses layer 0's schedules and kernels
    cached = [kp.cached for kp in fn.plan.kernel_plans]
    assert cached == [False, True]
    a = fn.kernels[0]
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


# ------------------------------------------------------------------ cached schedules = fresh ones


def _graphs():
    """Every built-in example, benchmark-suite subgraph (compile scale) and end-to-end case."""
    import sys
    from pathlib import Path

    from polyfuse import examples

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import suite  # noqa: PLC0415
    from cases import build_cases  # noqa: PLC0415

    out = [(f"example:{n}", *ex.build()[:2]) for n, ex in examples.EXAMPLES.items()]
    out += [(f"suite:{n}", *suite.build(n, 16)[:2]) for n in suite.NAMES]
    out += [(f"case:{c.name}", c.inputs, c.outputs) for c in build_cases()]
    return out


@pytest.mark.slow  # ~17 s on 2 cores (fast tier near its 15-minute limit)
def test_kernels_from_cached_schedules_are_byte_identical_to_fresh_ones():
    """A crash between the schedule and the kernel writes leaves schedules without kernels:
    regenerating from them must give the very kernels a fresh compile gives (the isl options
    tiling depends on were once set only by the scheduler, so cached schedules tiled
    differently and the layer norm came out NaN)."""
    bad = []
    for label, ins, outs in _graphs():
        fresh = polyfuse.compile(ins, outs, check_cuda=False, cache=CompileCache())
        warm = CompileCache()
        polyfuse.compile(ins, outs, check_cuda=False, cache=warm)
        warm.memory = {k: v for k, v in warm.memory.items() if "function" not in v}
        again = polyfuse.compile(ins, outs, check_cuda=False, cache=warm)
        cached = [kp.cached for kp in again.plan.kernel_plans]
        assert cached == [kp.cached for kp in fresh.plan.kernel_plans]  # regenerated
        if [k.source for k in again.kernels] != [k.source for k in fresh.kernels]:
            bad.append(label)
    assert not bad, f"kernels from cached schedules differ: {bad}"
