"""The one cost model: modelled kernel times from typed kernel descriptions.

- :mod:`.desc` — the input: :class:`KernelDesc` (launch, resources, per-thread instruction
  mix :class:`Mix`, DRAM/L2 bytes, where the mix came from), :class:`LaunchDesc` (a pack);
- :mod:`.model` — the model (:func:`model_kernel`, :func:`model_launch`): the longest of the
  issue, FP32, shared-memory, L1, L2, DRAM and latency times of a launch, never faster than
  the measured peaks (:func:`peak_floor_us`), every figure labelled *modelled*;
- :mod:`.constants` — its constants, each with its source (:data:`CONSTANTS`);
- descriptions made before a kernel exists: :mod:`.gemm` (a GEMM tiling), :mod:`.mma` (a
  tensor-core tiling), :mod:`.stream` (a memory-bound launch shape), with :mod:`.ops` (a
  tensor expression's instructions).

Descriptions of generated kernels — from their SASS, or from their IR when no disassembler is
installed — come from :mod:`polyfuse.cuda.codegen.kernel_cost`. The calibration against measured
H100
times: ``python benchmarks/calibration.py``.
"""

from polyfuse.poly.costs.constants import CONSTANTS, CostConstants
from polyfuse.poly.costs.desc import KernelDesc, LaunchDesc, Mix, Work
from polyfuse.poly.costs.model import (
    BOUNDS,
    Modelled,
    call_us,
    mma_floor_us,
    model_kernel,
    model_launch,
    peak_floor_us,
)

__all__ = [
    "BOUNDS",
    "CONSTANTS",
    "CostConstants",
    "KernelDesc",
    "LaunchDesc",
    "Mix",
    "Modelled",
    "Work",
    "call_us",
    "mma_floor_us",
    "model_kernel",
    "model_launch",
    "peak_floor_us",
]
