"""ONNX Cast and QuantizeLinear onto float8 (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz), float4e2m1
and 4/2-bit integers (:mod:`polyfuse.onnx.narrow_types`), against ONNX's reference (ml_dtypes'
conversions): every grid value, every halfway point between neighbours (halves to even) and
its two float32 neighbours, the largest finite value and beyond, denormals, zeros,
infinities and NaN, with and without ``saturate``; each model also compiled with NVRTC for
sm_80 and sm_90 and rerun race-free."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ml_dtypes = pytest.importorskip("ml_dtypes")

from onnx import helper  # noqa: E402
from test_onnx_fuzz import _compiles_and_runs_race_free, _nodes_model  # noqa: E402

from polyfuse.onnx.backend import prepare  # noqa: E402
from polyfuse.onnx.narrow_types import FLOAT_FORMATS, INT_BITS  # noqa: E402
from polyfuse.testing.onnx_programs import reference_evaluator  # noqa: E402


def _probe_values(name: str) -> np.ndarray:
    """Every finite value of the format, the midpoints of neighbours and their float32
    neighbours, and the awkward ones."""
    dt = np.dtype(getattr(ml_dtypes, name))
    if name.startswith("float8"):
        grid = np.arange(256, dtype=np.uint8).view(dt)
    else:  # float4e2m1: eight magnitudes
        grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32).astype(dt)
    vals = np.unique(grid.astype(np.float32)[np.isfinite(grid.astype(np.float32))])
    vals = vals[vals >= 0]
    mids = (vals[:-1].astype(np.float64) + vals[1:]) / 2
    mids = mids.astype(np.float32)
    near = np.concatenate([np.nextafter(mids, np.float32(np.inf)),
                           np.nextafter(mids, np.float32(0))])  # fmt: skip
    top = vals.max()
    step = vals[-1] - vals[-2]
    odd = np.array([top + step / 2, top + step / 2 * 1.001, top * 1.0001, top * 4, 1e30, 3e38,
                    1e-30, 1e-45, 0.0, np.inf, np.nan], np.float32)  # fmt: skip
    rng = np.random.default_rng(len(name))
    rand = np.exp2(rng.uniform(-20, 18, 400)).astype(np.float32)
    pos = np.concatenate([vals, mids, near, odd, rand])
    return np.concatenate([pos, -pos, [-0.0]]).astype(np.float32)


def _same(got, want) -> None:
    g, w = np.asarray(got, np.float32), np.asarray(want).astype(np.float32)
    assert g.shape == w.shape
    bad = ~((g == w) | (np.isnan(g) & np.isnan(w)))
    assert not bad.any(), list(zip(g[bad][:8], w[bad][:8], strict=False))


@pytest.mark.parametrize("name", sorted(FLOAT_FORMATS))
@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("src", ["float32", "float16"])
def test_cast_onto_a_narrow_float_matches_ml_dtypes(name, saturate, src):
    x = _probe_values(name)
    if src == "float16":
        with np.errstate(over="ignore"):
            x = x.astype(np.float16)
    to = helper.np_dtype_to_tensor_dtype(np.dtype(getattr(ml_dtypes, name)))
    at = {"saturate": saturate} if name.startswith("float8") else {}
    node = helper.make_node("Cast", ["x"], ["y"], to=to, **at)
    model = _nodes_model([node], {"x": x}, opset=23)
    (got,) = prepare(model, "CPU").run({"x": x})
    (want,) = reference_evaluator(model).run(None, {"x": x})
    assert got.dtype == want.dtype
    _same(got, want)
    _compiles_and_runs_race_free([node], {"x": x}, {}, [got], model)


@pytest.mark.parametrize("name", sorted(INT_BITS))
def test_cast_onto_a_narrow_integer_wraps(name):
    x = np.concatenate([np.arange(-40, 40) + 0.0, [-7.9, -0.5, 0.5, 7.9, 1e6, -1e6 - 3]])
    to = helper.np_dtype_to_tensor_dtype(np.dtype(getattr(ml_dtypes, name)))
    for src in (x.astype(np.float32), x.astype(np.int64)):
        node = helper.make_node("Cast", ["x"], ["y"], to=to)
        model = _nodes_model([node], {"x": src}, opset=23)
        (got,) = prepare(model, "CPU").run({"x": src})
        (want,) = reference_evaluator(model).run(None, {"x": src})
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.astype(np.int64), want.astype(np.int64))


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_quantize_onto_float8_per_axis(name):
    x = (np.random.default_rng(3).standard_normal((4, 9)) * 300).astype(np.float32)
    zp = np.zeros(4, getattr(ml_dtypes, name))
    scale = np.array([0.5, 1.0, 2.0, 0.01], np.float32)
    for sat in (1, 0):
        node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=0, saturate=sat)
        model = _nodes_model([node], {"x": x}, {"s": scale, "z": zp}, opset=21)
        (got,) = prepare(model, "CPU").run({"x": x})
        (want,) = reference_evaluator(model).run(None, {"x": x})
        _same(got, want)
