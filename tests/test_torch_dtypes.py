"""torch.compile(backend="polyfuse") in float16 and bfloat16 (issue 22 item 4): an MLP, a small
CNN block and ``nn.TransformerEncoderLayer`` compile into polyfuse regions (no operator left
in PyTorch for its dtype) and match eager within the per-dtype tolerance
(:func:`polyfuse.graph.dtypes.tolerance`); float64 compiles too, and a dtype polyfuse lacks
(int16) stays in PyTorch, said at WARNING and counted; a wrong input dtype is a CallError
naming the input."""

from __future__ import annotations

import logging

import ml_dtypes
import numpy as np
import pytest

pytestmark = pytest.mark.extra  # needs PyTorch (CI's extras step)
torch = pytest.importorskip("torch")
nn = torch.nn

import polyfuse.torch as pt  # noqa: E402
from polyfuse.errors import CallError  # noqa: E402
from polyfuse.graph.dtypes import tolerance  # noqa: E402
from polyfuse.torch import last_compiled  # noqa: E402
from polyfuse.torch.backend import from_numpy, to_numpy  # noqa: E402

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    pt.reset()
    yield
    torch._dynamo.reset()


def _compile_and_compare(model: nn.Module, x: torch.Tensor, dtype: str) -> None:
    """Compile ``model`` (already in ``dtype``), run it on the emulator and assert: one region
    or more, no operator left in PyTorch, the output dtype kept, and the values within the
    tolerance of ``dtype`` of eager's."""
    with torch.no_grad():
        got = torch.compile(model, backend="polyfuse")(x)
        want = model(x)
    g = last_compiled()
    report = g.polyfuse_report
    assert len(g.polyfuse_regions) >= 1
    assert report["eager"] == {}, report["reasons"]
    assert report["eager_for_dtype"] == {}
    assert got.dtype == DTYPES[dtype] and got.shape == want.shape
    tol = tolerance(dtype)
    g64, w64 = got.double().numpy(), want.double().numpy()
    assert tol.allclose(g64, w64), float(np.abs(g64 - w64).max())
    # the regions really are of that dtype: their placeholders carry it
    assert {t.dtype for r in g.polyfuse_regions for t in r.lowered.inputs} == {dtype}


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_mlp(dtype):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).to(DTYPES[dtype])
    x = torch.randn(3, 8).to(DTYPES[dtype])
    _compile_and_compare(model.eval(), x, dtype)
    assert len(last_compiled().polyfuse_regions) == 1


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_cnn_block(dtype):
    # a 16-bit conv takes the reduction mapping (no GEMM tiling): sizes kept tiny
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2)
    )
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 1.5)
    x = torch.randn(1, 2, 6, 6).to(DTYPES[dtype])
    _compile_and_compare(model.to(DTYPES[dtype]).eval(), x, dtype)
    assert len(last_compiled().polyfuse_regions) == 1


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_transformer_encoder_layer(dtype):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        d_model=8, nhead=2, dim_feedforward=16, dropout=0.0, batch_first=True
    )
    x = torch.randn(2, 5, 8).to(DTYPES[dtype])
    _compile_and_compare(layer.to(DTYPES[dtype]).eval(), x, dtype)
    assert len(last_compiled().polyfuse_regions) == 1


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_16_bit_normalisations_compute_in_float32_and_round_once(dtype):
    """Layer/group/instance norm and softmax of a 16-bit tensor compute in float32 and round
    their result once, as torch's kernels do: within half a unit in the last place of the
    float64 result (lowered in the 16-bit dtype, the centred values and exponentials were
    rounded too: float16 layer norms up to 50 units from eager), and the region holds
    float32 intermediates."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 4, 6, 10, generator=g).to(DTYPES[dtype])
    w = torch.randn(10, generator=g).to(DTYPES[dtype])

    def f(x, w):
        return (nn.functional.layer_norm(x, (10,), w), torch.softmax(x, -1),
                nn.functional.group_norm(x, 2), nn.functional.instance_norm(x))  # fmt: skip

    with torch.no_grad():
        got = torch.compile(f, backend="polyfuse")(x, w)
        exact = f(x.double(), w.double())
    for gt, w64 in zip(got, exact, strict=True):
        assert gt.dtype == DTYPES[dtype]
        ulp = torch.finfo(gt.dtype).eps * torch.exp2(torch.floor(torch.log2(w64.abs())))
        assert ((gt.double() - w64).abs() <= 0.5 * ulp + 1e-9).all()
    report = last_compiled().polyfuse_report
    assert report["eager"] == {}, report["reasons"]
    inner, seen = set(), set()
    stack = [t for r in last_compiled().polyfuse_regions for t in r.lowered.outputs]
    while stack:
        t = stack.pop()
        if t.op is not None and t.uid not in seen:
            seen.add(t.uid)
            inner.add(t.dtype)
            stack.extend(t.op.inputs())
    assert inner == {"float32", dtype}


class MixedPrecision(nn.Module):
    """float16 storage, a float32 softmax (``dtype=``) and a float32 sum, then back."""

    def forward(self, x):
        p = torch.softmax(x, dim=-1, dtype=torch.float32)
        s = x.sum(dim=-1, keepdim=True, dtype=torch.float32)
        return (p * s).half()


def test_mixed_precision_conversions_compile():
    # _to_copy(dtype=), softmax/sum with a dtype: lowered with te.cast, not left in PyTorch
    torch.manual_seed(0)
    x = (torch.rand(4, 64) * 4).half()
    _compile_and_compare(MixedPrecision(), x, "float16")


def test_float64_compiles_and_only_a_dtype_polyfuse_lacks_stays_in_pytorch(caplog):
    # float64 regions compile (tests/test_torch_wide_dtypes.py has the int and bool ones);
    # a dtype polyfuse has no type for (complex64) stays in PyTorch, said at WARNING and counted
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).double().eval()
    x = torch.randn(3, 8).double()
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="polyfuse.torch"):
        got = torch.compile(model, backend="polyfuse")(x)
        want = model(x)
    assert got.dtype == torch.float64
    assert tolerance("float64").allclose(got.numpy(), want.numpy())
    report = last_compiled().polyfuse_report
    assert report["eager_for_dtype"] == {} and report["eager"] == {}
    assert report["polyfuse"]["aten.addmm.default"] == 2
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    v = torch.ones(6, dtype=torch.complex64)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="polyfuse.torch"):
        torch.compile(lambda t: t * 2 + 1, backend="polyfuse")(v)
    reason = (
        "dtype complex64 (polyfuse stores float32, float16, bfloat16, float64, uint8, int8, "
        "int16, int32, int64, bool)"
    )
    assert last_compiled().polyfuse_report["eager_for_dtype"] == {
        f"aten.mul.Tensor ({reason})": 1,
        f"aten.add.Tensor ({reason})": 1,
    }
    msgs = [
        r.getMessage()
        for r in caplog.records
        if r.name == "polyfuse.torch" and r.levelno == logging.WARNING
    ]
    assert any("2 operators stay in PyTorch for their dtype" in m and reason in m for m in msgs)


def test_wrong_input_dtype_is_a_call_error_naming_the_input():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).half().eval()
    x = torch.randn(2, 4).half()
    with torch.no_grad():
        torch.compile(model, backend="polyfuse")(x)
    [region] = last_compiled().polyfuse_regions
    fn = region.compiled
    names = [t.name for t in region.lowered.inputs]
    good = [to_numpy(torch.zeros(t.shape, dtype=torch.float16)) for t in region.lowered.inputs]
    bad = list(good)
    bad[-1] = bad[-1].astype(np.float32)
    with pytest.raises(CallError, match=names[-1]):
        fn(*bad)


def test_bfloat16_tensors_cross_to_numpy_and_back_by_their_bits():
    t = torch.tensor([1.0, -2.5, 3.0e38, float("inf")], dtype=torch.bfloat16)
    a = to_numpy(t)
    assert a.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(a.astype(np.float32), t.float().numpy())
    back = from_numpy(a)
    assert back.dtype == torch.bfloat16 and torch.equal(back, t)
    h = torch.tensor([0.5, 65504.0], dtype=torch.float16)
    assert to_numpy(h).dtype == np.float16 and torch.equal(from_numpy(to_numpy(h)), h)
