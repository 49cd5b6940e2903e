"""``fn(torch_cpu_tensor)`` on the emulator: read through DLPack, torch tensors returned.

Needs PyTorch (an optional extra: .ci/run runs this file after installing it)."""

from __future__ import annotations

import numpy as np
import pytest

import polyfuse
from polyfuse import examples
from polyfuse.errors import CallError

pytestmark = pytest.mark.extra  # needs PyTorch (CI's extras step)
torch = pytest.importorskip("torch")


def test_call_accepts_torch_cpu_tensors_and_returns_torch() -> None:
    inputs, outputs, reference = examples.EXAMPLES["softmax"].build()
    fn = polyfuse.compile(inputs=inputs, outputs=outputs, check_cuda=False, name="softmax")
    (x,) = examples.random_inputs(inputs)
    (want,) = reference(x)
    got = fn(torch.from_numpy(x).requires_grad_())  # a tensor of a model, gradients and all
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)
    got = fn(torch.from_numpy(x).t().contiguous().t())  # strided views too
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)
    out = torch.empty(want.shape)
    assert fn(torch.from_numpy(x), out=out) is out  # written in place
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-5)
    with pytest.raises(CallError, match="expected float32"):
        fn(torch.from_numpy(x).double())
