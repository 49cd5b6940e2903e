"""Choosing a driver backend: ``select_driver`` tries cuda-bindings, then pycuda.

Kept apart from :mod:`.driver` (the interface both backends implement) so that the interface
does not import its implementations: the backends import the interface, this module imports
the backends.
"""

from __future__ import annotations

import os
from typing import Any

from polyfuse.base.errors import DeviceError

from .bindings_driver import BindingsDriver
from .driver import DRIVERS, ENV_VAR, Driver
from .pycuda_driver import PycudaDriver


def _load(name: str, module: Any = None) -> Driver:
    """Instantiate backend ``name``; ``module`` replaces the driver library (tests)."""
    if name == "cuda-bindings":
        return BindingsDriver(module)
    return PycudaDriver(module)


#: Backends that loaded, one instance per library for the process.
_LOADED: dict[str, Driver] = {}


def select_driver(runtime: str | None = None, *, module: Any = None) -> Driver:
    """The driver backend to use: ``runtime`` or ``$POLYFUSE_CUDA_RUNTIME`` when set, else the
    first of cuda-bindings, pycuda that imports and initialises.

    ``module`` replaces the driver library itself (``cuda.bindings.driver`` or
    ``pycuda.driver``; tests pass fakes). Raises :class:`DeviceError` naming each backend
    tried and why it is unusable.
    """
    wanted = runtime or os.environ.get(ENV_VAR) or None
    if wanted is not None and wanted not in DRIVERS:
        raise DeviceError(
            f"unknown CUDA runtime '{wanted}' ({ENV_VAR}); use one of {', '.join(DRIVERS)}"
        )
    names = [wanted] if wanted else list(DRIVERS)
    reasons = []
    for name in names:
        if module is None and name in _LOADED:
            return _LOADED[name]
        try:
            driver = _load(name, module)
            if module is None:
                _LOADED[name] = driver
            return driver
        except DeviceError as e:
            if len(names) == 1:
                raise
            reasons.append(f"{name}: {e}")
    raise DeviceError("no GPU: " + "; ".join(reasons))
