"""Run compiled kernels on a real GPU through pycuda.

pycuda is an optional extra (``pip install 'polyfuse[cuda]'``) that only builds where a CUDA
driver and toolkit exist, so it is imported lazily: importing this module never fails, and
:func:`gpu_available` answers without raising. Kernels are compiled by
:func:`polyfuse.cuda.compiler.compile_cuda` (NVRTC first) to a cubin for the device's own
architecture and loaded with ``pycuda.driver.module_from_buffer``, so the GPU runs exactly the
binary whose ptxas report the compile step returned.

Argument marshalling is shared with the CPU emulator: :func:`device_arguments` resolves every
launch through :func:`polyfuse.cuda.launch.marshal` and maps buffer arguments to device
allocations through a callback, which is all that is device-specific (and what the tests fake).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from polyfuse.errors import CallError, DeviceError, PolyfuseError

from .compiler import CudaBinary, compile_cuda
from .launch import Launch, ScalarArg, marshal

__all__ = [
    "CudaModule",
    "CudaRuntime",
    "DeviceArguments",
    "device_arguments",
    "gpu_available",
]

#: Dynamic shared memory above this needs an opt-in function attribute.
DEFAULT_DYNAMIC_SMEM_LIMIT = 48 * 1024

_PYCUDA_HINT = "pip install 'polyfuse[cuda]'"

T = TypeVar("T")


# --------------------------------------------------------------------------------------------
# Device-independent marshalling
# --------------------------------------------------------------------------------------------


@dataclass
class DeviceArguments:
    """The device view of a sequence of launches.

    ``allocations`` maps each buffer name used by any launch to what the allocator returned for
    it (one allocation per name, shared by all launches, in order of first use);
    ``args[i]`` lists launch ``i``'s kernel parameters in order: allocations for buffers, sized
    numpy scalars (``np.int32``/``np.int64``/``np.float32``) for :class:`ScalarArg`.
    """

    allocations: dict[str, Any] = field(default_factory=dict)
    args: list[list[Any]] = field(default_factory=list)


def device_arguments(
    launches: list[Launch],
    buffers: dict[str, np.ndarray],
    alloc: Callable[[str, np.ndarray], T],
) -> DeviceArguments:
    """Resolve every launch's arguments, allocating each buffer once through ``alloc``.

    All launches are validated (via :func:`marshal`) before the first allocation, so a bad
    argument list raises :class:`CallError` without touching the device. ``alloc(name, array)``
    is called once per distinct buffer name, in order of first use, and its result is what the
    kernel receives for that buffer.
    """
    resolved = []
    for launch in launches:
        values = marshal(launch, buffers)
        if len(values) != len(launch.args):
            raise CallError(f"kernel {launch.kernel}: marshalled {len(values)} arguments")
        resolved.append((launch, values))
    out = DeviceArguments()
    for launch, values in resolved:
        params: list[Any] = []
        for arg, value in zip(launch.args, values, strict=True):
            if isinstance(arg, ScalarArg):
                params.append(value)
                continue
            if arg not in out.allocations:
                out.allocations[arg] = alloc(arg, value)  # type: ignore[arg-type]
            params.append(out.allocations[arg])
        out.args.append(params)
    return out


def _check_launch_shape(launch: Launch) -> None:
    """Reject launch geometries no CUDA device accepts, with the kernel's name."""
    threads = launch.block[0] * launch.block[1] * launch.block[2]
    if min(launch.block) < 1 or min(launch.grid) < 1:
        raise CallError(f"kernel {launch.kernel}: grid {launch.grid} / block {launch.block} empty")
    if threads > 1024:
        raise CallError(
            f"kernel {launch.kernel}: block {launch.block} has {threads} threads (max 1024)"
        )
    if launch.shared_bytes < 0:
        raise CallError(f"kernel {launch.kernel}: negative dynamic shared memory")


# --------------------------------------------------------------------------------------------
# pycuda
# --------------------------------------------------------------------------------------------


def _one_line(e: BaseException) -> str:
    """An exception's first line (driver messages can span several)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _import_driver() -> Any:
    """Import ``pycuda.driver``; raise :class:`DeviceError` with the reason it is unusable."""
    try:
        import pycuda.driver as drv
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] == "pycuda":
            raise DeviceError(f"no GPU: pycuda is not installed ({_PYCUDA_HINT})") from None
        raise DeviceError(f"no GPU: pycuda failed to import: {_one_line(e)}") from None
    except (ImportError, OSError) as e:
        raise DeviceError(
            f"no GPU: pycuda could not load the CUDA driver (libcuda.so.1): {_one_line(e)}"
        ) from None
    return drv


def _init_driver(drv: Any) -> Any:
    """``cuInit`` through ``drv``; a machine without devices gives "no CUDA device found"."""
    try:
        drv.init()
    except Exception as e:  # pycuda.driver.Error and friends
        text = _one_line(e)
        if "no CUDA-capable device" in text or "NO_DEVICE" in text:
            raise DeviceError("no CUDA device found") from None
        raise DeviceError(f"no GPU: the CUDA driver failed to initialise: {text}") from None
    return drv


def gpu_available() -> bool:
    """True when pycuda imports and at least one CUDA device is present. Never raises."""
    try:
        drv = _init_driver(_import_driver())
        return drv.Device.count() > 0
    except Exception:
        return False


class CudaRuntime:
    """A CUDA device (its primary context) that loads polyfuse translation units.

    Raises :class:`DeviceError` with a one-line reason when there is no usable GPU.
    Use as a context manager, or call :meth:`close`, to release the context.
    """

    def __init__(self, device: int = 0, *, driver: Any = None) -> None:
        """Open ``device``. ``driver`` replaces ``pycuda.driver`` (tests pass a fake one)."""
        drv = _init_driver(_import_driver() if driver is None else driver)
        try:
            count = drv.Device.count()
        except Exception as e:
            raise DeviceError(f"no GPU: cannot count CUDA devices: {_one_line(e)}") from None
        if count == 0:
            raise DeviceError("no CUDA device found")
        if not 0 <= device < count:
            raise DeviceError(f"CUDA device {device} requested but only {count} found")
        self.drv = drv
        self.device_index = device
        self.device = drv.Device(device)
        self.name: str = self.device.name()
        major, minor = self.device.compute_capability()
        self.arch = f"sm_{major}{minor}"
        self.context = self.device.retain_primary_context()
        self._closed = False

    def __repr__(self) -> str:
        return f"CudaRuntime(device={self.device_index}, {self.name!r}, {self.arch})"

    def __enter__(self) -> CudaRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the primary context (modules loaded from this runtime become unusable)."""
        if not self._closed:
            self._closed = True
            try:
                self.context.detach()
            except Exception:
                pass

    def push(self) -> None:
        """Make this device's context current on the calling thread."""
        if self._closed:
            raise DeviceError(f"{self!r} is closed")
        self.context.push()

    def pop(self) -> None:
        self.drv.Context.pop()

    def driver_version(self) -> str:
        v = self.drv.get_driver_version()
        return f"{v // 1000}.{(v % 1000) // 10}"

    def load(self, source: str, arch: str | None = None, **compile_options: Any) -> CudaModule:
        """Compile ``source`` to a cubin (for the device's own arch by default) and load it.

        ``compile_options`` go to :func:`compile_cuda` (``compiler=``, ``options=``).
        """
        binary = compile_cuda(source, arch or self.arch, output="cubin", **compile_options)
        return self.load_binary(binary)

    def load_binary(self, binary: CudaBinary) -> CudaModule:
        """Load an already compiled :class:`CudaBinary` (cubin or PTX)."""
        self.push()
        try:
            module = self.drv.module_from_buffer(binary.image)
        except Exception as e:
            raise DeviceError(
                f"cannot load {binary.output} for {binary.arch} ({binary.compiler} "
                f"{binary.compiler_version}) on {self.name} ({self.arch}, driver "
                f"{self.driver_version()}): {_one_line(e)}"
            ) from None
        finally:
            self.pop()
        return CudaModule(self, module, binary)


class CudaModule:
    """A loaded translation unit; :meth:`run` executes a list of launches on numpy buffers."""

    def __init__(self, runtime: CudaRuntime, module: Any, binary: CudaBinary) -> None:
        self.runtime = runtime
        self.module = module
        self.binary = binary
        self._functions: dict[str, Any] = {}

    def function(self, name: str) -> Any:
        """The pycuda function handle of a ``__global__`` (``extern "C"``) kernel."""
        if name not in self._functions:
            try:
                self._functions[name] = self.module.get_function(name)
            except Exception:
                known = ", ".join(sorted(self.binary.resources)) or "?"
                raise CallError(
                    f"kernel {name} is not in the loaded module (kernels: {known})"
                ) from None
        return self._functions[name]

    def _allow_dynamic_smem(self, launch: Launch) -> None:
        """Opt a kernel in to more than 48 KB of dynamic shared memory."""
        drv = self.runtime.drv
        fn = self.function(launch.kernel)
        try:
            attr = drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES
            fn.set_attribute(attr, launch.shared_bytes)
        except Exception as e:
            raise DeviceError(
                f"kernel {launch.kernel}: cannot allow {launch.shared_bytes} B of dynamic shared "
                f"memory on {self.runtime.name} ({self.runtime.arch}): {_one_line(e)}"
            ) from None

    def run(
        self,
        launches: list[Launch],
        buffers: dict[str, np.ndarray],
        timing: bool = False,
    ) -> list[float] | None:
        """Run ``launches`` in order on ``buffers``; copy every used buffer back in place.

        Each buffer named by a launch is copied to the device once, all launches run in order
        on the default stream with their recorded grid, block and dynamic shared memory, and
        the buffers are copied back into the same numpy arrays. With ``timing=True`` returns
        each launch's milliseconds measured with CUDA events.
        """
        drv = self.runtime.drv
        for launch in launches:
            _check_launch_shape(launch)
        self.runtime.push()
        allocations: dict[str, Any] = {}
        try:

            def alloc(name: str, array: np.ndarray) -> Any:
                mem = drv.mem_alloc(max(array.nbytes, 1))
                allocations[name] = mem
                if array.nbytes:
                    drv.memcpy_htod(mem, array)
                return mem

            # Everything that can fail without touching device memory comes first.
            functions = [self.function(launch.kernel) for launch in launches]
            for launch in launches:
                if launch.shared_bytes > DEFAULT_DYNAMIC_SMEM_LIMIT:
                    self._allow_dynamic_smem(launch)
            plan = device_arguments(launches, buffers, alloc)
            times: list[float] = []
            for launch, fn, params in zip(launches, functions, plan.args, strict=True):
                start = end = None
                if timing:
                    start, end = drv.Event(), drv.Event()
                    start.record()
                try:
                    fn(
                        *params,
                        grid=tuple(launch.grid),
                        block=tuple(launch.block),
                        shared=launch.shared_bytes,
                    )
                except PolyfuseError:
                    raise
                except Exception as e:
                    raise DeviceError(f"launch {launch} failed: {_one_line(e)}") from None
                if timing:
                    end.record()
                    end.synchronize()
                    times.append(start.time_till(end))
            try:
                drv.Context.synchronize()
            except Exception as e:
                names = ", ".join(launch.kernel for launch in launches)
                raise DeviceError(f"kernel execution failed ({names}): {_one_line(e)}") from None
            for name, mem in plan.allocations.items():
                if buffers[name].nbytes:
                    drv.memcpy_dtoh(buffers[name], mem)
            return times if timing else None
        finally:
            for mem in allocations.values():
                try:
                    mem.free()
                except Exception:
                    pass
            self.runtime.pop()
