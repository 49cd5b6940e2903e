"""Modelled run time of one generated kernel (never a measurement): the cost model's.

The formulas live in one place, :mod:`polyfuse.poly.costs`; a generated kernel is described
from the IR work estimate its facts carry
(:func:`polyfuse.cuda.codegen.kernel_cost.describe_kernel`;
pass the SASS instrument's record for the cubin's instruction mix instead).
"""

from __future__ import annotations

from typing import Any

from polyfuse.cuda.codegen.kernel_ast import Kernel
from polyfuse.cuda.codegen.kernel_cost import kernel_modelled
from polyfuse.poly.device import DeviceSpec


def kernel_us(k: Kernel, device: DeviceSpec, sass: Any = None) -> float:
    """Modelled time (µs) of kernel ``k`` on ``device``, launch overhead included."""
    return kernel_modelled(k, device, sass).us
