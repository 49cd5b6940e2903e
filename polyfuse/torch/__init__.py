"""polyfuse for PyTorch: ``torch.compile(model, backend="polyfuse")``.

Installing polyfuse registers the backend through the ``torch_dynamo_backends`` entry point,
so ``backend="polyfuse"`` works without importing anything; ``backend=polyfuse_backend``
works too. See :mod:`polyfuse.torch.backend` for what happens to the graph and
:mod:`polyfuse.torch.lower` for the operators polyfuse takes. Requires PyTorch
(``pip install 'polyfuse[torch]'``).

Example::

    import torch, polyfuse.torch
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU()).eval()
    fast = torch.compile(model, backend="polyfuse")
    with torch.no_grad():
        y = fast(torch.randn(8, 64, device="cuda"))   # CPU tensors run on the emulator
"""

from .backend import (
    PolyfuseRegion,
    compile_fx,
    compiled_graphs,
    last_compiled,
    polyfuse_backend,
    reset,
)
from .options import BackendOptionError

__all__ = [
    "BackendOptionError",
    "PolyfuseRegion",
    "compile_fx",
    "compiled_graphs",
    "last_compiled",
    "polyfuse_backend",
    "reset",
]
