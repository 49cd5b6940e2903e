"""One GPU opened through a driver backend: its primary context, memory and loaded modules.

A :class:`Device` is shared by every compiled graph that runs on that GPU
(:func:`open_device` keeps one per driver and ordinal). It uses the device's *primary*
context — the one PyTorch, CuPy and JAX use — so device pointers pass freely between them and
polyfuse. It counts what it does (:class:`DeviceStats`): the tests read the counts to show
that buffers and modules are made once, not per call.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from polyfuse.base.errors import CallError, DeviceError

from .driver import Driver, one_line
from .limits import STATIC_SMEM_LIMIT
from .select import select_driver

__all__ = ["Device", "DeviceStats", "Module", "gpu_available", "open_device", "parse_device"]


@dataclass
class DeviceStats:
    """What a :class:`Device` did since it was opened (read by tests and benchmarks)."""

    allocations: int = 0
    frees: int = 0
    live_bytes: int = 0
    modules_loaded: int = 0
    copies_htod: int = 0
    copies_dtoh: int = 0
    launches: int = 0
    graph_captures: int = 0
    graph_launches: int = 0
    per_kernel: dict[str, int] = field(default_factory=dict)


class Binary(Protocol):
    """What the runtime reads of a compiled translation unit
    (:class:`polyfuse.cuda.toolchain.compiler.CudaBinary` has these fields; the runtime compiles
    nothing, so it names no compiler type)."""

    arch: str
    compiler: str
    compiler_version: str
    output: str  # "cubin" or "ptx"
    image: bytes  # what cuModuleLoadData takes
    resources: dict[str, Any]  # kernel name -> its ptxas report


class Module:
    """A translation unit loaded on a device; function handles are looked up once."""

    def __init__(self, device: Device, handle: Any, binary: Binary) -> None:
        self.device = device
        self.handle = handle
        self.binary = binary
        self._functions: dict[str, Any] = {}
        self._smem_allowed: dict[str, int] = {}

    def function(self, name: str) -> Any:
        """The driver's handle of ``__global__`` function ``name``."""
        fn = self._functions.get(name)
        if fn is None:
            try:
                fn = self.device.driver.module_function(self.handle, name)
            except DeviceError:
                known = ", ".join(sorted(self.binary.resources)) or "?"
                raise CallError(
                    f"kernel {name} is not in the loaded module (kernels: {known})"
                ) from None
            self._functions[name] = fn
        return fn

    def allow_dynamic_shared(self, name: str, nbytes: int) -> None:
        """Opt kernel ``name`` in to ``nbytes`` of dynamic shared memory when over the default
        limit (:data:`~polyfuse.cuda.runtime.limits.STATIC_SMEM_LIMIT`, 48 KB), which needs an
        opt-in function attribute."""
        if nbytes <= max(STATIC_SMEM_LIMIT, self._smem_allowed.get(name, 0)):
            return
        try:
            self.device.driver.set_max_dynamic_shared(self.function(name), nbytes)
        except DeviceError as e:
            raise DeviceError(
                f"kernel {name}: cannot allow {nbytes} B of dynamic shared memory on "
                f"{self.device.name} ({self.device.arch}): {e}"
            ) from None
        self._smem_allowed[name] = nbytes


class Device:
    """A CUDA device through a :class:`Driver` (``driver``, else chosen by
    :func:`select_driver` from ``runtime`` / ``$POLYFUSE_CUDA_RUNTIME``).

    Raises :class:`DeviceError` with a one-line reason when there is no usable GPU.
    """

    def __init__(
        self, ordinal: int = 0, *, runtime: str | None = None, driver: Driver | None = None
    ):
        self.driver = driver if driver is not None else select_driver(runtime)
        try:
            count = self.driver.device_count()
        except DeviceError as e:
            raise DeviceError(f"no GPU: cannot count CUDA devices: {e}") from None
        if count == 0:
            raise DeviceError("no CUDA device found")
        if not 0 <= ordinal < count:
            raise DeviceError(f"CUDA device {ordinal} requested but only {count} found")
        self.ordinal = ordinal
        self.name = self.driver.device_name(ordinal)
        major, minor = self.driver.compute_capability(ordinal)
        self.arch = f"sm_{major}{minor}"
        self.context = self.driver.retain_primary_context(ordinal)
        self.stats = DeviceStats()
        self._sizes: dict[int, int] = {}
        self._capture_stream: int | None = None
        self._closed = False
        self.lock = threading.RLock()
        self.activate()

    def __repr__(self) -> str:
        return f"Device(cuda:{self.ordinal}, {self.name!r}, {self.arch}, {self.driver.name})"

    def activate(self) -> None:
        """Make this device's primary context current on the calling thread."""
        if self._closed:
            raise DeviceError(f"{self!r} is closed")
        self.driver.set_current(self.context)

    def close(self) -> None:
        """Release the primary context (modules and buffers of this device become unusable)."""
        if not self._closed:
            self._closed = True
            try:
                if self._capture_stream is not None:
                    self.driver.stream_destroy(self._capture_stream)
                self.driver.release_primary_context(self.ordinal, self.context)
            except Exception:
                pass

    def driver_version(self) -> str:
        v = self.driver.driver_version()
        return f"{v // 1000}.{(v % 1000) // 10}"

    # -- memory ----------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> int:
        """``nbytes`` of device memory (at least 1 byte; 256-byte aligned by the driver)."""
        try:
            ptr = self.driver.mem_alloc(max(int(nbytes), 1))
        except DeviceError as e:
            raise DeviceError(f"cannot allocate {nbytes} B on {self.name}: {e}") from None
        self.stats.allocations += 1
        self.stats.live_bytes += nbytes
        self._sizes[ptr] = nbytes
        return ptr

    def free(self, ptr: int) -> None:
        nbytes = self._sizes.pop(ptr, None)
        if nbytes is None:
            return
        self.stats.frees += 1
        self.stats.live_bytes -= nbytes
        if not self._closed:
            self.driver.mem_free(ptr)

    def capture_stream(self) -> int:
        """A private non-blocking stream that CUDA graphs are captured on (capture is not
        allowed on the legacy default stream; the graph is then launched on any stream)."""
        if self._capture_stream is None:
            self._capture_stream = self.driver.stream_create()
        return self._capture_stream

    # -- modules ---------------------------------------------------------------------------
    def load_binary(self, binary: Binary) -> Module:
        """Load an already compiled translation unit (a cubin or PTX
        :class:`polyfuse.cuda.toolchain.compiler.CudaBinary`; compiling CUDA source for this device
        is
        :func:`polyfuse.runner.load_source`'s)."""
        self.activate()
        try:
            handle = self.driver.module_load(binary.image)
        except DeviceError as e:
            raise DeviceError(
                f"cannot load {binary.output} for {binary.arch} ({binary.compiler} "
                f"{binary.compiler_version}) on {self.name} ({self.arch}, driver "
                f"{self.driver_version()}): {one_line(e)}"
            ) from None
        self.stats.modules_loaded += 1
        return Module(self, handle, binary)


_DEVICES: dict[tuple[str, int], Device] = {}
_DEVICES_LOCK = threading.Lock()


def parse_device(device: str) -> int:
    """The ordinal in ``"cuda"`` (0) or ``"cuda:N"``; CallError for anything else."""
    if device == "cuda":
        return 0
    head, _, tail = device.partition(":")
    if head == "cuda" and tail.isdigit():
        return int(tail)
    raise CallError(f"unknown device '{device}'; use 'emulate', 'cuda' or 'cuda:N'")


def open_device(ordinal: int = 0, runtime: str | None = None) -> Device:
    """The process-wide :class:`Device` for ``ordinal`` through ``runtime`` (default: as
    :func:`select_driver` chooses). Opened on first use, then shared."""
    driver = select_driver(runtime)
    key = (driver.name, ordinal)
    with _DEVICES_LOCK:
        dev = _DEVICES.get(key)
        if dev is None or dev._closed:
            dev = _DEVICES[key] = Device(ordinal, driver=driver)
    return dev


def gpu_available(runtime: str | None = None) -> bool:
    """True when a driver backend imports and at least one CUDA device is present.
    Never raises."""
    try:
        return select_driver(runtime).device_count() > 0
    except Exception:
        return False
