"""``ops.grid_sample``: ONNX GridSample (2-D and 3-D; linear, nearest, cubic; zeros, border,
reflection; corners aligned or not) against ONNX's reference evaluator, compiled with NVRTC
for sm_80 and sm_90 and rerun race-free; torch's ``F.grid_sample`` compiled by the polyfuse
backend against eager, nothing left in PyTorch; and the one place the two conventions part
(a nearest sample at an exact half beyond a non-aligned edge, reflected)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import helper  # noqa: E402
from test_onnx_fuzz import _nodes_model  # noqa: E402
from test_onnx_norms_and_math import _agrees  # noqa: E402

from polyfuse.onnx.backend import prepare  # noqa: E402

RNG = np.random.default_rng(20)


def _grid(*shape):
    return RNG.uniform(-1.4, 1.4, shape).astype(np.float32)  # some points beyond the edges


@pytest.mark.parametrize(
    ("mode", "padding", "align"),
    list(itertools.product(["linear", "nearest", "cubic"], ["zeros", "border", "reflection"],
                           [0, 1])),  # fmt: skip
)
def test_onnx_grid_sample_2d(mode, padding, align):
    x = RNG.standard_normal((2, 3, 7, 9)).astype(np.float32)
    node = helper.make_node("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode=padding,
                            align_corners=align)  # fmt: skip
    _agrees([node], {"x": x, "g": _grid(2, 5, 6, 2)}, opset=20)


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
def test_onnx_grid_sample_3d(mode):
    x = RNG.standard_normal((1, 2, 4, 5, 6)).astype(np.float32)
    node = helper.make_node("GridSample", ["x", "g"], ["y"], mode=mode,
                            padding_mode="reflection")  # fmt: skip
    _agrees([node], {"x": x, "g": _grid(1, 3, 2, 4, 3)}, opset=20)


def test_opset_16_names_and_float16():
    """Opset 16's ``bicubic`` is opset 20's ``cubic`` (onnx's reference knows only the
    latter); float16 interpolates in float32 and rounds once."""
    x = RNG.standard_normal((1, 2, 6, 5)).astype(np.float16)
    inputs = {"x": x, "g": _grid(1, 4, 3, 2).astype(np.float16)}
    (want,) = _agrees([helper.make_node("GridSample", ["x", "g"], ["y"], mode="cubic")],
                      inputs, opset=20)  # fmt: skip
    old = helper.make_node("GridSample", ["x", "g"], ["y"], mode="bicubic")
    (got,) = prepare(_nodes_model([old], inputs, opset=16), "CPU").run(inputs)
    np.testing.assert_array_equal(got, want)


@pytest.mark.extra
def test_the_two_conventions_part_at_an_exact_half_beyond_the_edge():
    """W = 4, corners not aligned: grid -1.5 maps to exactly -1.5. ONNX rounds it to -2 and
    reflects that onto 1; torch reflects -1.5 onto 0.5 and rounds that to 0. Each path
    follows its own reference."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    import polyfuse
    from polyfuse import ops, te

    x = np.arange(4, dtype=np.float32).reshape(1, 1, 1, 4)
    g = np.array([[[[-1.5, 0.0]]]], np.float32)
    node = helper.make_node("GridSample", ["x", "g"], ["y"], mode="nearest",
                            padding_mode="reflection")  # fmt: skip
    (y,) = _agrees([node], {"x": x, "g": g}, opset=20)
    assert y.reshape(-1)[0] == 1.0
    want = F.grid_sample(torch.from_numpy(x), torch.from_numpy(g), mode="nearest",
                         padding_mode="reflection", align_corners=False)  # fmt: skip
    assert float(want.reshape(-1)[0]) == 0.0
    xt, gt = te.placeholder(x.shape, name="x"), te.placeholder(g.shape, name="g")
    yt = ops.grid_sample(xt, gt, "nearest", "reflection", False, convention="torch")
    got = polyfuse.compile([xt, gt], [yt], check_cuda=False)(x, g)
    assert np.asarray(got).reshape(-1)[0] == 0.0


@pytest.mark.extra
@pytest.mark.parametrize("dims", [2, 3])
def test_torch_grid_sample_runs_in_polyfuse(dims):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    import polyfuse.torch

    modes = ["bilinear", "nearest", "bicubic"] if dims == 2 else ["bilinear", "nearest"]
    for mode, pad, align in itertools.product(modes, ["zeros", "border", "reflection"],
                                              [False, True]):  # fmt: skip
        def f(x, g, mode=mode, pad=pad, align=align):
            return F.grid_sample(x, g, mode=mode, padding_mode=pad, align_corners=align)

        shape = (2, 3, 7, 9) if dims == 2 else (1, 2, 4, 5, 6)
        grid = (2, 5, 4, 2) if dims == 2 else (1, 3, 2, 4, 3)
        x, g = torch.randn(shape), torch.rand(grid) * 2.8 - 1.4
        torch._dynamo.reset()
        with torch.no_grad():
            got = torch.compile(f, backend="polyfuse")(x, g)
        report = polyfuse.torch.compiled_graphs()[-1].polyfuse_report
        assert not report["eager"], (mode, pad, align, report["reasons"])
        torch.testing.assert_close(got, f(x, g), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("dims", [2, 3])
def test_affine_grid_then_grid_sample_a_spatial_transformer(align, dims):
    """The spatial transformer's pair: AffineGrid's grid of rotated, scaled points (sizes
    1 on one axis too), sampled by GridSample."""
    size = [2, 3, 5, 1, 7] if dims == 3 else [2, 3, 6, 1]
    theta = RNG.uniform(-1.2, 1.2, (2, dims, dims + 1)).astype(np.float32)
    x = RNG.standard_normal((2, 3, 4, 5, 6) if dims == 3 else (2, 3, 5, 7)).astype(np.float32)
    nodes = [helper.make_node("AffineGrid", ["t", "s"], ["g"], align_corners=align),
             helper.make_node("GridSample", ["x", "g"], ["y"], align_corners=align)]  # fmt: skip
    consts = {"s": np.array(size, np.int64)}
    _agrees(nodes[:1], {"t": theta}, consts, opset=20)
    _agrees(nodes, {"t": theta, "x": x}, consts, opset=20)
