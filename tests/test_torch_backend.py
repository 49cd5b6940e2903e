"""torch.compile(backend="polyfuse") on the CPU emulator: same outputs as eager PyTorch.

Skipped when PyTorch is not installed (CI installs the CPU wheel). Sizes are small: every
region runs in the emulator.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from polyfuse.errors import DeviceError  # noqa: E402
from polyfuse.torch import last_compiled, polyfuse_backend  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def run_both(model: nn.Module, *inputs: torch.Tensor):
    model = model.eval()
    with torch.no_grad():
        want = model(*inputs)
        got = torch.compile(model, backend="polyfuse")(*inputs)
    return got, want


def close(got, want, tol: float = 1e-5):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert isinstance(g, torch.Tensor) and g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=tol, atol=tol)


def test_registered_as_backend():
    assert "polyfuse" in torch._dynamo.list_backends()
    assert torch._dynamo.lookup_backend("polyfuse") is polyfuse_backend


def test_mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(24, 40), nn.GELU(), nn.Linear(40, 16), nn.ReLU())
    got, want = run_both(model, torch.randn(6, 24))
    close(got, want)
    fused = last_compiled()
    assert fused.polyfuse_report["eager"] == {}, "the whole MLP runs in polyfuse"
    assert fused.polyfuse_report["polyfuse"]["aten.addmm.default"] == 2


class Block(nn.Module):
    """A pre-LN transformer block (self-attention + GELU FFN)."""

    def __init__(self, d: int = 16, heads: int = 2, ffn: int = 32) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, ffn), nn.Linear(ffn, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)

        def heads(t):
            return t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = heads(q), heads(k), heads(v)
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.down(nn.functional.gelu(self.up(self.ln2(x))))


def test_transformer_block():
    torch.manual_seed(1)
    got, want = run_both(Block(), torch.randn(2, 5, 16))
    close(got, want, 2e-5)
    assert last_compiled().polyfuse_report["eager"] == {}


def test_cnn_block():
    torch.manual_seed(2)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(4, 4, 3, stride=2, padding=1, groups=2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
    )
    with torch.no_grad():  # non-trivial running statistics
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 1.5)
    got, want = run_both(model, torch.randn(2, 3, 8, 8))
    close(got, want, 2e-5)
    report = last_compiled().polyfuse_report
    assert report["polyfuse"]["aten.convolution.default"] == 2


class WithUnsupported(nn.Module):
    """cumsum has no polyfuse lowering: the graph breaks around it."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        return torch.tanh(self.b(torch.cumsum(h, dim=1)))


def test_unsupported_operator_is_a_graph_break(caplog):
    torch.manual_seed(3)
    with caplog.at_level(logging.DEBUG, logger="polyfuse.torch"):
        got, want = run_both(WithUnsupported(), torch.randn(3, 8))
    close(got, want)
    fused = last_compiled()
    assert fused.polyfuse_report["eager"] == {"aten.cumsum.default": 1}
    assert len(fused.polyfuse_regions) == 2, "one region before the break, one after"
    messages = [r.getMessage() for r in caplog.records if r.name == "polyfuse.torch"]
    assert any(
        "1 operators stay in PyTorch: aten.cumsum.default x1 (operator not supported" in m
        for m in messages
    ), messages


def test_cuda_tensors_without_a_gpu_are_refused():
    from polyfuse.cuda.runtime import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present")
    region = None
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval()
    with torch.no_grad():
        torch.compile(model, backend="polyfuse")(torch.randn(2, 4))
    region = last_compiled().polyfuse_regions[0]

    class FakeCuda:  # what forward sees of a CUDA tensor: its device
        device = torch.device("cuda", 0)

        def detach(self):
            return self

        def contiguous(self):
            return self

        def data_ptr(self):
            return 0

    with pytest.raises(DeviceError) as info:
        region(FakeCuda(), FakeCuda(), FakeCuda())
    msg = str(info.value)
    assert msg.startswith("polyfuse region polyfuse_0: CUDA tensors, but polyfuse cannot run")
    assert "CPU tensors to use the emulator" in msg and "\n" not in msg


def test_training_runs_eagerly_with_a_warning():
    model = nn.Linear(4, 2)
    x = torch.randn(3, 4)
    with pytest.warns(UserWarning, match="inference only"):
        y = torch.compile(model, backend="polyfuse")(x)
    y.sum().backward()
    assert model.weight.grad is not None


def test_misaligned_views_are_realigned_not_refused():
    from polyfuse.torch.backend import region_input

    base = torch.arange(12, dtype=torch.float32)
    view = base[1:]  # 4 bytes past a 16-byte aligned start
    assert view.data_ptr() % 16 == 4
    got = region_input(view)
    assert got.data_ptr() % 16 == 0 and torch.equal(got, view)
    assert region_input(base).data_ptr() == base.data_ptr(), "aligned inputs are not copied"

    model = nn.Sequential(nn.Linear(11, 5), nn.ReLU()).eval()
    x = torch.randn(4, 12)[:, 1:]  # non-contiguous, then contiguous-but-offset after slicing
    got, want = run_both(model, x)
    close(got, want)
