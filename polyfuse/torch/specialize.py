"""Graphs with dynamic shapes: one static polyfuse compile per concrete input signature.

When a compiled model is called with a second batch size, Dynamo recompiles the graph with
symbolic sizes (``s0`` for the batch). polyfuse specialises kernels to their shapes (isl
domains, tile sizes, launch shapes and shared-memory footprints are all computed for
concrete extents), so instead of compiling nothing, the backend returns a
:class:`Specializations`: at each call it looks up the inputs' signature (shapes, strides,
dtypes, devices and the integer arguments that carry the symbolic sizes), compiles the
Dynamo graph for it through the static pipeline on a miss, and keeps at most
``max_specializations`` compiles, least recently used evicted first.
"""

from __future__ import annotations

import logging
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
import torch.fx

from .options import BackendOptions

__all__ = ["INFERENCE_ONLY", "Specializations", "is_symbolic", "needs_autograd", "signature"]

log = logging.getLogger("polyfuse.torch")

INFERENCE_ONLY = (
    "polyfuse backend: inference only; this graph needs autograd and runs eagerly "
    "(call the model under torch.no_grad() or torch.inference_mode())"
)


def needs_autograd(inputs: Sequence[Any]) -> bool:
    """Grad is enabled and some input requires it: polyfuse (inference only) stays out."""
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in inputs
    )


def _symbolic(x: Any) -> bool:
    return isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool))


def is_symbolic(example_inputs: Sequence[Any]) -> bool:
    """Dynamo's example inputs carry symbolic sizes (a SymInt argument or tensor dim)."""
    for x in example_inputs:
        if _symbolic(x):
            return True
        if isinstance(x, torch.Tensor) and any(_symbolic(s) for s in (*x.shape, *x.stride())):
            return True
    return False


def signature(args: Sequence[Any]) -> tuple[Hashable, ...]:
    """What a static compile depends on: each tensor's shape, strides, dtype and device;
    each other argument's value (the sizes Dynamo passes as ints)."""
    key: list[Hashable] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            key.append((tuple(a.shape), tuple(a.stride()), a.dtype, a.device))
        elif isinstance(a, (int, float, bool, str, type(None))):
            key.append(a)
        else:
            key.append(type(a).__name__)
    return tuple(key)


def _shapes(args: Sequence[Any]) -> str:
    """The non-parameter tensors' shapes, for log lines: ``(5, 24)``."""
    parts = [
        str(tuple(a.shape))
        for a in args
        if isinstance(a, torch.Tensor) and not isinstance(a, torch.nn.Parameter)
    ]
    return ", ".join(parts) or "no tensors"


class Specializations:
    """A Dynamo graph with symbolic shapes, compiled per concrete input signature on call.

    ``compile_fn(gm, args, opts, label)`` is the static pipeline (AOT autograd → polyfuse
    regions). At most ``opts.max_specializations`` compiles are kept (LRU); ``compiles``
    counts every compile made, ``evictions`` those dropped.
    """

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        opts: BackendOptions,
        compile_fn: Callable[..., Callable[..., Any]],
    ) -> None:
        self.gm = gm
        self.opts = opts
        self.compile_fn = compile_fn
        self.cache: OrderedDict[tuple[Hashable, ...], Callable[..., Any]] = OrderedDict()
        self.compiles = 0
        self.evictions = 0
        self._warned = False

    def __call__(self, *args: Any) -> Any:
        if needs_autograd(args):
            if not self._warned:
                warnings.warn(INFERENCE_ONLY, stacklevel=2)
                self._warned = True
            return self.gm(*args)
        key = signature(args)
        fn = self.cache.get(key)
        if fn is not None:
            self.cache.move_to_end(key)
            return fn(*args)
        self.compiles += 1
        label = f"specialization {self.compiles} for {_shapes(args)}"
        log.info("polyfuse: dynamic shapes: compiling %s", label)
        fn = self.compile_fn(self.gm, list(args), self.opts, label)
        self.cache[key] = fn
        while len(self.cache) > self.opts.max_specializations:
            old, _ = self.cache.popitem(last=False)
            self.evictions += 1
            log.info(
                "polyfuse: dynamic shapes: more than %d specializations; dropped the least "
                "recently used (recompiled if called again)",
                self.opts.max_specializations,
            )
        return fn(*args)
