"""The fuzzer's dtypes (issue 22 item 5): ``polyfuse fuzz --dtypes``, and regressions of the
bugs it found."""

from __future__ import annotations

import runpy
import time
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest

from polyfuse import te
from polyfuse.cli import main
from polyfuse.errors import DtypeError
from polyfuse.reference import evaluate
from polyfuse.testing.build import build, input_values
from polyfuse.testing.dtypes import (
    FLOATS,
    parse_dtypes,
    perturbation,
    precision,
    refusal,
    with_dtypes,
)
from polyfuse.testing.generate import ONE, GraphSpec, Node, draw, generate
from polyfuse.testing.run import check_spec, compare, fuzz, reference_values
from polyfuse.testing.script import to_script
from polyfuse.testing.shrink import shrink

ALL = parse_dtypes("all")
#: The fast tier's dtype fuzz run: graphs, first seed, graphs per emulator build.
FAST_N, FAST_SEED, FAST_BATCH = 24, 710_000, 12

# --------------------------------------------------------------------------- drawing


def test_parse_dtypes():
    assert set(ALL) == {"float16", "bfloat16", "float32", "float64", "int32", "int64", "bool"} | {
        "uint8", "int8", "int16"
    }
    assert parse_dtypes("bfloat16, float16") == ("bfloat16", "float16")
    with pytest.raises(ValueError, match="unknown dtypes"):
        parse_dtypes("float8")


def test_dtypes_change_only_dtypes_and_cover_mixed_precision():
    specs = [(generate(s), with_dtypes(generate(s), ALL)) for s in range(300)]
    for plain, typed in specs:  # the structure is the seed's; only dtypes and casts change
        assert [(n.name, n.kind, n.op, n.args) for n in plain.nodes] == [
            (n.name, n.kind, n.op, n.args) for n in typed.nodes
        ]
    nodes = [(sp, n) for _, sp in specs for n in sp.nodes]
    assert {n.dtype for _, n in nodes} == set(ALL)
    assert {c for _, n in nodes for c in n.casts} >= {"", *FLOATS, "int32", "bool", "float64"}
    assert {sp.meta["dtypes"] for _, sp in specs} == {"uniform", "mixed"}
    # a reduction of a 16-bit input stored as float32 (accumulating in float32)
    assert any(
        n.kind == "reduce" and n.dtype == "float32" and sp.node(n.args[0]).dtype in FLOATS[:2]
        for sp, n in nodes
    )
    # float16 holds nothing it would overflow: every float16 tensor's values stay finite
    for _, sp in specs[:60]:
        if refusal(sp) or sp.meta.get("expect_error"):
            continue
        for name, v in reference_values(sp).items():
            if sp.node(name).dtype == "float16" and sp.node(name).kind != "input":
                w = reference_values(sp.copy(nodes=[replace_dtype(n) for n in sp.nodes]))[name]
                assert np.array_equal(np.isinf(v), np.isinf(w)), (name, str(sp))


def replace_dtype(n: Node) -> Node:
    from dataclasses import replace

    return replace(n, dtype="float32" if n.dtype == "float16" else n.dtype)


def test_wide_dtypes_only_when_named_and_nothing_refused():
    """float64, the integers and bool storage is drawn with ``all`` (kernels store every
    dtype now: no drawn graph must be refused)."""
    halves = ("float16", "bfloat16", "float32")
    wide = ("float64", "uint8", "int8", "int16", "int32", "int64", "bool")
    assert not any(n.dtype in wide for s in range(100) for n in with_dtypes(draw(s), halves).nodes)
    assert not any(
        n.dtype != "float32" for s in range(50) for n in with_dtypes(draw(s), None).nodes
    )
    specs = [with_dtypes(draw(s), ALL) for s in range(300)]
    assert not any(refusal(sp) for sp in specs)
    for d in wide:
        storing = sum(any(n.dtype == d for n in sp.nodes) for sp in specs)
        assert 4 <= storing < 150, (d, storing)


def test_perturbation_per_input_follows_the_coarsest_dtype_downstream():
    d = {"a": 5}
    nodes = [
        Node("x", "input", ("a",), fill="normal", seed=1),
        Node("y", "input", ("a",), fill="normal", seed=2),
        Node("u", "unary", ("a",), ("x",), "tanh", dtype="bfloat16"),
        Node("v", "unary", ("a",), ("y",), "abs", casts=("float16",)),
    ]
    spec = GraphSpec(d, nodes, ["u", "v"], seed=1)
    assert perturbation(spec) == {"x": 2.0**-8, "y": 2.0**-11}


# --------------------------------------------------------------------------- comparing


def test_compare_uses_the_output_dtype_tolerance():
    w = np.array([1.0, 2.0, np.nan, np.inf], ml_dtypes.bfloat16)
    off = np.array([1.015625, 2.0, np.nan, np.inf], ml_dtypes.bfloat16)  # 1.6 % off
    assert compare("y", off, w, dtype="bfloat16") == ""
    assert "differ" in compare("y", off.astype(np.float32), w.astype(np.float32))
    assert "NaN positions" in compare(
        "y", np.array([1, 2, 3, np.inf], ml_dtypes.bfloat16), w, dtype="bfloat16"
    )
    assert "infinities" in compare(
        "y", np.array([1, 2, np.nan, 3e38], ml_dtypes.bfloat16), w, dtype="bfloat16"
    )
    assert "float32 array, reference bfloat16" in compare("y", w.astype(np.float32), w)
    h = np.array([100.0], np.float16)
    assert compare("y", np.array([100.3], np.float16), h, dtype="float16") == ""
    assert "differ" in compare("y", np.array([101.0], np.float16), h, dtype="float16")


def test_compare_allows_the_gap_to_the_float64_oracle():
    """fuzz seed 710032: ``int(max(abs(erf(b))))`` with ``erf`` stored as bfloat16 is 1 in the
    reference (0.998 rounds to 1.0) and 0 in a kernel that keeps erf in a float32 register, as
    in the float64 oracle: not a bug; the gap to the oracle is the slack."""
    want = np.array([1.0 + 0.5, 2.0], np.float32)  # the reference: int(1.0) + b
    got = np.array([0.0 + 0.5, 2.0], np.float32)  # the kernel: int(0.998) + b
    oracle = np.array([0.5, 2.0])
    assert "differ" in compare("y", got, want, dtype="bfloat16")
    assert compare("y", got, want, dtype="bfloat16", oracle=oracle) == ""
    assert "differ" in compare("y", got - 3.0, want, dtype="bfloat16", oracle=oracle)
    # a float16 tensor that overflows in the reference but not in the oracle: inf may differ
    w16 = np.array([np.inf, 1.0], np.float16)
    g16 = np.array([6.0e4, 1.0], np.float16)
    assert "infinities" in compare("y", g16, w16, dtype="float16")
    assert compare("y", g16, w16, dtype="float16", oracle=np.array([7.0e4, 1.0])) == ""


def test_a_float32_product_that_underflows_is_compared_with_the_operation_reference():
    """fuzz seed 740066: ``float64(u * 1.4e-45) / 1e-45`` of a float32 ``u``. The product is
    float32 (a weak Python float), so the kernel — like numpy — rounds it to the subnormal
    1.4e-45 before the float64 division: 1.401. The storage reference keeps the compute body
    in float64 (0.949). ``precision="operation"`` rounds every float32 operation as the kernel
    does; its gap to the storage reference is the slack (the mismatch was reported before)."""
    import polyfuse

    u = te.placeholder((1, 1), "float32", name="u")
    e5 = te.compute((1, 1), lambda i, j: u[i, j] * 1.4e-45, name="e5", dtype="float64")
    e6 = te.compute((1, 1), lambda i, j: e5[i, j] / 1e-45, name="e6", dtype="float32")
    x = np.array([[0.6770800352096558]], np.float32)
    got = polyfuse.compile([u], [e6], check_cuda=False)(x, device="emulate")
    (want,) = evaluate([e6], {u: x})
    (oracle,) = evaluate([e6], {u: x}, precision="float64")
    (rounded,) = evaluate([e6], {u: x}, precision="operation")
    numpy_way = ((x * np.float32(1.4e-45)).astype(np.float64) / 1e-45).astype(np.float32)
    np.testing.assert_array_equal(rounded, numpy_way)
    np.testing.assert_array_equal(got, rounded)
    assert abs(float(want[0, 0]) - 0.9488) < 1e-3 and abs(float(got[0, 0]) - 1.4013) < 1e-3
    assert "differ" in compare("e6", got, want, oracle=oracle)
    assert compare("e6", got, want, oracle=[oracle, rounded]) == ""
    assert "differ" in compare("e6", got * 2, want, oracle=[oracle, rounded])


def test_fuzz_seed_740066_passes():
    assert check_spec(with_dtypes(draw(740066), ALL)).status == "pass"


def _stored_spec(dtype: str) -> GraphSpec:
    nodes = [
        Node("x", "input", ("a",), fill="normal", seed=1, dtype="float16"),
        Node("y", "unary", ("a",), ("x",), "abs", dtype=dtype),
    ]
    return GraphSpec({"a": 7}, nodes, ["y"], seed=3)


@pytest.mark.parametrize("dtype", ["float64", "int32", "int64", "bool"])
def test_a_wide_dtype_compiles_and_passes(dtype):
    """Stored in float64, int32, int64 or bool (refused before the wide dtypes)."""
    out = check_spec(_stored_spec(dtype))
    assert out.status == "pass" and not out.failed, out.detail


def test_a_refused_dtype_that_compiles_is_a_failure(monkeypatch):
    from polyfuse.testing import run

    monkeypatch.setattr(run, "refusal", lambda spec: "'y' is float64 (planted)")
    out = check_spec(_stored_spec("float32"))
    assert out.status == "silent" and out.failed


# --------------------------------------------------------------------------- script, shrink


def _mixed_spec() -> GraphSpec:
    """bfloat16 and float16 storage, a float32 reduction of a 16-bit input, casts inside."""
    d = {"a": 9, "b": 33}
    nodes = [
        Node("x", "input", ("a", "b"), fill="special", seed=11, dtype="bfloat16"),
        Node("w", "input", ("b",), fill="positive", seed=12, dtype="float16"),
        Node("e", "binary", ("a", "b"), ("x", "w"), "mul", dtype="float16", casts=("", "bfloat16")),
        Node("s", "reduce", ("a", ONE), ("e",), "sum", axes=(1,), pre="tanh"),
        Node("t", "unary", ("a", "b"), ("e",), "tanh", dtype="bfloat16", casts=("int32",)),
        Node("y", "binary", ("a", "b"), ("t", "s"), "sub", dtype="bfloat16"),
    ]
    return GraphSpec(d, nodes, ["y", "s"], seed=21)


def test_script_keeps_dtypes():
    spec = _mixed_spec()
    text = to_script(spec)
    assert "import ml_dtypes" in text and "dtype=ml_dtypes.bfloat16" in text
    assert "te.cast(" in text and "'int32'" in text and "dtype='float16')" in text
    ns: dict = {}
    exec(text.split("fn = polyfuse.compile")[0], ns)  # noqa: S102
    inputs, outputs, feeds = ns["inputs"], ns["outputs"], ns["feeds"]
    assert [t.dtype for t in inputs] == ["bfloat16", "float16"]
    assert [t.dtype for t in outputs] == ["bfloat16", "float32"]
    assert feeds[0].dtype == ml_dtypes.bfloat16 and feeds[1].dtype == np.float16
    vals = input_values(spec)
    np.testing.assert_array_equal(feeds[0].astype(np.float32), vals["x"].astype(np.float32))
    got = evaluate(outputs, dict(zip(inputs, feeds, strict=True)))
    want = reference_values(spec)
    for t, g in zip(outputs, got, strict=True):
        assert g.dtype == want[t.name].dtype
        np.testing.assert_array_equal(g.astype(np.float32), want[t.name].astype(np.float32))


def test_mixed_spec_passes():
    assert check_spec(_mixed_spec()).status == "pass"


@pytest.mark.slow  # ~40 s: shrinks a planted bug through many compiles
def test_shrinker_keeps_the_dtype_a_planted_bug_needs(monkeypatch, tmp_path):
    from polyfuse.cuda.codegen import print_vectors as printer

    spec = _mixed_spec()
    # the planted bug: bfloat16 widened negated (loads and casts; float16 and float32 right)
    monkeypatch.setitem(printer.HALF_TO_FLOAT, "bfloat16", "-__bfloat162float")
    assert check_spec(spec).status == "mismatch"
    small = shrink(spec, max_checks=60)
    assert check_spec(small).status == "mismatch"
    # the bug needs a bfloat16 conversion: the shrinker keeps one (float32 everywhere passes)
    assert any(n.dtype == "bfloat16" or "bfloat16" in n.casts for n in small.nodes), str(small)
    assert len(small.nodes) <= 3, str(small)
    path = tmp_path / "repro.py"
    path.write_text(to_script(small), encoding="utf-8")
    with pytest.raises(SystemExit) as bad:
        runpy.run_path(str(path), run_name="__main__")
    assert bad.value.code == 1
    monkeypatch.setitem(printer.HALF_TO_FLOAT, "bfloat16", "__bfloat162float")
    with pytest.raises(SystemExit) as good:
        runpy.run_path(str(path), run_name="__main__")
    assert good.value.code == 0


# --------------------------------------------------------------------------- fuzzing


def test_fuzz_dtypes_fast_tier():
    """FAST_N graphs with every dtype, FAST_BATCH per emulator build, threads both orders."""
    t0 = time.perf_counter()
    rep = fuzz(FAST_N, FAST_SEED, batch=FAST_BATCH, dtypes=ALL)
    assert rep.graphs == FAST_N
    assert not rep.failures, "\n\n".join(
        f"{o.status}: {o.detail}\n{to_script(o.spec)}" for o in rep.failures[:3]
    )
    assert rep.counts["pass"] == FAST_N  # every dtype compiles: nothing is refused
    assert time.perf_counter() - t0 < 120


def test_cli_fuzz_dtypes(capsys):
    assert main(["fuzz", "--n", "3", "--seed", "7", "--dtypes", "bfloat16,float16"]) == 0
    assert "3 graphs" in capsys.readouterr().out
    assert main(["fuzz", "--n", "1", "--dtypes", "float8"]) == 2


def test_build_makes_inputs_of_each_dtype():
    spec = _stored_spec("float32")
    for dtype, kind in [("int32", "i"), ("bool", "b"), ("bfloat16", "V"), ("float16", "f")]:
        s = spec.copy(nodes=[replace_input(spec.nodes[0], dtype), spec.nodes[1]])
        v = input_values(s)["x"]
        assert v.dtype.kind == kind or (dtype == "bfloat16" and v.dtype == ml_dtypes.bfloat16)
        inputs, _, _ = build(s)
        assert inputs[0].dtype == dtype


def replace_input(n: Node, dtype: str) -> Node:
    from dataclasses import replace

    return replace(n, dtype=dtype, fill="special")


# --------------------------------------------------------------------------- bugs found


def test_int32_cast_of_nan_and_out_of_range_floats_is_cudas():
    """fuzz seed 700101: ``te.cast(x, "int32")`` of NaN printed as ``(int)x``, which the
    emulator's x86 makes INT_MIN (a GPU's cvt.rzi gives 0); casts now print
    ``__float2int_rz`` (toward zero, saturating, NaN to 0) and the emulator's intrinsics
    saturate like the GPU's."""
    from polyfuse import compile as pf_compile
    from polyfuse import te

    vals = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 2.7, -2.7, 2147483520.0], np.float32)
    x = te.placeholder((8,), name="x")
    y = te.compute((8,), lambda i: te.cast(x[i], "int32") * 0.5, name="y", dtype="float32")
    fn = pf_compile([x], [y], check_cuda=False)
    assert "__float2int_rz(" in fn.cuda_source
    (want,) = evaluate([y], {x: vals})
    lim = 2.0**31
    np.testing.assert_array_equal(
        want,
        np.array(
            [0, (lim - 1) / 2, -lim / 2, (lim - 1) / 2, -lim / 2, 1, -1, 2147483520 / 2],
            np.float32,
        ),
    )
    for order in (False, True):
        np.testing.assert_array_equal(fn(vals, device="emulate", race_check=order), want)


def test_where_of_a_float_read_and_an_int_branch_is_a_float():
    """fuzz seed 720357: ``te.where(c, x[i, j], te.cast(h[j], "int32"))`` printed as
    ``c ? x[..] : int``; the emulator's global reads are proxies, which made the select an
    int (the float branch truncated: 0.25 came back 0) where the GPU gives a float. The
    printer now converts a branch of another C type to the result's."""
    from polyfuse import compile as pf_compile
    from polyfuse import te

    x = te.placeholder((4, 3), "float32", name="x")
    h = te.placeholder((3,), "bfloat16", name="h")
    y = te.compute(
        (4, 3),
        lambda i, j: te.where(h[j] >= -3.0, x[i, j], te.cast(h[j], "int32")),
        name="y",
        dtype="bfloat16",
    )
    fn = pf_compile([x, h], [y], check_cuda=False)
    a = (np.random.default_rng(0).standard_normal((4, 3)) * 2).astype(np.float32)
    b = np.array([0.5, -4.5, 1.5], ml_dtypes.bfloat16)
    (want,) = evaluate([y], {x: a, h: b})
    assert want[0, 0] != np.trunc(want[0, 0])  # the float branch has a fraction
    for order in (False, True):
        got = fn(a, b, device="emulate", race_check=order)
        np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


# --------------------------------------------------------------------------- wide dtypes


def test_negating_a_bool_is_a_dtype_error():
    """Regression (fuzz seeds 22317, 22346 with --dtypes all): ``-m`` of a bool tensor was a
    bool Unary the reference crashed on (numpy refuses it; C gives the int -1)."""
    m = te.placeholder((4,), "bool", name="m")
    with pytest.raises(DtypeError, match="-x of a bool expression"):
        te.compute((4,), lambda i: -m[i], name="y")


def test_integer_inputs_of_rank_zero_are_arrays():
    """Regression (fuzz seeds 22262, 22349): a 0-d int input was a numpy scalar, which a
    compiled graph refuses."""
    nodes = [
        Node("x", "input", (), fill="normal", seed=1, dtype="int32"),
        Node("y", "unary", (), ("x",), "abs", dtype="float32"),
    ]
    spec = GraphSpec({}, nodes, ["y"], seed=3)
    assert isinstance(input_values(spec)["x"], np.ndarray)
    assert check_spec(spec).status == "pass"


def test_float64_result_of_float32_arithmetic_takes_float32s_tolerance():
    """Regression (fuzz seeds 22195, 22303, 22313): ``tanh`` of a bfloat16 tensor stored in
    float64 is computed in float32 registers (te's dtype of the body is bfloat16) where the
    reference's body is float64; it was compared at float64's tolerance."""
    nodes = [
        Node("x", "input", ("a",), fill="normal", seed=1, dtype="bfloat16"),
        Node("u", "unary", ("a",), ("x",), "tanh", dtype="float64"),
        Node("v", "unary", ("a",), ("u",), "tanh", dtype="float64"),
    ]
    spec = GraphSpec({"a": 129}, nodes, ["u", "v"], seed=3)
    assert precision(spec, "u") == "float32" and precision(spec, "v") == "float32"
    uniform = GraphSpec({"a": 9}, [replace(n, dtype="float64") for n in nodes], ["v"], seed=3)
    assert precision(uniform, "v") == "float64"
    assert check_spec(spec).status == "pass"


def test_float32_overflow_of_a_float64_result_is_not_a_mismatch():
    """Regression (fuzz seed 22202): float32 arithmetic stored in float64 overflows to inf in
    the kernel where the reference's float64 body holds 2.9e45."""
    got, want = np.array([np.inf, 1.0]), np.array([2.9e45, 1.0])
    assert compare("y", got, want, dtype="float32") == ""
    assert "infinities differ" in compare("y", got, want, dtype="float64")


def test_a_bool_tensor_is_read_once_by_binary_or_where_only():
    """bool arithmetic differs between numpy and C (True + True): a stored bool tensor is
    read once per op, by binary ops and where branches, beside no other bool."""
    seen = 0
    for s in range(600):  # bool tensors come from the random family's graphs only
        spec = with_dtypes(draw(s), ALL)
        for n in spec.nodes:
            if n.dtype != "bool":
                continue
            seen += 1
            for m in spec.nodes:
                if n.name in m.args:
                    assert m.kind in ("binary", "where") and m.args.count(n.name) == 1
                    assert "bool" not in m.casts
    assert seen > 5


def test_only_exact_values_are_stored_as_integers():
    """Regression (fuzz seed 720018): ``int64(sigmoid(r))`` of a float16 ``r`` truncates 1.0
    in the kernel's float32 registers and 0.99999… in the reference's float64 body; integer
    tensors hold inputs and computes exact on them only."""
    ints = ("uint8", "int8", "int16", "int32", "int64", "bool")
    stored = 0
    for s in range(400):
        spec = with_dtypes(draw(s), ALL)
        for n in spec.nodes:
            if n.dtype not in ints or n.kind == "input":
                continue
            stored += 1
            assert not n.casts and all(spec.node(a).dtype == n.dtype for a in n.args), n
            assert n.kind in ("reduce", "unary", "binary", "transpose"), n
    assert stored > 5
