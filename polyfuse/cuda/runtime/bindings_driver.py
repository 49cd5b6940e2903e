"""The :class:`~.driver.Driver` over NVIDIA's ``cuda.bindings.driver`` (cuda-bindings wheels).

Every ``cuda.bindings`` call returns ``(CUresult, *values)``; :meth:`BindingsDriver._call`
checks the result and turns a failure into a one-line :class:`DeviceError` with the call and
the error's name. Kernel parameters are packed once into numpy scalars plus an array of their
addresses (the ``void**`` that ``cuLaunchKernel`` takes), so a launch costs one driver call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from polyfuse.base.errors import DeviceError

from .driver import DRIVERS, PARAM_DTYPES, Driver, ParamKind, one_line

__all__ = ["BindingsDriver", "PackedParams"]


class PackedParams:
    """A launch's kernel parameters: one numpy value per parameter and the ``void**`` array of
    their addresses. Kept alive as long as a launch or a captured graph may read them."""

    __slots__ = ("address", "pointers", "values")

    def __init__(self, params: Sequence[tuple[ParamKind, int | float]]) -> None:
        self.values = [np.array([v], dtype=PARAM_DTYPES[k]) for k, v in params]
        self.pointers = np.array([a.ctypes.data for a in self.values], dtype=np.uint64)
        self.address = int(self.pointers.ctypes.data) if self.values else 0


def _import_bindings() -> Any:
    try:
        from cuda.bindings import driver
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] == "cuda":
            raise DeviceError(
                f"cuda-bindings is not installed ({DRIVERS['cuda-bindings']})"
            ) from None
        raise DeviceError(f"cuda-bindings failed to import: {one_line(e)}") from None
    except (ImportError, OSError) as e:
        raise DeviceError(f"cuda-bindings failed to import: {one_line(e)}") from None
    return driver


class BindingsDriver(Driver):
    """CUDA through ``cuda.bindings.driver``; ``module`` replaces that module (tests)."""

    name = "cuda-bindings"
    foreign_streams = True
    graphs = True
    knows_pointers = True

    def __init__(self, module: Any = None) -> None:
        self.cu = _import_bindings() if module is None else module
        cu = self.cu
        self._success = cu.CUresult.CUDA_SUCCESS
        try:
            (err,) = cu.cuInit(0)
        except Exception as e:  # the driver library itself is missing
            raise DeviceError(
                f"the CUDA driver (libcuda.so.1) could not be loaded: {one_line(e)}"
            ) from None
        if err != self._success:
            if err == cu.CUresult.CUDA_ERROR_NO_DEVICE:
                raise DeviceError("no CUDA device found")
            raise DeviceError(f"cuInit: {self._error_text(err)}")

    # -- result checking -------------------------------------------------------------------
    def _error_text(self, err: Any) -> str:
        name = desc = ""
        try:
            e1, n = self.cu.cuGetErrorName(err)
            name = n.decode() if isinstance(n, bytes) else str(n)
            e2, d = self.cu.cuGetErrorString(err)
            desc = d.decode() if isinstance(d, bytes) else str(d)
        except Exception:
            pass
        return f"{name or err}" + (f" ({desc})" if desc else "")

    def _call(self, what: str, result: tuple) -> Any:
        """Check a ``(CUresult, *values)`` tuple; return the single value, a tuple, or None."""
        err, *values = result
        if err != self._success:
            raise DeviceError(f"{what}: {self._error_text(err)}")
        if not values:
            return None
        return values[0] if len(values) == 1 else tuple(values)

    # -- devices and contexts --------------------------------------------------------------
    def _device(self, ordinal: int) -> Any:
        return self._call("cuDeviceGet", self.cu.cuDeviceGet(ordinal))

    def device_count(self) -> int:
        return int(self._call("cuDeviceGetCount", self.cu.cuDeviceGetCount()))

    def device_name(self, ordinal: int) -> str:
        raw = self._call("cuDeviceGetName", self.cu.cuDeviceGetName(256, self._device(ordinal)))
        raw = bytes(raw) if not isinstance(raw, str) else raw.encode()
        return raw.split(b"\0", 1)[0].decode(errors="replace")

    def compute_capability(self, ordinal: int) -> tuple[int, int]:
        attr = self.cu.CUdevice_attribute
        dev = self._device(ordinal)
        major = self._call(
            "cuDeviceGetAttribute",
            self.cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
        )
        minor = self._call(
            "cuDeviceGetAttribute",
            self.cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
        )
        return int(major), int(minor)

    def driver_version(self) -> int:
        return int(self._call("cuDriverGetVersion", self.cu.cuDriverGetVersion()))

    def retain_primary_context(self, ordinal: int) -> Any:
        return self._call(
            "cuDevicePrimaryCtxRetain", self.cu.cuDevicePrimaryCtxRetain(self._device(ordinal))
        )

    def release_primary_context(self, ordinal: int, context: Any) -> None:
        self._call(
            "cuDevicePrimaryCtxRelease", self.cu.cuDevicePrimaryCtxRelease(self._device(ordinal))
        )

    def set_current(self, context: Any) -> None:
        current = self._call("cuCtxGetCurrent", self.cu.cuCtxGetCurrent())
        if current is None or int(current) != int(context):
            self._call("cuCtxSetCurrent", self.cu.cuCtxSetCurrent(context))

    # -- memory ----------------------------------------------------------------------------
    def mem_alloc(self, nbytes: int) -> int:
        return int(self._call("cuMemAlloc", self.cu.cuMemAlloc(nbytes)))

    def mem_free(self, ptr: int) -> None:
        self._call("cuMemFree", self.cu.cuMemFree(ptr))

    def memcpy_htod(self, dst: int, src: np.ndarray, stream: int) -> None:
        self._call(
            "cuMemcpyHtoDAsync",
            self.cu.cuMemcpyHtoDAsync(dst, src.ctypes.data, src.nbytes, stream),
        )

    def memcpy_dtoh(self, dst: np.ndarray, src: int, stream: int) -> None:
        self._call(
            "cuMemcpyDtoHAsync",
            self.cu.cuMemcpyDtoHAsync(dst.ctypes.data, src, dst.nbytes, stream),
        )

    def memcpy_dtod(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self._call("cuMemcpyDtoDAsync", self.cu.cuMemcpyDtoDAsync(dst, src, nbytes, stream))

    def pointer_device(self, ptr: int) -> int | None:
        attr = self.cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
        err, *value = self.cu.cuPointerGetAttribute(attr, ptr)
        if err != self._success or not value:
            return None
        return int(value[0])

    # -- modules and launches --------------------------------------------------------------
    def module_load(self, image: bytes) -> Any:
        return self._call("cuModuleLoadData", self.cu.cuModuleLoadData(image))

    def module_unload(self, module: Any) -> None:
        self._call("cuModuleUnload", self.cu.cuModuleUnload(module))

    def module_function(self, module: Any, name: str) -> Any:
        return self._call("cuModuleGetFunction", self.cu.cuModuleGetFunction(module, name.encode()))

    def set_max_dynamic_shared(self, function: Any, nbytes: int) -> None:
        attr = self.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        self._call("cuFuncSetAttribute", self.cu.cuFuncSetAttribute(function, attr, nbytes))

    def pack(self, function: Any, params: Sequence[tuple[ParamKind, int | float]]) -> Any:
        return PackedParams(params)

    def launch(
        self,
        function: Any,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared: int,
        stream: int,
        params: Any,
    ) -> None:
        self._call(
            "cuLaunchKernel",
            self.cu.cuLaunchKernel(function, *grid, *block, shared, stream, params.address, 0),
        )

    # -- streams and events ----------------------------------------------------------------
    def stream_create(self) -> int:
        flags = self.cu.CUstream_flags.CU_STREAM_NON_BLOCKING
        return int(self._call("cuStreamCreate", self.cu.cuStreamCreate(flags)))

    def stream_destroy(self, stream: int) -> None:
        self._call("cuStreamDestroy", self.cu.cuStreamDestroy(stream))

    def stream_synchronize(self, stream: int) -> None:
        self._call("cuStreamSynchronize", self.cu.cuStreamSynchronize(stream))

    def event_create(self, timing: bool = False) -> Any:
        flags = self.cu.CUevent_flags
        flag = flags.CU_EVENT_DEFAULT if timing else flags.CU_EVENT_DISABLE_TIMING
        return self._call("cuEventCreate", self.cu.cuEventCreate(flag))

    def event_destroy(self, event: Any) -> None:
        self._call("cuEventDestroy", self.cu.cuEventDestroy(event))

    def event_record(self, event: Any, stream: int) -> None:
        self._call("cuEventRecord", self.cu.cuEventRecord(event, stream))

    def event_synchronize(self, event: Any) -> None:
        self._call("cuEventSynchronize", self.cu.cuEventSynchronize(event))

    def event_elapsed_ms(self, start: Any, end: Any) -> float:
        return float(self._call("cuEventElapsedTime", self.cu.cuEventElapsedTime(start, end)))

    def stream_wait_event(self, stream: int, event: Any) -> None:
        self._call("cuStreamWaitEvent", self.cu.cuStreamWaitEvent(stream, event, 0))

    # -- CUDA graphs -----------------------------------------------------------------------
    def begin_capture(self, stream: int) -> None:
        mode = self.cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        self._call("cuStreamBeginCapture", self.cu.cuStreamBeginCapture(stream, mode))

    def end_capture(self, stream: int) -> Any:
        return self._call("cuStreamEndCapture", self.cu.cuStreamEndCapture(stream))

    def graph_instantiate(self, graph: Any) -> Any:
        return self._call("cuGraphInstantiate", self.cu.cuGraphInstantiate(graph, 0))

    def graph_launch(self, graph_exec: Any, stream: int) -> None:
        self._call("cuGraphLaunch", self.cu.cuGraphLaunch(graph_exec, stream))

    def graph_destroy(self, graph: Any, graph_exec: Any) -> None:
        try:
            if graph_exec is not None:
                self.cu.cuGraphExecDestroy(graph_exec)
            if graph is not None:
                self.cu.cuGraphDestroy(graph)
        except Exception:
            pass
