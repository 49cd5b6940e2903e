"""The zoo's models as PyTorch modules: the same definitions, evaluated with torch operators.

Every :mod:`polyfuse.zoo` model is written once over a backend ``b`` (see
:mod:`polyfuse.zoo.backend`). :class:`TorchBackend` is that backend in PyTorch, so
:func:`torch_model` gives an ``nn.Module`` computing exactly what polyfuse compiles, with the
very same weight arrays — the peer of the whole-model GPU benchmark (eager and
``torch.compile``), its float64 reference (``.double()``), and a model to hand to
``torch.compile(backend="polyfuse")``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from polyfuse import zoo

__all__ = ["TorchBackend", "ZooModule", "torch_model"]


class TorchBackend:
    """Evaluates a zoo definition with torch operators on given inputs and weights."""

    def __init__(self, inputs: dict[str, torch.Tensor], params: dict[str, torch.Tensor]) -> None:
        self.inputs = inputs
        self.params = params

    def input(self, name: str, shape: Sequence[int], kind: str = "normal") -> torch.Tensor:
        return self.inputs[name]

    def param(self, name: str, shape: Sequence[int], init: str = "weight") -> torch.Tensor:
        return self.params[name]

    @staticmethod
    def _binary(fn: Any, a: Any, b: Any) -> torch.Tensor:
        """``fn(a, b)`` with Python numbers on either side (as numpy's ufuncs take them)."""
        if not isinstance(a, torch.Tensor):
            a = torch.as_tensor(a, dtype=b.dtype, device=b.device)
        if not isinstance(b, torch.Tensor):
            b = torch.as_tensor(b, dtype=a.dtype, device=a.device)
        return fn(a, b)

    def add(self, a: Any, b: Any) -> torch.Tensor:
        return self._binary(torch.add, a, b)

    def sub(self, a: Any, b: Any) -> torch.Tensor:
        return self._binary(torch.sub, a, b)

    def mul(self, a: Any, b: Any) -> torch.Tensor:
        return self._binary(torch.mul, a, b)

    def div(self, a: Any, b: Any) -> torch.Tensor:
        return self._binary(torch.div, a, b)

    def maximum(self, a: Any, b: Any) -> torch.Tensor:
        return self._binary(torch.maximum, a, b)

    def minimum(self, a: Any, b: Any) -> torch.Tensor:
        return self._binary(torch.minimum, a, b)

    matmul = staticmethod(torch.matmul)
    tanh = staticmethod(torch.tanh)
    sigmoid = staticmethod(torch.sigmoid)
    relu = staticmethod(torch.relu)

    @staticmethod
    def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        return F.gelu(x, approximate=approximate)

    @staticmethod
    def reduce_sum(x: torch.Tensor, axis: Any, keepdims: bool = False) -> torch.Tensor:
        return torch.sum(x, dim=axis if isinstance(axis, int) else tuple(axis), keepdim=keepdims)

    @staticmethod
    def reduce_mean(x: torch.Tensor, axis: Any, keepdims: bool = False) -> torch.Tensor:
        return torch.mean(x, dim=axis if isinstance(axis, int) else tuple(axis), keepdim=keepdims)

    @staticmethod
    def softmax(x: torch.Tensor, axis: int = -1) -> torch.Tensor:
        return torch.softmax(x, dim=axis)

    @staticmethod
    def layer_norm(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float = 1e-5):
        return F.layer_norm(x, (x.shape[-1],), gamma, beta, eps)

    @staticmethod
    def batch_norm(x, mean, var, gamma, beta, eps: float = 1e-5) -> torch.Tensor:
        return F.batch_norm(x, mean, var, gamma, beta, training=False, eps=eps)

    @staticmethod
    def transpose(x: torch.Tensor, perm: Sequence[int]) -> torch.Tensor:
        return x.permute(*perm)

    @staticmethod
    def reshape(x: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
        return x.reshape(*shape)

    @staticmethod
    def concat(xs: Sequence[torch.Tensor], axis: int) -> torch.Tensor:
        return torch.cat(list(xs), dim=axis)

    @staticmethod
    def slice(x, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int]):
        idx: list[Any] = [slice(None)] * x.dim()
        for s, e, a in zip(starts, ends, axes, strict=True):
            idx[a] = slice(s, e)
        return x[tuple(idx)]

    @staticmethod
    def broadcast_to(x: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
        return x.expand(*shape)

    @staticmethod
    def conv2d(x, w, bias=None, stride: int = 1, padding: int = 0, groups: int = 1):
        return F.conv2d(x, w, bias, stride=stride, padding=padding, groups=groups)

    @staticmethod
    def max_pool2d(x: torch.Tensor, kernel: int, stride: int, padding: int = 0):
        return F.max_pool2d(x, kernel, stride, padding)

    @staticmethod
    def shape(x: torch.Tensor) -> tuple[int, ...]:
        return tuple(x.shape)


class ZooModule(torch.nn.Module):
    """A zoo model as an ``nn.Module``: ``forward(*inputs)`` in the zoo's input order;
    weights are buffers (``.double()`` / ``.to(device)`` move them)."""

    def __init__(self, name: str, size: str, model: zoo.ZooModel) -> None:
        super().__init__()
        self.zoo_name = name
        self.size = size
        self.spec = zoo.MODELS[name]
        self.config = dict(model.config)
        self.input_names = [t.name for t in model.inputs]
        self.param_names = []
        for t, array in model.constants.items():
            key = f"w{len(self.param_names)}"
            self.register_buffer(key, torch.from_numpy(array.copy()))
            self.param_names.append((t.name, key))

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        params = {name: getattr(self, key) for name, key in self.param_names}
        b = TorchBackend(dict(zip(self.input_names, inputs, strict=True)), params)
        return tuple(self.spec.define(b, self.config))


def torch_model(name: str, size: str = "full", *, seed: int = 0) -> tuple[ZooModule, zoo.ZooModel]:
    """The zoo model ``name`` as a :class:`ZooModule` and the polyfuse :class:`ZooModel`
    built with the same seed (same weights): compile the second, compare with the first."""
    model = zoo.build(name, size, seed=seed)
    return ZooModule(name, size, model).eval(), model
