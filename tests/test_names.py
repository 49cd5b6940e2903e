"""Adversarial tensor names on every kind of kernel (issue 19, item 1).

A tensor's name must never meet an identifier the generated code declares: the float4 lanes
``v_x`` and quads ``q_x0``, registers ``r_x``, shared tiles ``s_x``, loop and thread variables,
C/CUDA words and the headers' names. Every kind of kernel — elementwise, float4 elementwise,
a row reduction, a Layer 2 stitched softmax, a GEMM with a bias epilogue and a Layer 3 pack —
runs on the emulator against :func:`polyfuse.reference.evaluate` with adversarial names:
compiled fresh, served by a warm compile cache that a graph of the same structure under other
names filled, and as the second of two identical blocks (served within the compile and sharing
its ``__global__`` function). NVRTC compiles the adversarial sources where it is installed.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pytest

import polyfuse
from polyfuse import reference, te
from polyfuse.cache import CompileCache
from polyfuse.cuda.codegen.namer import Namer, c_name, canonical_names, fill, is_free, slots
from polyfuse.cuda.toolchain.compiler import available_compilers

# ---------------------------------------------------------------------------------- the graphs
# A builder takes the names of its tensors — inputs, then outputs, then intermediates — and
# returns (inputs, outputs).


def elementwise(n: list[str]):
    x = te.placeholder((5, 7), name=n[0])
    b = te.placeholder((7,), name=n[1])
    t = te.compute((5, 7), lambda i, j: x[i, j] * 2.0 + b[j], name=n[3])
    y = te.compute((5, 7), lambda i, j: te.exp(t[i, j]) - x[i, j], name=n[2])
    return [x, b], [y]


def float4(n: list[str]):
    """Enough elements that each thread takes a group of 4 (coarsened); ``x`` is read at two
    rows (a layout op with its elementwise epilogue), so a group loads it as two streams."""
    x = te.placeholder((512, 1024), name=n[0])
    b = te.placeholder((512, 1024), name=n[1])
    t = te.compute((512, 1024), lambda i, j: x[511 - i, j] * 2.0, name=n[3])
    y = te.compute((512, 1024), lambda i, j: t[i, j] + x[i, j] * b[i, j], name=n[2])
    return [x, b], [y]


def reduction(n: list[str]):
    x = te.placeholder((64, 384), name=n[0])
    b = te.placeholder((64, 384), name=n[1])
    t = te.compute((64, 384), lambda i, j: x[i, j] * b[i, j], name=n[3])
    k = te.reduce_axis(384, name="k")
    y = te.compute((64,), lambda i: te.sum(t[i, k], axis=k), name=n[2])
    return [x, b], [y]


def layer2(n: list[str]):
    """The issue's reproduction (row max, then exp of the difference) normalised: a softmax
    stitched into one kernel, the exponentials in a shared tile."""
    x = te.placeholder((64, 384), name=n[0])
    k = te.reduce_axis(384, name="k")
    m = te.compute((64,), lambda i: te.max(x[i, k], axis=k), name=n[2])
    e = te.compute((64, 384), lambda i, j: te.exp(x[i, j] - m[i]), name=n[3])
    k2 = te.reduce_axis(384, name="k2")
    s = te.compute((64,), lambda i: te.sum(e[i, k2], axis=k2), name=n[4])
    y = te.compute((64, 384), lambda i, j: e[i, j] / s[i], name=n[1])
    return [x], [y]


def gemm(n: list[str]):
    a = te.placeholder((33, 40), name=n[0])
    w = te.placeholder((40, 64), name=n[1])
    bias = te.placeholder((64,), name=n[2])
    k = te.reduce_axis(40, name="k")
    mm = te.compute((33, 64), lambda i, j: te.sum(a[i, k] * w[k, j], axis=k), name=n[4])
    y = te.compute((33, 64), lambda i, j: mm[i, j] + bias[j], name=n[3])
    return [a, w, bias], [y]


def gemm_factor(n: list[str]):
    """A GEMM with a k-invariant factor ``s[i]``: its fragment is loaded from global memory
    once per thread (a register fragment read straight from the parameter)."""
    a = te.placeholder((33, 40), name=n[0])
    w = te.placeholder((40, 64), name=n[1])
    s = te.placeholder((33,), name=n[2])
    k = te.reduce_axis(40, name="k")
    y = te.compute((33, 64), lambda i, j: te.sum(a[i, k] * w[k, j] * s[i], axis=k), name=n[3])
    return [a, w, s], [y]


def pack(n: list[str], inputs: list | None = None):
    """Two independent branches: Layer 3 packs the first's kernel with the second's row sum.
    Each branch starts with a layout read (reversed), which nothing fuses with what comes
    before it, so ``inputs`` chains a second such block after a first as kernels of their own."""
    x1, x2 = inputs or (te.placeholder((4096,), name=n[0]), te.placeholder((64, 1024), name=n[1]))
    a = te.compute((4096,), lambda i: te.maximum(x1[4095 - i] * 2.0 + 1.0, 0.0), name=n[2])
    k = te.reduce_axis(1024, name="k")
    s = te.compute((64,), lambda i: te.sum(x2[i, k] * x2[i, k], axis=k), name=n[4])
    b = te.compute((64, 1024), lambda i, j: x2[63 - i, j] / (s[63 - i] + 1.0), name=n[3])
    return ([] if inputs else [x1, x2]), [a, b]


Builder = Callable[..., tuple[list, list]]
Shows = Callable[[polyfuse.CompiledGraph], bool]
#: builder, how many names it takes, what its source shows (the kind of kernel it is)
KINDS: dict[str, tuple[Builder, int, Shows]] = {
    "elementwise": (elementwise, 4, lambda fn: "const float4" not in fn.cuda_source),
    "float4": (float4, 4, lambda fn: fn.cuda_source.count("<const float4*>") == 3),
    "reduction": (reduction, 4, lambda fn: "pf_allreduce" in fn.cuda_source),
    "layer2": (layer2, 5, lambda fn: len(fn.kernels) == 1 and "__shared__" in fn.cuda_source),
    "gemm": (gemm, 5, lambda fn: "_frag[" in fn.cuda_source and "kt0" in fn.cuda_source),
    "pack": (pack, 5, lambda fn: "_p1(" in fn.cuda_source),
    "gemm_factor": (gemm_factor, 4, lambda fn: "_frag[" in fn.cuda_source),
}

PLAIN = ["x", "b", "y", "t", "z"]  # names that meet nothing (but the first's float4 lanes v_x)
#: Adversarial name sets, cycled over a graph's tensors (inputs first, then outputs).
NAMES = {
    # the generated prefixes: float4 lanes and quads, registers, shared tiles, escapes,
    # accumulators, fragments, kernels
    "generated": ["x", "v_x", "q_x0", "s_x", "r_x", "x_acc", "r_x_frag", "u_x", "k0_v_x"],
    "keywords": ["double", "while", "int", "float", "return", "bool"],
    "builtins": ["expf", "make_float4", "INFINITY", "float4", "threadIdx", "blockIdx", "min"],
    # loop, thread and GEMM tiling variables, helpers
    "variables": ["c0", "kt0", "pos", "iv", "sub", "p0r", "pf_scratch", "_b"],
    "duplicates": ["x", "x", "x", "x_1", "x", "x"],
    # sanitised to C identifiers, they meet generated names and each other (x y, x-y: x_y)
    "odd": ["x", "v.x", "1x", "a-b", "x y", "ä", "x-y"],
}


#: the name sets every fast run checks (generated-name collisions and duplicates, the likeliest
#: to meet); the others run in the slow tier
FAST_NAMES = ("duplicates", "generated")
WHICH = [w if w in FAST_NAMES else pytest.param(w, marks=pytest.mark.slow) for w in sorted(NAMES)]


def _names(kind: str, which: str) -> list[str]:
    n = KINDS[kind][1]
    pool = NAMES[which] if which != "plain" else PLAIN
    return [pool[i % len(pool)] for i in range(n)]


def _arrays(inputs, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(t.shape).astype(np.float32) for t in inputs]


def _check(fn: polyfuse.CompiledGraph, inputs, outputs, what: str) -> None:
    """``fn`` agrees with the reference evaluator on the emulator (no NaN appears), and NVRTC
    compiles its source where it is installed."""
    arrays = _arrays(inputs)
    got = fn(*arrays, device="emulate")
    got = got if isinstance(got, tuple) else (got,)
    want = reference.evaluate(outputs, dict(zip(inputs, arrays, strict=True)))
    for g, w in zip(got, want, strict=True):
        assert not np.isnan(g).any(), f"{what}: NaN in the result"
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-4, err_msg=what)
    if "nvrtc" in available_compilers():
        fn.check_cuda("sm_80")


# ---------------------------------------------------------------------------------- the tests
# One test per name set and way of compiling; each runs every kind of kernel.


@pytest.mark.parametrize("which", WHICH)
def test_adversarial_names_fresh(which):
    for kind, (build, _, shows) in KINDS.items():
        inputs, outputs = build(_names(kind, which))
        fn = polyfuse.compile(inputs, outputs, check_cuda=False, cache=CompileCache())
        assert shows(fn), f"{kind}: not the kind of kernel the test is about\n{fn.cuda_source}"
        _check(fn, inputs, outputs, f"{kind}/{which} fresh")


@pytest.mark.slow  # 6-9 s per name set; the fresh compiles of the fast names stay fast
@pytest.mark.parametrize("which", WHICH)
def test_adversarial_names_through_a_warm_cache(which, tmp_path):
    """The issue's second case: a graph of the same structure under plain names fills the
    on-disk cache, the adversarial graph is served its kernels (and the reverse order)."""
    for kind, (build, _, _) in KINDS.items():
        for first, second in (("plain", which), (which, "plain")):
            d = tmp_path / f"{kind}-{first}-{second}"
            polyfuse.compile(*build(_names(kind, first)), check_cuda=False, cache=CompileCache(d))
            inputs, outputs = build(_names(kind, second))
            fn = polyfuse.compile(inputs, outputs, check_cuda=False, cache=CompileCache(d))
            assert fn.cache_stats["misses"] == 0 and fn.cache_stats["hits"] > 0
            _check(fn, inputs, outputs, f"{kind}: {second} after {first} (cached)")


def _two_blocks(kind: str, first: str, second: str):
    """Two identical blocks side by side (the second's kernels are served from the first's
    within the compile and share its ``__global__`` functions)."""
    build = KINDS[kind][0]
    i1, o1 = build(_names(kind, first))
    if kind == "pack":  # chained, so that each pack holds one block's branches
        i2, o2 = pack(_names(kind, second), o1)
    else:
        i2, o2 = build(_names(kind, second))
    return i1 + i2, o1 + o2


@pytest.mark.parametrize(
    "which",
    # deduplication under duplicate names takes 12 s: the slow tier runs it (the fresh-names
    # tests above check those names in the fast tier)
    [w if w == "generated" else pytest.param(w, marks=pytest.mark.slow) for w in sorted(NAMES)],
)
def test_adversarial_names_deduplicated(which):
    """The issue's third case (the first block plain, the second's names adversarial), and
    both blocks under the same adversarial names."""
    for kind in KINDS:
        for first in ("plain", which):
            inputs, outputs = _two_blocks(kind, first, which)
            fn = polyfuse.compile(inputs, outputs, check_cuda=False, pack=kind == "pack")
            assert len({k.function for k in fn.kernels}) < len(fn.kernels), f"{kind}: no sharing"
            _check(fn, inputs, outputs, f"{kind}: {which} beside {first} (deduplicated)")


# --------------------------------------------------------------------------------- the namer


def test_c_names_escape_what_generated_code_declares():
    for free in ("x", "y", "row_max", "x1", "x_1", "v2_0", "Q", "QK", "W1", "layer0_q_w"):
        assert c_name(free) == free
    for taken in ("v_x", "q_x0", "s_x", "r_x", "u_x", "double", "while", "float4", "expf"):
        assert c_name(taken) == f"u_{taken}_u"
    for taken in ("make_float4", "INFINITY", "NAN", "threadIdx", "c0", "kt0", "p0r", "pos"):
        assert not is_free(taken)
    for taken in ("pf_scratch", "_b", "k0_x", "pk1_k0_x", "x_acc", "x_lo0", "x_frag", "x_v"):
        assert not is_free(taken)
    with pytest.raises(ValueError, match="not a C identifier"):
        c_name("x.y")


def test_derived_names_never_meet():
    """Every derived name of a set of tensors is distinct from the others and from the
    tensors' own C names (the escape keeps the spaces apart)."""
    idents = ["x", "v_x", "q_x0", "x0", "x_1", "s_x", "r_x", "u_x", "int", "x_v", "x_frag"]
    namer = Namer()
    names: list[str] = []
    for t in idents:
        for key in (t, f"{t}_acc"):
            names += [namer.tensor(key), namer.register(key), namer.shared(key)]
            names += [namer.fragment(key), namer.staged(key)]
            names += [namer.lower_bound(namer.shared(key), d) for d in range(2)]
            names += [namer.vector(key, k) for k in range(3)]
            names += [namer.quad(key, k, j) for k in range(3) for j in range(3)]
    assert len(names) == len(set(names))
    assert all(re.fullmatch(r"[A-Za-z_]\w*", n) for n in names)


def test_canonical_text_instantiates_under_any_names():
    canon = canonical_names(["x", "v_x", "y"])
    printer = Namer(slots(canon))
    text = " ".join(
        [printer.tensor("x"), printer.vector("x", 1), printer.quad("v_x", 0, 3)]
        + [printer.quad("y", 2, 1), printer.register("y_acc"), "blockIdx.x"]
    )
    assert "v_x" not in text  # no user name in canonical text
    real = {c: c_name(t) for t, c in canon.items()}
    want = "x v_1_x q_u_v_x_u3 q_2_y1 r_y_acc blockIdx.x"
    assert fill(text, real) == want
    with pytest.raises(KeyError, match="no canonical name"):
        printer.tensor("z")
    # one pass: a real name that looks canonical is not renamed again
    canon = canonical_names(["a_pfT1", "y"])
    text = " ".join([Namer(slots(canon)).register("a_pfT1"), Namer(slots(canon)).quad("y", 0, 1)])
    assert fill(text, {c: c_name(t) for t, c in canon.items()}) == "r_a_pfT1 q_y1"


def test_kernels_declare_variables_only_in_the_generated_space():
    """A loop variable outside the generated space (a name a tensor could take) is an internal
    error at printing; the GEMM tiling's padding iterators (``x0``…) are moved into it."""
    from polyfuse.cuda.codegen.declared import check_declared, declared_variables
    from polyfuse.cuda.codegen.kernel_ast import KernelIR, KFor, KInt, KOp, KVar
    from polyfuse.cuda.codegen.namer import loop_variable

    def loop(var: str) -> KFor:
        return KFor(var, KInt(0), KOp("<", (KVar(var), KInt(4))), 1, [])

    ok = KernelIR("k", (("b0", 2),), (("t0", 32),), (loop("c0"), loop("kt0")), ("mg",))
    assert declared_variables(ok) == {"b0", "t0", "c0", "kt0"}
    check_declared(ok)
    with pytest.raises(AssertionError, match=r"variables \['x0'\] are outside"):
        check_declared(ok.with_(body=(loop("x0"),)))
    assert [loop_variable(v) for v in ("kt0", "ii1", "pos", "x0")] == ["kt0", "ii1", "pos", "pf_x0"]


def test_k_invariant_factor_with_an_escaped_name_reads_its_parameter():
    """ONNX names such as ``_Unsqueeze_1`` are escaped (``u__Unsqueeze_1_u``); the register
    fragment of a k-invariant factor read the raw name, which no parameter has."""
    inputs, outputs = gemm_factor(["a", "w", "_Unsqueeze_1", "y"])
    fn = polyfuse.compile(inputs, outputs)
    arrays = [np.random.default_rng(3).standard_normal(t.shape).astype(np.float32) for t in inputs]
    (want,) = reference.evaluate(outputs, dict(zip(inputs, arrays, strict=True)))
    np.testing.assert_allclose(fn(*arrays, device="emulate"), want, rtol=1e-4, atol=1e-4)
