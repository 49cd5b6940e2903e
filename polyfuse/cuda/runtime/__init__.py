"""polyfuse's GPU runtime: compiled graphs on a real GPU, device-resident and zero-copy.

Layers, each its own module:

* :mod:`.driver` — the :class:`Driver` interface (:mod:`.select` picks one), backends:
  :mod:`.bindings_driver` (NVIDIA's ``cuda-bindings``; foreign streams, CUDA graphs) and
  :mod:`.pycuda_driver` (``pycuda``). ``POLYFUSE_CUDA_RUNTIME=cuda-bindings|pycuda`` chooses;
  otherwise the first available, in that order.
* :mod:`.device` — :class:`Device`: one GPU's primary context (shared with PyTorch, CuPy,
  JAX), memory, modules; :func:`open_device` keeps one per GPU.
* :mod:`.arrays` — call arguments of any framework through ``__cuda_array_interface__`` and
  DLPack; outputs allocated in the caller's framework; :class:`DeviceArray`.
* :mod:`.program` — :class:`DeviceProgram`: a compiled graph's launches bound to a device,
  buffers allocated once, multi-kernel graphs replayed as CUDA graphs.

Nothing here imports a driver library until a device is opened: importing this package never
fails, and :func:`gpu_available` answers without raising.
"""

from .arrays import ArrayInfo, DeviceArray, describe, stream_handle
from .device import Device, DeviceStats, Module, gpu_available, open_device, parse_device
from .driver import DRIVERS, ENV_VAR, Driver
from .program import DeviceProgram, check_launch_shape
from .select import select_driver

__all__ = [
    "DRIVERS",
    "ENV_VAR",
    "ArrayInfo",
    "Device",
    "DeviceArray",
    "DeviceProgram",
    "DeviceStats",
    "Driver",
    "Module",
    "check_launch_shape",
    "describe",
    "gpu_available",
    "open_device",
    "parse_device",
    "select_driver",
    "stream_handle",
]
