"""Host arrays other than numpy's, for the emulator: torch CPU tensors and any DLPack array.

``fn(...)`` on the emulator computes on numpy arrays. An argument that is a host (CPU) array
of another library — a ``torch.Tensor``, or anything exporting DLPack on the CPU — is read
through ``np.from_dlpack`` (a view, no copy; a torch tensor that requires grad is detached
first). When any argument was a torch tensor the outputs are returned as torch tensors sharing
the numpy results' memory (torch in → torch out); other libraries get numpy arrays back.
Device arrays are left alone here: the caller says they belong to ``device="cuda"``.

Only numpy is imported (torch lazily, when a torch tensor came in): this runs where the
runtime runs, without the compiler.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["as_torch", "host_arguments", "host_view"]

_KDLCPU = 1  # DLPack's device type of host memory


def host_view(obj: Any) -> Any:
    """``obj`` as a numpy view when it is a host DLPack array; anything else as it is
    (numpy arrays, device arrays and junk are judged by the caller)."""
    if isinstance(obj, np.ndarray) or not hasattr(obj, "__dlpack__"):
        return obj
    try:
        if int(obj.__dlpack_device__()[0]) != _KDLCPU:
            return obj
        if getattr(obj, "requires_grad", False):  # torch refuses to export those
            obj = obj.detach()
        return np.from_dlpack(obj)
    except Exception:  # not exportable after all: the caller's message says what it got
        return obj


def host_arguments(args: tuple, kwargs: dict) -> tuple[tuple, dict, bool]:
    """Positional and keyword arguments with host DLPack arrays as numpy views, and whether
    any was a torch tensor (then the outputs go back as torch tensors)."""
    torch_in = any(_is_torch(a) for a in (*args, *kwargs.values()))
    return (
        tuple(host_view(a) for a in args),
        {k: host_view(v) for k, v in kwargs.items()},
        torch_in,
    )


def as_torch(values: tuple) -> tuple:
    """numpy outputs as torch CPU tensors sharing their memory (other values unchanged)."""
    import torch

    return tuple(torch.from_numpy(v) if isinstance(v, np.ndarray) else v for v in values)


def _is_torch(obj: Any) -> bool:
    return type(obj).__module__.split(".")[0] == "torch"
