"""The :class:`~.driver.Driver` over ``pycuda.driver`` (the ``[cuda]`` extra).

pycuda wraps streams, events and allocations in objects of its own, so this backend keeps a
table from the ``int`` handles the runtime uses to those objects. It launches only on streams
it created (or the default stream, handle 0): pycuda cannot wrap a stream handle that PyTorch
or CuPy created, and it does not capture CUDA graphs — the runtime then launches directly.
Kernels are launched as pycuda *prepared* calls (the argument format is fixed once).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from polyfuse.base.errors import DeviceError

from .driver import DRIVERS, PARAM_DTYPES, Driver, ParamKind, one_line

__all__ = ["PycudaDriver"]

#: ``struct`` format character of each parameter kind (pycuda's ``Function.prepare``).
_FORMAT = {"ptr": "P", "int": "i", "long long": "q", "float": "f"}


def _import_pycuda() -> Any:
    try:
        import pycuda.driver as drv
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] == "pycuda":
            raise DeviceError(f"pycuda is not installed ({DRIVERS['pycuda']})") from None
        raise DeviceError(f"pycuda failed to import: {one_line(e)}") from None
    except (ImportError, OSError) as e:
        raise DeviceError(
            f"pycuda could not load the CUDA driver (libcuda.so.1): {one_line(e)}"
        ) from None
    return drv


class PycudaDriver(Driver):
    """CUDA through ``pycuda.driver``; ``module`` replaces that module (tests)."""

    name = "pycuda"
    foreign_streams = False
    graphs = False

    def __init__(self, module: Any = None) -> None:
        self.drv = _import_pycuda() if module is None else module
        try:
            self.drv.init()
        except Exception as e:  # pycuda.driver.Error and friends
            text = one_line(e)
            if "no CUDA-capable device" in text or "NO_DEVICE" in text:
                raise DeviceError("no CUDA device found") from None
            raise DeviceError(f"cuInit: {text}") from None
        self._allocations: dict[int, Any] = {}
        self._streams: dict[int, Any] = {}
        self._pushed: Any = None

    def owns_stream(self, stream: int) -> bool:
        return stream == 0 or stream in self._streams

    def _wrap(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except DeviceError:
            raise
        except Exception as e:
            raise DeviceError(f"{what}: {one_line(e)}") from None

    def _stream(self, handle: int) -> Any:
        if handle == 0:
            return None
        try:
            return self._streams[handle]
        except KeyError:
            raise DeviceError(
                f"the pycuda runtime cannot launch on stream {handle:#x}, which it did not "
                "create; use POLYFUSE_CUDA_RUNTIME=cuda-bindings for framework streams"
            ) from None

    # -- devices and contexts --------------------------------------------------------------
    def device_count(self) -> int:
        return int(self._wrap("cuDeviceGetCount", self.drv.Device.count))

    def device_name(self, ordinal: int) -> str:
        return str(self._wrap("cuDeviceGetName", lambda: self.drv.Device(ordinal).name()))

    def compute_capability(self, ordinal: int) -> tuple[int, int]:
        major, minor = self._wrap(
            "cuDeviceGetAttribute", lambda: self.drv.Device(ordinal).compute_capability()
        )
        return int(major), int(minor)

    def driver_version(self) -> int:
        return int(self._wrap("cuDriverGetVersion", self.drv.get_driver_version))

    def retain_primary_context(self, ordinal: int) -> Any:
        return self._wrap(
            "cuDevicePrimaryCtxRetain", lambda: self.drv.Device(ordinal).retain_primary_context()
        )

    def release_primary_context(self, ordinal: int, context: Any) -> None:
        if self._pushed is context:
            self._wrap("cuCtxPopCurrent", self.drv.Context.pop)
            self._pushed = None
        self._wrap("cuDevicePrimaryCtxRelease", context.detach)

    def set_current(self, context: Any) -> None:
        # pycuda's contexts are a per-thread stack: push ours once and leave it there.
        if self._pushed is not context:
            self._wrap("cuCtxPushCurrent", context.push)
            self._pushed = context

    # -- memory ----------------------------------------------------------------------------
    def mem_alloc(self, nbytes: int) -> int:
        mem = self._wrap("cuMemAlloc", self.drv.mem_alloc, nbytes)
        ptr = int(mem)
        self._allocations[ptr] = mem
        return ptr

    def mem_free(self, ptr: int) -> None:
        mem = self._allocations.pop(ptr, None)
        if mem is not None:
            self._wrap("cuMemFree", mem.free)

    def memcpy_htod(self, dst: int, src: np.ndarray, stream: int) -> None:
        self._wrap("cuMemcpyHtoDAsync", self.drv.memcpy_htod_async, dst, src, self._stream(stream))

    def memcpy_dtoh(self, dst: np.ndarray, src: int, stream: int) -> None:
        self._wrap("cuMemcpyDtoHAsync", self.drv.memcpy_dtoh_async, dst, src, self._stream(stream))

    def memcpy_dtod(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self._wrap(
            "cuMemcpyDtoDAsync", self.drv.memcpy_dtod_async, dst, src, nbytes, self._stream(stream)
        )

    # -- modules and launches --------------------------------------------------------------
    def module_load(self, image: bytes) -> Any:
        return self._wrap("cuModuleLoadData", self.drv.module_from_buffer, image)

    def module_unload(self, module: Any) -> None:
        pass  # pycuda unloads a module when its object is collected

    def module_function(self, module: Any, name: str) -> Any:
        return self._wrap("cuModuleGetFunction", module.get_function, name)

    def set_max_dynamic_shared(self, function: Any, nbytes: int) -> None:
        attr = self.drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES
        self._wrap("cuFuncSetAttribute", function.set_attribute, attr, nbytes)

    def pack(self, function: Any, params: Sequence[tuple[ParamKind, int | float]]) -> Any:
        fmt = "".join(_FORMAT[k] for k, _ in params)
        if getattr(function, "_polyfuse_format", None) != fmt:
            self._wrap("prepare", function.prepare, fmt)
            function._polyfuse_format = fmt
        return [PARAM_DTYPES[k](v) for k, v in params]

    def launch(
        self,
        function: Any,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared: int,
        stream: int,
        params: Any,
    ) -> None:
        self._wrap(
            "cuLaunchKernel",
            function.prepared_async_call,
            grid,
            block,
            self._stream(stream),
            *params,
            shared_size=shared,
        )

    # -- streams and events ----------------------------------------------------------------
    def stream_create(self) -> int:
        s = self._wrap("cuStreamCreate", self.drv.Stream)
        handle = int(s.handle)
        self._streams[handle] = s
        return handle

    def stream_destroy(self, stream: int) -> None:
        self._streams.pop(stream, None)

    def stream_synchronize(self, stream: int) -> None:
        s = self._stream(stream)
        self._wrap(
            "cuStreamSynchronize", self.drv.Context.synchronize if s is None else s.synchronize
        )

    def event_create(self, timing: bool = False) -> Any:
        flags = 0 if timing else self.drv.event_flags.DISABLE_TIMING
        return self._wrap("cuEventCreate", self.drv.Event, flags)

    def event_destroy(self, event: Any) -> None:
        pass

    def event_record(self, event: Any, stream: int) -> None:
        self._wrap("cuEventRecord", event.record, self._stream(stream))

    def event_synchronize(self, event: Any) -> None:
        self._wrap("cuEventSynchronize", event.synchronize)

    def event_elapsed_ms(self, start: Any, end: Any) -> float:
        return float(self._wrap("cuEventElapsedTime", start.time_till, end))

    def stream_wait_event(self, stream: int, event: Any) -> None:
        s = self._stream(stream)
        if s is None:
            self._wrap("cuEventSynchronize", event.synchronize)
        else:
            self._wrap("cuStreamWaitEvent", s.wait_for_event, event)
