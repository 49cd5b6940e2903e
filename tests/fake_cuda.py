"""Fake CUDA driver libraries for testing polyfuse's GPU runtime without a GPU.

:class:`FakeBindings` stands in for ``cuda.bindings.driver`` and :class:`FakePycuda` for
``pycuda.driver``: the same calls, argument conventions and ``(CUresult, value)`` results.
"Device memory" is host memory that the fake allocates, so a device pointer is a real
address; kernels are *run*: a module image is the CUDA source (tests pass it as the binary),
loaded into polyfuse's CPU emulator, and ``cuLaunchKernel`` decodes the ``void**`` parameter
array against the kernel's signature and runs the emulated kernel on views of the fake memory.
So a wrong pointer, a wrong parameter packing or a missing copy gives a wrong number.

Everything the runtime does is recorded in ``calls`` (name and arguments) for the tests to
count: allocations, copies, launches, graph captures and replays.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import ml_dtypes
import numpy as np

from polyfuse.cuda.emulator import Emulator
from polyfuse.cuda.runtime.launch import Launch, ScalarArg

_ERRORS = {
    "CUDA_SUCCESS": 0,
    "CUDA_ERROR_INVALID_VALUE": 1,
    "CUDA_ERROR_OUT_OF_MEMORY": 2,
    "CUDA_ERROR_NO_DEVICE": 100,
    "CUDA_ERROR_INVALID_IMAGE": 200,
    "CUDA_ERROR_INVALID_HANDLE": 400,
    "CUDA_ERROR_NOT_FOUND": 500,
    "CUDA_ERROR_ILLEGAL_ADDRESS": 700,
    "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES": 701,
    "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED": 900,
}
CUresult = SimpleNamespace(**_ERRORS)
_NAMES = {v: k for k, v in _ERRORS.items()}
OK = CUresult.CUDA_SUCCESS
DEFAULT_MS = 0.25  # what a fake event pair measures unless FakeGPU.kernel_ms says otherwise


class _Handle(int):
    """An opaque driver handle (CUcontext, CUmodule, ...); ``int()`` gives its value."""


@dataclass
class FakeModule:
    source: str
    emulated: Any


@dataclass
class FakeFunction:
    module: FakeModule
    name: str
    attributes: dict[int, int] = field(default_factory=dict)


@dataclass
class Recorded:
    """A launch, executed or captured."""

    function: FakeFunction
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    params: list[Any]  # device pointers (int) and numpy scalars


class FakeMemory:
    """Host memory posing as the memory of ``devices`` GPUs."""

    def __init__(self) -> None:
        self.blocks: dict[int, tuple[np.ndarray, int]] = {}  # ptr -> (backing, device)

    def alloc(self, nbytes: int, device: int) -> int:
        raw = np.zeros(nbytes + 256, np.uint8)
        ptr = (raw.ctypes.data + 255) // 256 * 256
        self.blocks[ptr] = (raw, device)
        return ptr

    def free(self, ptr: int) -> bool:
        return self.blocks.pop(ptr, None) is not None

    def find(self, ptr: int) -> tuple[int, int, int] | None:
        """(base, size, device) of the allocation holding ``ptr``."""
        for base, (raw, device) in self.blocks.items():
            size = raw.nbytes - 256
            if base <= ptr < base + max(size, 1):
                return base, size, device
        return None

    def view(self, ptr: int, dtype: Any) -> np.ndarray:
        found = self.find(ptr)
        if found is None:
            raise RuntimeError(f"fake GPU: {ptr:#x} is not device memory (illegal address)")
        base, size, _ = found
        n = (base + size - ptr) // np.dtype(dtype).itemsize
        buf = (ctypes.c_char * (n * np.dtype(dtype).itemsize)).from_address(ptr)
        return np.frombuffer(buf, dtype=dtype)


_KIND_DTYPE = {
    ("f", 2): np.float16,
    ("g", 2): np.dtype(ml_dtypes.bfloat16),
    ("f", 4): np.float32,
    ("f", 8): np.float64,
    ("i", 4): np.int32,
    ("i", 8): np.int64,
    ("u", 4): np.uint32,
    ("u", 8): np.uint64,
}


class FakeGPU:
    """The state behind both fake libraries: devices, memory, modules, streams, graphs."""

    def __init__(self, devices: int = 1, cc: tuple[int, int] = (9, 0)) -> None:
        self.devices = devices
        self.cc = cc
        self.memory = FakeMemory()
        self.calls: list[tuple] = []
        self.current_device = 0
        self.capturing: dict[int, list[Recorded]] = {}
        self.streams: set[int] = set()
        self.next_handle = 0x1000
        self.fail_launch: dict[str, str] = {}  # kernel -> error name
        #: fake event timings: kernel name -> milliseconds of its launches (deterministic);
        #: an event pair around launches of other kernels measures DEFAULT_MS
        self.kernel_ms: dict[str, float] = {}
        #: real module images (cubins) the fake can run: image -> the CUDA source it was
        #: compiled from, which the fake runs in its place (saved artifacts hold cubins)
        self.images: dict[bytes, str] = {}
        #: every image loaded, in order (what the runtime chose to load)
        self.loaded_images: list[bytes] = []
        self.emulator = Emulator()

    def handle(self) -> _Handle:
        self.next_handle += 16
        return _Handle(self.next_handle)

    def count(self, name: str) -> int:
        return sum(1 for c in self.calls if c[0] == name)

    # -- kernels ---------------------------------------------------------------------------
    def load(self, image: bytes) -> FakeModule:
        if isinstance(image, (bytes, bytearray)):
            self.loaded_images.append(bytes(image))
            image = self.images.get(bytes(image), "").encode() or image
        source = image.decode(errors="replace") if isinstance(image, bytes) else str(image)
        if "__global__" not in source:
            raise ValueError("fake GPU: the image is not CUDA source")
        return FakeModule(source, self.emulator.load(source))

    def signature(self, fn: FakeFunction) -> Any:
        return fn.module.emulated.signature(fn.name)

    def run(self, rec: Recorded) -> None:
        """Execute one launch in the emulator on views of the fake memory."""
        self.calls.append(("execute", rec.function.name, rec.params))
        sig = self.signature(rec.function)
        args: list[Any] = []
        buffers: dict[str, np.ndarray] = {}
        for i, ((pointer, kind, size), value) in enumerate(
            zip(sig.params, rec.params, strict=True)
        ):
            if pointer:
                name = f"p{i}"
                buffers[name] = self.memory.view(int(value), _KIND_DTYPE[(kind, size)])
                args.append(name)
            else:
                ctype = {("i", 4): "int", ("i", 8): "long long", ("f", 4): "float"}[(kind, size)]
                args.append(ScalarArg(value.item(), ctype))
        launch = Launch(rec.function.name, rec.grid, rec.block, tuple(args), rec.shared)
        rec.function.module.emulated.run([launch], buffers)

    def decode_params(self, fn: FakeFunction, address: int) -> list[Any]:
        """Read a ``void**`` parameter array as cuLaunchKernel would."""
        out: list[Any] = []
        for i, (pointer, kind, size) in enumerate(self.signature(fn).params):
            slot = ctypes.c_uint64.from_address(address + 8 * i).value
            if pointer:
                out.append(ctypes.c_uint64.from_address(slot).value)
            else:
                raw = ctypes.string_at(slot, size)
                out.append(np.frombuffer(raw, _KIND_DTYPE[(kind, size)])[0])
        return out

    def submit(self, rec: Recorded, stream: int) -> int:
        if rec.function.name in self.fail_launch:
            return _ERRORS[self.fail_launch[rec.function.name]]
        if stream in self.capturing:
            self.calls.append(("capture", rec.function.name, list(rec.params)))
            self.capturing[stream].append(rec)
            return OK
        self.calls.append(("cuLaunchKernel", rec.function.name, list(rec.params), stream))
        self.run(rec)
        return OK


# --------------------------------------------------------------------------------------------
# cuda.bindings.driver
# --------------------------------------------------------------------------------------------


class FakeBindings:
    """Just enough of ``cuda.bindings.driver`` for polyfuse's BindingsDriver."""

    CUresult = CUresult
    CUdevice_attribute = SimpleNamespace(
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR=75,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR=76,
    )
    CUpointer_attribute = SimpleNamespace(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL=9)
    CUfunction_attribute = SimpleNamespace(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8)
    CUstream_flags = SimpleNamespace(CU_STREAM_NON_BLOCKING=1)
    CUevent_flags = SimpleNamespace(CU_EVENT_DEFAULT=0, CU_EVENT_DISABLE_TIMING=2)
    CUstreamCaptureMode = SimpleNamespace(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL=1)

    def __init__(self, gpu: FakeGPU | None = None, *, init_error: str | None = None) -> None:
        self.gpu = gpu or FakeGPU()
        self.init_error = init_error
        self.contexts: dict[int, _Handle] = {}
        self.current: Any = None

    # errors
    def cuGetErrorName(self, err: int):
        return OK, _NAMES.get(err, f"CUDA_ERROR_{err}").encode()

    def cuGetErrorString(self, err: int):
        return OK, b"fake"

    # devices and contexts
    def cuInit(self, flags: int):
        if self.init_error:
            return (_ERRORS[self.init_error],)
        return (OK,)

    def cuDeviceGetCount(self):
        return OK, self.gpu.devices

    def cuDeviceGet(self, ordinal: int):
        if not 0 <= ordinal < self.gpu.devices:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        return OK, ordinal

    def cuDeviceGetName(self, length: int, dev: int):
        return OK, b"Fake GPU\0\0\0"

    def cuDeviceGetAttribute(self, attr: int, dev: int):
        return OK, self.gpu.cc[0 if attr == 75 else 1]

    def cuDriverGetVersion(self):
        return OK, 13000

    def cuDevicePrimaryCtxRetain(self, dev: int):
        ctx = self.contexts.setdefault(dev, self.gpu.handle())
        self.gpu.calls.append(("cuDevicePrimaryCtxRetain", dev))
        return OK, ctx

    def cuDevicePrimaryCtxRelease(self, dev: int):
        self.gpu.calls.append(("cuDevicePrimaryCtxRelease", dev))
        return (OK,)

    def cuCtxGetCurrent(self):
        return OK, self.current

    def cuCtxSetCurrent(self, ctx: Any):
        self.gpu.calls.append(("cuCtxSetCurrent", int(ctx)))
        self.current = ctx
        self.gpu.current_device = next((d for d, c in self.contexts.items() if c == ctx), 0)
        return (OK,)

    # memory
    def cuMemAlloc(self, nbytes: int):
        assert isinstance(nbytes, int) and nbytes > 0
        ptr = self.gpu.memory.alloc(nbytes, self.gpu.current_device)
        self.gpu.calls.append(("cuMemAlloc", nbytes, ptr))
        return OK, ptr

    def cuMemFree(self, ptr: int):
        self.gpu.calls.append(("cuMemFree", ptr))
        ok = self.gpu.memory.free(int(ptr))
        return (OK if ok else CUresult.CUDA_ERROR_INVALID_VALUE,)

    def cuMemcpyHtoDAsync(self, dst: int, src: int, nbytes: int, stream: int):
        assert isinstance(src, int), "host source passed as an address"
        self.gpu.memory.view(dst, np.uint8)  # must be device memory
        self.gpu.calls.append(("htod", dst, nbytes, int(stream)))
        ctypes.memmove(dst, src, nbytes)
        return (OK,)

    def cuMemcpyDtoHAsync(self, dst: int, src: int, nbytes: int, stream: int):
        self.gpu.memory.view(src, np.uint8)
        self.gpu.calls.append(("dtoh", src, nbytes, int(stream)))
        ctypes.memmove(dst, src, nbytes)
        return (OK,)

    def cuMemcpyDtoDAsync(self, dst: int, src: int, nbytes: int, stream: int):
        self.gpu.calls.append(("dtod", dst, src, nbytes))
        ctypes.memmove(dst, src, nbytes)
        return (OK,)

    def cuPointerGetAttribute(self, attr: int, ptr: int):
        found = self.gpu.memory.find(int(ptr))
        if found is None:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        return OK, found[2]

    # modules and launches
    def cuModuleLoadData(self, image: bytes):
        self.gpu.calls.append(("cuModuleLoadData",))
        try:
            return OK, self.gpu.load(image)
        except ValueError:
            return CUresult.CUDA_ERROR_INVALID_IMAGE, None

    def cuModuleUnload(self, module: Any):
        return (OK,)

    def cuModuleGetFunction(self, module: FakeModule, name: bytes):
        assert isinstance(name, bytes)
        if name.decode() not in module.emulated.kernel_names:
            return CUresult.CUDA_ERROR_NOT_FOUND, None
        self.gpu.calls.append(("cuModuleGetFunction", name.decode()))
        return OK, FakeFunction(module, name.decode())

    def cuFuncSetAttribute(self, fn: FakeFunction, attr: int, value: int):
        self.gpu.calls.append(("cuFuncSetAttribute", fn.name, attr, value))
        fn.attributes[attr] = value
        return (OK,)

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        assert isinstance(params, int) and extra == 0
        if shared > 48 * 1024 and fn.attributes.get(8, 0) < shared:
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        rec = Recorded(fn, (gx, gy, gz), (bx, by, bz), shared, self.gpu.decode_params(fn, params))
        return (self.gpu.submit(rec, int(stream)),)

    # streams and events
    def cuStreamCreate(self, flags: int):
        h = self.gpu.handle()
        self.gpu.streams.add(int(h))
        return OK, h

    def cuStreamDestroy(self, stream: int):
        self.gpu.streams.discard(int(stream))
        return (OK,)

    def cuStreamSynchronize(self, stream: int):
        self.gpu.calls.append(("sync", int(stream)))
        return (OK,)

    def cuEventCreate(self, flags: int):
        return OK, SimpleNamespace(flags=flags, stream=None)

    def cuEventDestroy(self, event: Any):
        return (OK,)

    def cuEventRecord(self, event: Any, stream: int):
        self.gpu.calls.append(("cuEventRecord", int(stream)))
        event.stream = int(stream)
        return (OK,)

    def cuEventSynchronize(self, event: Any):
        return (OK,)

    def cuEventElapsedTime(self, start: Any, end: Any):
        launched = [c[1] for c in self.gpu.calls if c[0] == "cuLaunchKernel"]
        return OK, self.gpu.kernel_ms.get(launched[-1], DEFAULT_MS) if launched else DEFAULT_MS

    def cuStreamWaitEvent(self, stream: int, event: Any, flags: int):
        self.gpu.calls.append(("cuStreamWaitEvent", int(stream), event.stream))
        return (OK,)

    # graphs
    def cuStreamBeginCapture(self, stream: int, mode: int):
        if int(stream) == 0:
            return (CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,)
        self.gpu.capturing[int(stream)] = []
        return (OK,)

    def cuStreamEndCapture(self, stream: int):
        launches = self.gpu.capturing.pop(int(stream))
        self.gpu.calls.append(("cuStreamEndCapture", len(launches)))
        return OK, SimpleNamespace(launches=launches)

    def cuGraphInstantiate(self, graph: Any, flags: int):
        return OK, SimpleNamespace(launches=list(graph.launches))

    def cuGraphLaunch(self, graph_exec: Any, stream: int):
        self.gpu.calls.append(("cuGraphLaunch", int(stream)))
        for rec in graph_exec.launches:
            self.gpu.run(rec)
        return (OK,)

    def cuGraphExecDestroy(self, graph_exec: Any):
        return (OK,)

    def cuGraphDestroy(self, graph: Any):
        return (OK,)


# --------------------------------------------------------------------------------------------
# pycuda.driver
# --------------------------------------------------------------------------------------------


class FakePycuda:
    """Just enough of ``pycuda.driver`` for polyfuse's PycudaDriver (same fake memory)."""

    function_attribute = SimpleNamespace(MAX_DYNAMIC_SHARED_SIZE_BYTES=8)
    event_flags = SimpleNamespace(DISABLE_TIMING=2)

    def __init__(self, gpu: FakeGPU | None = None) -> None:
        self.gpu = gpu or FakeGPU()
        gpu = self.gpu
        outer = self

        class Device:
            @staticmethod
            def count() -> int:
                return gpu.devices

            def __init__(self, ordinal: int) -> None:
                self.ordinal = ordinal

            def name(self) -> str:
                return "Fake GPU"

            def compute_capability(self) -> tuple[int, int]:
                return gpu.cc

            def retain_primary_context(self):
                return SimpleNamespace(
                    push=lambda: gpu.calls.append(("push",)),
                    detach=lambda: gpu.calls.append(("detach",)),
                )

        class Context:
            @staticmethod
            def pop() -> None:
                gpu.calls.append(("pop",))

            @staticmethod
            def synchronize() -> None:
                gpu.calls.append(("sync", 0))

        class Allocation:
            def __init__(self, nbytes: int) -> None:
                self.ptr = gpu.memory.alloc(nbytes, 0)
                gpu.calls.append(("cuMemAlloc", nbytes, self.ptr))

            def __int__(self) -> int:
                return self.ptr

            def free(self) -> None:
                gpu.calls.append(("cuMemFree", self.ptr))
                gpu.memory.free(self.ptr)

        class Stream:
            def __init__(self) -> None:
                self.handle = int(gpu.handle())

            def synchronize(self) -> None:
                gpu.calls.append(("sync", self.handle))

            def wait_for_event(self, event) -> None:
                gpu.calls.append(("cuStreamWaitEvent", self.handle, None))

        class Event:
            def __init__(self, flags: int = 0) -> None:
                self.flags = flags

            def record(self, stream=None) -> None:
                pass

            def synchronize(self) -> None:
                pass

            def time_till(self, other) -> float:
                return 0.25

        class Function:
            def __init__(self, module: FakeModule, name: str) -> None:
                self.fn = FakeFunction(module, name)
                self.format: str | None = None

            def prepare(self, fmt: str) -> None:
                self.format = fmt

            def set_attribute(self, attr: int, value: int) -> None:
                gpu.calls.append(("cuFuncSetAttribute", self.fn.name, attr, value))

            def prepared_async_call(self, grid, block, stream, *args, shared_size=0) -> None:
                assert self.format is not None and len(self.format) == len(args)
                for ch, a in zip(self.format, args, strict=True):
                    expected = {"P": np.uint64, "i": np.int32, "q": np.int64, "f": np.float32}
                    assert type(a) is expected[ch], (ch, type(a))
                params = [
                    int(a) if ch == "P" else a for ch, a in zip(self.format, args, strict=True)
                ]
                handle = 0 if stream is None else stream.handle
                gpu.submit(
                    Recorded(self.fn, tuple(grid), tuple(block), shared_size, params), handle
                )

        self.Device, self.Context, self.Stream, self.Event = Device, Context, Stream, Event
        self._Allocation, self._Function = Allocation, Function
        self._outer = outer

    def init(self) -> None:
        self.gpu.calls.append(("init",))

    def get_driver_version(self) -> int:
        return 13000

    def mem_alloc(self, nbytes: int):
        return self._Allocation(nbytes)

    def memcpy_htod_async(self, dst: int, src: np.ndarray, stream=None) -> None:
        self.gpu.calls.append(("htod", int(dst), src.nbytes, 0))
        ctypes.memmove(int(dst), src.ctypes.data, src.nbytes)

    def memcpy_dtoh_async(self, dst: np.ndarray, src: int, stream=None) -> None:
        self.gpu.calls.append(("dtoh", int(src), dst.nbytes, 0))
        ctypes.memmove(dst.ctypes.data, int(src), dst.nbytes)

    def memcpy_dtod_async(self, dst: int, src: int, nbytes: int, stream=None) -> None:
        ctypes.memmove(int(dst), int(src), nbytes)

    def module_from_buffer(self, image: bytes):
        module = self.gpu.load(image)
        outer = self

        def get_function(name: str):
            if name not in module.emulated.kernel_names:
                raise RuntimeError("cuModuleGetFunction failed: named symbol not found")
            return outer._Function(module, name)

        self.gpu.calls.append(("cuModuleLoadData",))
        return SimpleNamespace(get_function=get_function)


class FakeDeviceArray:
    """A framework's device array in the fake GPU's memory: ``__cuda_array_interface__`` v3,
    and optionally ``__dlpack_device__`` (which says its device, as torch and CuPy do)."""

    def __init__(
        self,
        gpu: FakeGPU,
        values: np.ndarray,
        device: int = 0,
        strides=None,
        dlpack_device: bool = True,
    ) -> None:
        values = np.ascontiguousarray(values)
        self.gpu = gpu
        self.shape = values.shape
        self.dtype = values.dtype
        self.ptr = gpu.memory.alloc(max(values.nbytes, 1), device)
        self.device = device
        self.strides = strides
        self.view()[...] = values.reshape(-1)
        if not dlpack_device:
            self.__dlpack_device__ = None  # type: ignore[assignment]

    def view(self) -> np.ndarray:
        return self.gpu.memory.view(self.ptr, self.dtype)[: int(np.prod(self.shape))]

    def numpy(self) -> np.ndarray:
        return self.view().reshape(self.shape).copy()

    @property
    def __cuda_array_interface__(self) -> dict:
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "strides": self.strides,
            "version": 3,
            "stream": 1,
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self.device)
