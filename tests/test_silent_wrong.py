"""Regression tests for silent wrong answers of the core compiler (issue 9, items 1, 2, 4, 5).

Each test compiles a small graph, runs it on the emulator and compares with numpy: kernel
launch order, size-1 axes, NaN/±inf propagation of max/min, same-named placeholders and
lambdas with default arguments.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import polyfuse
from polyfuse import reference, te
from polyfuse.errors import CallError, PolyfuseError
from polyfuse.stitch.order import dependence_order

RACE_MODES = (False, "reverse", "random")


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# --------------------------------------------------------------------------- 1. launch order


def _row_col_graph(m: int, n: int):
    x = te.placeholder((m, n), name="x")
    k = te.reduce_axis(n, name="k")
    q = te.reduce_axis(m, name="q")
    rs = te.compute((m,), lambda i: te.sum(x[i, k], axis=k), name="rowsum")
    cs = te.compute((n,), lambda j: te.sum(x[q, j], axis=q), name="colsum")
    y = te.compute((m, n), lambda i, j: x[i, j] / (rs[i] + cs[j]), name="y")
    return x, y


def _launches_read_only_written_buffers(fn: polyfuse.CompiledGraph) -> None:
    """Every launch reads only graph inputs or buffers an earlier launch wrote."""
    ready = {b.name for b in fn.buffers if b.role == "input"}
    kernels = {k.name: k for k in fn.kernels}
    assert [k.name for k in fn.kernels] == [la.kernel for la in fn.launches]
    for la in fn.launches:
        k = kernels[la.kernel]
        for p in k.params:
            if p.tensor and p.ctype.startswith("const"):
                assert p.tensor in ready, f"{la.kernel} reads {p.tensor} before it is written"
        ready |= {p.tensor for p in k.params if p.tensor and not p.ctype.startswith("const")}


@pytest.mark.parametrize("race_check", RACE_MODES)
def test_two_reductions_feeding_one_consumer(race_check):
    x, y = _row_col_graph(33, 47)
    fn = polyfuse.compile([x], [y])
    _launches_read_only_written_buffers(fn)
    a = np.abs(_rand(33, 47)) + 0.5
    want = a / (a.sum(1)[:, None] + a.sum(0)[None, :])
    np.testing.assert_allclose(fn(a, race_check=race_check), want, rtol=1e-5)


def test_launch_order_follows_buffers_not_creation():
    # kernel 0 reads what kernel 2 writes; kernel 1 is independent
    acc = [({"c"}, {"y"}), ({"x"}, {"a"}), ({"x"}, {"c"})]
    order = dependence_order(acc, ["k0", "k1", "k2"])
    assert order == [1, 2, 0]
    with pytest.raises(CallError, match="cycle"):
        dependence_order([({"b"}, {"a"}), ({"a"}, {"b"})], ["k0", "k1"])


# --------------------------------------------------------------------------- 2. size-1 axes

SHAPES = [(1, 1), (1, 8), (8, 1), (3, 1), (1, 3), (2, 1), (1, 33), (33, 1)]


def _row_total_graph(m: int, n: int):
    x = te.placeholder((m, n), name="x")
    j = te.reduce_axis(n, name="j")
    q = te.reduce_axis(m, name="q")
    s = te.compute((m,), lambda i: te.sum(x[i, j], axis=j), name="s")
    t = te.compute((1,), lambda z: te.sum(s[q], axis=q), name="t")
    y = te.compute((m, n), lambda i, jj: x[i, jj] * s[i] / (t[0] + 1), name="y")

    def ref(a):
        s_ = a.sum(1)
        return a * s_[:, None] / (s_.sum() + 1)

    return x, [y], ref


def _softmax_graph(m: int, n: int):
    x = te.placeholder((m, n), name="x")
    k = te.reduce_axis(n, name="k")
    k2 = te.reduce_axis(n, name="k2")
    mx = te.compute((m,), lambda i: te.max(x[i, k], axis=k), name="mx")
    e = te.compute((m, n), lambda i, j: te.exp(x[i, j] - mx[i]), name="e")
    s = te.compute((m,), lambda i: te.sum(e[i, k2], axis=k2), name="s")
    y = te.compute((m, n), lambda i, j: e[i, j] / s[i], name="y")

    def ref(a):
        z = np.exp(a - a.max(1, keepdims=True))
        return z / z.sum(1, keepdims=True)

    return x, [y], ref


def _layer_norm_graph(m: int, n: int):
    x = te.placeholder((m, n), name="x")
    k = te.reduce_axis(n, name="k")
    k2 = te.reduce_axis(n, name="k2")
    mean = te.compute((m,), lambda i: te.sum(x[i, k], axis=k) / n, name="mean")
    d = te.compute((m, n), lambda i, j: x[i, j] - mean[i], name="d")
    var = te.compute((m,), lambda i: te.sum(d[i, k2] * d[i, k2], axis=k2) / n, name="var")
    y = te.compute((m, n), lambda i, j: d[i, j] * te.rsqrt(var[i] + 1e-5), name="y")

    def ref(a):
        a = a.astype(np.float64)
        c = a - a.mean(1, keepdims=True)
        return c / np.sqrt((c * c).mean(1, keepdims=True) + 1e-5)

    return x, [y], ref


def _col_total_graph(m: int, n: int):
    x = te.placeholder((m, n), name="x")
    q = te.reduce_axis(m, name="q")
    k = te.reduce_axis(n, name="k")
    c = te.compute((n,), lambda j: te.sum(x[q, j], axis=q), name="c")
    t = te.compute((1,), lambda z: te.max(c[k], axis=k), name="t")
    y = te.compute((m, n), lambda i, j: x[i, j] * c[j] - t[0], name="y")

    def ref(a):
        c_ = a.sum(0)
        return a * c_[None, :] - c_.max()

    return x, [y], ref


_COMPILED: dict = {}
GRAPHS = {
    "row_total": _row_total_graph,
    "softmax": _softmax_graph,
    "layer_norm": _layer_norm_graph,
    "col_total": _col_total_graph,
}


@pytest.mark.parametrize("race_check", RACE_MODES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_size_one_axes(graph, shape, race_check):
    key = (graph, shape)
    if key not in _COMPILED:
        x, outs, ref = GRAPHS[graph](*shape)
        _COMPILED[key] = polyfuse.compile([x], outs, name=f"{graph}_{shape[0]}x{shape[1]}"), ref
    fn, ref = _COMPILED[key]
    a = _rand(*shape, seed=shape[0] * 100 + shape[1])
    got = fn(a, race_check=race_check)
    rtol = 1e-4 if graph == "layer_norm" else 1e-5
    np.testing.assert_allclose(got, ref(a), rtol=rtol, atol=1e-4)


# --------------------------------------------------------------------------- 4. NaN and ±inf


def _special(m: int, n: int) -> np.ndarray:
    a = _rand(m, n, seed=4)
    a[1, 3] = np.nan
    a[2, 0] = np.inf
    a[3, n - 1] = -np.inf
    a[4, :] = np.nan
    a[5, 2], a[5, 4] = np.inf, -np.inf
    a[6, :] = -np.inf
    a[7, :] = np.inf
    a[8, 5] = np.nan
    a[8, 6] = np.inf
    return a


@pytest.mark.parametrize("race_check", [False, "reverse"])
@pytest.mark.parametrize("n", [8, 47, 300])  # warp per row, block per row
def test_max_min_propagate_nan_and_inf(n, race_check):
    m = 9
    x = te.placeholder((m, n), name="x")
    k = te.reduce_axis(n, name="k")
    k2 = te.reduce_axis(n, name="k2")
    mx = te.compute((m,), lambda i: te.max(x[i, k], axis=k), name="row_max")
    mn = te.compute((m,), lambda i: te.min(x[i, k2], axis=k2), name="row_min")
    relu = te.compute((m, n), lambda i, j: te.maximum(x[i, j], 0.0), name="relu")
    lo = te.compute((m, n), lambda i, j: te.minimum(0.0, x[i, j]), name="lo")
    fn = polyfuse.compile([x], [mx, mn, relu, lo])
    a = _special(m, n)
    got = fn(a, race_check=race_check)
    want = (a.max(1), a.min(1), np.maximum(a, 0.0), np.minimum(0.0, a))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)  # NaN where numpy has NaN, ±inf kept
    ref = reference.evaluate([mx, mn, relu, lo], {x: a})
    for r, w in zip(ref, want, strict=True):
        np.testing.assert_array_equal(r, w)


@pytest.mark.parametrize("race_check", [False, "reverse"])
def test_column_and_total_max_propagate_nan(race_check):
    m, n = 40, 9
    x = te.placeholder((m, n), name="x")
    q = te.reduce_axis(m, name="q")
    r = te.reduce_axis(m, name="r")
    c = te.reduce_axis(n, name="c")
    col = te.compute((n,), lambda j: te.max(x[q, j], axis=q), name="col_max")
    tot = te.compute((1,), lambda z: te.min(x[r, c], axis=[r, c]), name="total_min")
    fn = polyfuse.compile([x], [col, tot])
    a = _rand(m, n, seed=5)
    a[7, 2] = np.nan
    a[30, 4] = np.inf
    got_col, got_tot = fn(a, race_check=race_check)
    np.testing.assert_array_equal(got_col, a.max(0))
    np.testing.assert_array_equal(got_tot, [np.nan])


# --------------------------------------------------------------------------- 5. names, closures


def _same_named():
    a = te.placeholder((4, 5), name="x")
    b = te.placeholder((4, 5), name="x")
    y = te.compute((4, 5), lambda i, j: a[i, j] - 2.0 * b[i, j], name="y")
    return a, b, y


def test_same_named_placeholders_bind_by_position():
    a, b, y = _same_named()
    fn = polyfuse.compile([a, b], [y])
    u, v = _rand(4, 5, seed=1), _rand(4, 5, seed=2)
    np.testing.assert_allclose(fn(u, v), u - 2 * v, rtol=1e-6)
    np.testing.assert_allclose(fn(v, u), v - 2 * u, rtol=1e-6)
    # generated code: two distinct parameters
    (k,) = fn.kernels
    params = [p.name for p in k.params if p.tensor]
    assert len(params) == len(set(params)) == 3
    with pytest.raises(CallError, match="2 inputs are named 'x'; pass them by position"):
        fn(u, x=v)
    with pytest.raises(CallError, match="2 inputs are named 'x'"):
        fn(x=u)


def test_same_named_placeholders_on_the_gpu_path(monkeypatch):
    """The GPU path binds same-named inputs by position too (program call intercepted)."""
    a, b, y = _same_named()
    fn = polyfuse.compile([a, b], [y])
    seen = {}

    class Prog:
        def __call__(self, argmap, outmap, stream):
            seen.update(argmap)
            return [np.zeros((4, 5), np.float32)]

    monkeypatch.setattr(fn, "device_program", lambda device: Prog())
    u, v = _rand(4, 5, seed=1), _rand(4, 5, seed=2)
    fn(u, v, device="cuda")
    idents = [fn._idents[t.uid] for t in fn.inputs]
    assert len(set(idents)) == 2
    assert seen[idents[0]] is u and seen[idents[1]] is v
    with pytest.raises(CallError, match="pass them by position"):
        fn(u, x=v, device="cuda")


def test_lambda_default_arguments_are_not_loop_variables():
    x = te.placeholder((3, 4), name="x")
    outs = []
    for c in (2.0, 3.0):
        outs.append(te.compute((3, 4), lambda i, j, c=c: x[i, j] * c, name=f"scale{int(c)}"))
    star = te.compute((3, 4), lambda i, *rest: x[i, rest[0]] + 1.0, name="star")
    kw = te.compute((3, 4), lambda i, j, **kw: x[i, j] - 1.0, name="kw")
    fn = polyfuse.compile([x], [*outs, star, kw])
    a = _rand(3, 4)
    got = fn(a)
    for g, w in zip(got, (a * 2, a * 3, a + 1, a - 1), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6)
    with pytest.raises(PolyfuseError, match="takes 3 loop variables"):
        te.compute((3, 4), lambda i, j, k: x[i, j], name="bad")
    with pytest.raises(PolyfuseError, match="keyword-only parameter 'c'"):
        te.compute((3, 4), lambda i, j, *, c: x[i, j] * c, name="bad2")


def test_fixed_kernels_compile_with_nvrtc():
    """The NaN helpers and the size-1 layouts are valid CUDA (skipped without a compiler)."""
    from polyfuse.cuda.toolchain.compiler import available_compilers

    if not available_compilers():
        pytest.skip("no CUDA compiler installed")
    for graph, shape in (("row_total", (8, 1)), ("row_total", (1, 8)), ("col_total", (1, 3))):
        x, outs, _ = GRAPHS[graph](*shape)
        kk = te.reduce_axis(shape[1], name="kk")
        mx = te.compute((shape[0],), lambda i, x=x, kk=kk: te.max(x[i, kk], axis=kk), name="mx")
        outs.append(mx)
        fn = polyfuse.compile([x], outs, check_cuda=False)
        binary = fn.check_cuda("sm_80")
        assert all(binary.resources[k.name].registers > 0 for k in fn.kernels)


# ---------------------------------------------- 6. many reduce axes (isl AST of implied bands)
# isl's scheduler may put a band that its outer band already determines below it (four reduce
# axes of extent 2: [8r0 + 4r1 + 2r2 + r3] above [r0, r1, r2]); isl's AST generator then ran
# half of the instances. cuda/codegen/astgen.py drops such members before AST generation.


def _run_ast(nodes, env: dict, out: list) -> None:
    """Interpret our kernel AST (C integer semantics), collecting statement instances."""
    from polyfuse.cuda.codegen.kernel_ast import KDef, KFor, KIf, KMark, KStmt

    for n in nodes:
        if isinstance(n, KFor):
            env[n.var] = _ev(n.init, env)
            while _ev(n.cond, env):
                _run_ast(n.body, env, out)
                env[n.var] += n.step
        elif isinstance(n, KIf):
            _run_ast(n.then if _ev(n.cond, env) else n.orelse, env, out)
        elif isinstance(n, KDef):
            env[n.var] = _ev(n.value, env)
            _run_ast(n.body, env, out)
        elif isinstance(n, KMark):
            _run_ast(n.body, env, out)
        elif isinstance(n, KStmt):
            out.append((n.stmt, tuple(_ev(a, env) for a in n.args)))


def _ev(e, env: dict) -> int:
    from polyfuse.cuda.codegen.kernel_ast import KInt, KVar

    if isinstance(e, KInt):
        return e.value
    if isinstance(e, KVar):
        return env[e.name]
    a = [_ev(x, env) for x in e.args]

    def cdiv(p: int, q: int) -> int:
        r = abs(p) // abs(q)
        return r if (p >= 0) == (q > 0) else -r

    ops = {
        "+": lambda: a[0] + a[1],
        "-": lambda: a[0] - a[1],
        "*": lambda: a[0] * a[1],
        "/": lambda: cdiv(a[0], a[1]),
        "%": lambda: a[0] - cdiv(a[0], a[1]) * a[1],
        "fdiv": lambda: a[0] // a[1],
        "neg": lambda: -a[0],
        "min": lambda: min(a),
        "max": lambda: max(a),
        "?:": lambda: a[1] if a[0] else a[2],
        "==": lambda: int(a[0] == a[1]),
        "<=": lambda: int(a[0] <= a[1]),
        "<": lambda: int(a[0] < a[1]),
        ">=": lambda: int(a[0] >= a[1]),
        ">": lambda: int(a[0] > a[1]),
        "&&": lambda: int(bool(a[0] and a[1])),
        "||": lambda: int(bool(a[0] or a[1])),
    }
    return ops[e.op]()


def _implied_band_cases():
    for ext in ((2, 2), (2, 2, 2), (2, 2, 2, 2), (2, 3, 2, 3), (3, 3, 3, 3), (2, 2, 2, 2, 2)):
        n = len(ext)
        for outer in (n, n - 1):  # the outer band linearises the first `outer` dimensions
            for k in (1, 2, 3):
                for sel in itertools.combinations(range(n), k):
                    yield ext, outer, sel


def _implied_band_schedule(ctx, ext, outer, sel):
    import islpy as isl

    vs = [f"r{i}" for i in range(len(ext))]
    cons = " and ".join(f"0 <= {v} < {e}" for v, e in zip(vs, ext, strict=True))
    terms, stride = [], 1
    for v, e in reversed(list(zip(vs[:outer], ext[:outer], strict=True))):
        terms.append(f"{stride}{v}")
        stride *= e
    S = f"S[{', '.join(vs)}]"
    inner = ", ".join(f"{{ {S} -> [({vs[i]})] }}" for i in sel)
    text = (
        f'{{ domain: "{{ {S} : {cons} }}", child: {{ schedule: "[{{ {S} -> '
        f'[({" + ".join(terms)})] }}]", child: {{ schedule: "[{inner}]" }} }} }}'
    )
    return isl.Schedule.read_from_str(ctx, text)


@pytest.mark.slow  # 11 s
def test_ast_runs_every_instance_once_when_inner_bands_are_implied():
    import islpy as isl

    from polyfuse.cuda.codegen.astgen import convert_node, drop_implied_members

    ctx = isl.Context()
    build = isl.AstBuild.from_context(isl.Set("{ : }", context=ctx))
    bad = []
    for ext, outer, sel in _implied_band_cases():
        sched = _implied_band_schedule(ctx, ext, outer, sel)
        trimmed = drop_implied_members(sched)
        dom = sched.get_domain()
        before, after = (s.get_map().intersect_domain(dom) for s in (sched, trimmed))
        assert after.lex_lt_union_map(after).is_equal(before.lex_lt_union_map(before))
        ran: list = []
        _run_ast(convert_node(build.node_from_schedule(trimmed)), {}, ran)
        want = sorted(itertools.product(*(range(e) for e in ext)))
        if sorted(args for _, args in ran) != want:
            bad.append((ext, outer, sel))
    assert not bad, f"AST misses or repeats instances for {bad}"


def _window_sum(ks: tuple[int, ...], spatial: tuple[int, ...], unused: bool, op: str):
    """y[u?, i1..] = op over r of x[r0, i1 + r1, ...] (len(ks) reduce axes)."""
    assert len(spatial) == len(ks) - 1
    extents = tuple(s + k - 1 for s, k in zip(spatial, ks[1:], strict=True))
    x = te.placeholder((ks[0],) + extents, name="x")
    rs = [te.reduce_axis(k, name=f"r{i}") for i, k in enumerate(ks)]
    red = te.sum if op == "sum" else te.max
    shape = ((2,) if unused else ()) + (spatial or (1,))

    def body(*idx):
        idx = idx[1:] if unused else idx
        sub = [rs[0]] + [i + r for i, r in zip(idx, rs[1:], strict=True)] if spatial else [rs[0]]
        return red(x[tuple(sub)], axis=rs)

    return x, te.compute(shape, body, name="y")


WINDOWS = [
    # (reduce extents, spatial output sizes, unused output dim, reduction)
    ((2,), (), True, "sum"),
    ((2, 2), (2,), True, "sum"),
    ((2, 2, 2), (2, 1), True, "sum"),
    ((2, 2, 2, 2), (2, 1, 2), True, "sum"),  # the ONNX 3-D conv case
    ((2, 2, 2, 2), (2, 1, 2), False, "sum"),
    ((2, 2, 2, 2, 2), (2, 1, 2, 1), True, "sum"),
    ((3, 3, 3, 3), (2, 2, 1), True, "sum"),
    ((5, 2, 3, 2), (1, 3, 2), True, "sum"),
    ((1, 2, 1, 2), (2, 2, 2), True, "sum"),
    ((2, 2, 2, 2), (2, 1, 2), True, "max"),
    ((2, 3, 2), (3, 1), False, "max"),
]


@pytest.mark.parametrize("ks,spatial,unused,op", WINDOWS)
def test_many_reduce_axes(ks, spatial, unused, op):
    x, y = _window_sum(ks, spatial, unused, op)
    fn = polyfuse.compile([x], [y], check_cuda=False)
    xv = _rand(*x.shape, seed=len(ks))
    want = reference.evaluate([y], {x: xv})[0]
    for race_check in RACE_MODES:
        np.testing.assert_allclose(fn(xv, race_check=race_check), want, rtol=1e-5, atol=1e-5)


def test_many_reduce_axes_race_shadow():
    x, y = _window_sum((2, 2, 2, 2), (2, 1, 2), True, "sum")
    fn = polyfuse.compile([x], [y], check_cuda=False)
    xv = _rand(*x.shape)
    got = fn(xv, race_check="shadow")
    np.testing.assert_allclose(got, reference.evaluate([y], {x: xv})[0], rtol=1e-5, atol=1e-5)


def _conv3d_numpy(x: np.ndarray, w: np.ndarray, stride: int, pad: int) -> np.ndarray:
    n, c, *sp = x.shape
    o, _, *k = w.shape
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pad, pad)] * 3)
    out = [(s + 2 * pad - kk) // stride + 1 for s, kk in zip(sp, k, strict=True)]
    y = np.zeros((n, o, *out), np.float64)
    for d, h, q in itertools.product(*(range(e) for e in out)):
        win = xp[:, :, d * stride : d * stride + k[0], h * stride : h * stride + k[1]]
        win = win[..., q * stride : q * stride + k[2]]
        y[:, :, d, h, q] = np.einsum("ncdhw,ocdhw->no", win, w)
    return y


@pytest.mark.parametrize(
    "xs,ws,stride,pad,gemm",
    [
        ((1, 2, 3, 2, 3), (1, 2, 2, 2, 2), 1, 0, True),  # the ONNX conformance case
        ((2, 3, 4, 3, 4), (2, 3, 2, 2, 3), 1, 1, True),
        ((1, 2, 5, 4, 5), (3, 2, 3, 2, 3), 2, 1, True),
        ((1, 8, 6, 6, 6), (32, 8, 3, 3, 3), 1, 1, True),  # large enough for the GEMM path
        ((1, 8, 6, 6, 6), (32, 8, 3, 3, 3), 1, 1, False),
        ((2, 4, 6, 5, 6), (64, 4, 2, 2, 2), 1, 0, True),
    ],
)
def test_conv3d_matches_numpy(xs, ws, stride, pad, gemm):
    from polyfuse import ops
    from polyfuse.poly.mapping import MappingConfig

    x = te.placeholder(xs, name="x")
    w = te.placeholder(ws, name="w")
    y = ops.conv(x, w, stride=stride, pads=pad)
    fn = polyfuse.compile([x, w], [y], check_cuda=False, mapping=MappingConfig(gemm=gemm))
    xv, wv = _rand(*xs, seed=1), _rand(*ws, seed=2)
    want = _conv3d_numpy(xv.astype(np.float64), wv.astype(np.float64), stride, pad)
    np.testing.assert_allclose(fn(xv, wv), want, rtol=1e-4, atol=1e-4)


def test_ast_guard_names_its_own_parameter_when_the_context_orders_them_differently():
    """isl's AST build printed a guard on the parameter ``p`` as one on ``t`` (the parameter
    at its position in the context) when the context ordered the parameters otherwise."""
    import islpy as isl

    from polyfuse.cuda.codegen.astgen import aligned_build

    ctx = isl.Context()
    context = isl.Set("[b, t, p] -> { : 0 <= b < 4 and 0 <= t < 8 and 0 <= p < 128 }", context=ctx)
    smap = isl.UnionMap(
        "[b, p, t] -> { C[e] -> [q] : e = 256b + p + 128q and 0 <= q <= 1 "
        "and 16 * floor((e - 5) / 16) <= e - 16 }",
        context=ctx,
    ).align_params(context.get_space())
    text = aligned_build(context, smap.get_space()).node_from_schedule_map(smap).to_C_str()
    assert "(p + 11) % 16" in text and "t" not in text.replace("int", ""), text


def test_strided_conv_copies_every_element_of_its_input_tile():
    """A 1-D conv of stride 16 (the fuzzer's seed 5103): the copy of its strided input tile
    was guarded on a compute thread's index instead of the copying thread's, so a quarter of
    the outputs read zeros."""
    from polyfuse import ops
    from polyfuse.poly.mapping import MappingConfig

    x = te.placeholder((1, 1, 800), name="x")
    w = te.placeholder((8, 1, 5), name="w")
    b = te.placeholder((8,), name="b")
    y = ops.avg_pool2d(ops.conv(x, w, b, stride=16, name="c"), kernel=(1, 2), name="y")
    rng = np.random.default_rng(5103)
    feeds = [
        rng.uniform(0.5, 2.5, (1, 1, 800)).astype(np.float32),
        rng.standard_normal((8, 1, 5)).astype(np.float32),
        rng.standard_normal(8).astype(np.float32),
    ]
    want = reference.evaluate([y], dict(zip([x, w, b], feeds, strict=True)))[0]
    for mapping in (None, MappingConfig(gemm_tile=(16, 16, 1, 2, 5))):
        fn = polyfuse.compile([x, w, b], [y], check_cuda=False, mapping=mapping)
        got = fn(*feeds, device="emulate")
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_padded_k_tiles_never_read_inside_a_folded_operand():
    """Batched heads read through folded layouts (``q[b, s, 12h + k]``, k < 12): a k-tile of 8
    pads the reduction to 16 steps, and the padded steps read the next head's elements,
    which are inside the array (the shared tile holds zeros only outside it). Such k-tiles
    are refused; the sum is the reference's."""
    from polyfuse import ops

    bs, s, nh, d = 2, 20, 3, 12
    x = te.placeholder((bs, s, nh * d), name="x")
    w = te.placeholder((nh * d, nh * d), name="w")
    q = ops.matmul(x, w, name="q")
    qh = ops.transpose(ops.reshape(q, (bs, s, nh, d)), (0, 2, 1, 3), name="qh")
    xt = ops.transpose(ops.reshape(x, (bs, s, nh, d)), (0, 2, 3, 1), name="xt")
    att = ops.matmul(qh, xt, name="att")
    rng = np.random.default_rng(12)
    feeds = [rng.standard_normal((bs, s, nh * d)), rng.standard_normal((nh * d, nh * d))]
    feeds = [a.astype(np.float32) for a in feeds]
    fn = polyfuse.compile([x, w], [att], check_cuda=False)
    assert not [k for k in fn.kernels if "transpose" in k.name or "reshape" in k.name]
    want = reference.evaluate([att], dict(zip([x, w], feeds, strict=True)))[0]
    np.testing.assert_allclose(fn(*feeds, device="emulate"), want, rtol=1e-4, atol=1e-3)
