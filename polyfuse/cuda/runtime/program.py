"""A compiled graph bound to one GPU: module loaded once, buffers kept, launches replayed.

:class:`DeviceProgram` is what ``CompiledGraph(..., device="cuda")`` runs. At construction it
loads the module (cubin for the device's arch), looks up every function, uploads the
constants (weights) and allocates every intermediate buffer — once. A call then

1. classifies the arguments (:mod:`.arrays`): all numpy → *host mode* (inputs copied into
   device buffers kept for the purpose, outputs copied back into numpy arrays); all device
   arrays on this GPU → *device mode* (inputs read in place, outputs allocated in the caller's
   framework or written into ``out=`` arrays: no copies at all);
2. orders the work on ``stream`` (default: the caller's framework's current stream) after the
   producers' streams and after this program's previous call on another stream;
3. launches the kernels — for two or more kernels as a CUDA graph, captured the second time a
   set of buffer addresses is seen and replayed from then on (the graph holds the addresses,
   so a new set of addresses is a new graph; a few are kept, least recently used dropped).

Mismatched arguments are :class:`CallError`\\ s naming the tensor; driver failures are
:class:`DeviceError`\\ s naming the kernel. A program serves one call at a time (its
intermediate buffers are shared between calls); calls on different streams are ordered.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from polyfuse.base.errors import CallError, DeviceError

from .arrays import (
    ArrayInfo,
    DeviceArray,
    default_stream,
    describe,
    empty_like_framework,
    finish_output,
    stream_handle,
)
from .device import Device, Module
from .launch import Launch, ScalarArg
from .limits import MAX_THREADS_PER_BLOCK

#: Byte alignment every device array must have: the generated kernels may access global
#: memory with 128-bit (float4) loads and stores (polyfuse.cuda.codegen.lower_vectorize), which
#: isl proved aligned relative to the buffer's start.
VECTOR_ALIGN = 16

__all__ = ["Buffer", "DeviceProgram", "check_launch_shape"]

#: Distinct buffer-address sets whose packed parameters / CUDA graphs are kept.
CACHED_ADDRESS_SETS = 8
#: ``POLYFUSE_CUDA_SYNC=1``: synchronise after every launch (names the failing kernel).
SYNC_ENV = "POLYFUSE_CUDA_SYNC"


def _numpy_dtype(name: str) -> np.dtype:
    """A buffer's numpy dtype; bfloat16 is registered with numpy by ml_dtypes."""
    if name == "bfloat16":
        import ml_dtypes  # noqa: F401  (registers the dtype name)
    return np.dtype(name)


class Buffer(Protocol):
    """A global buffer of the graph (``polyfuse.compiled.BufferSpec`` has these fields)."""

    name: str
    shape: tuple[int, ...]
    role: str  # "input" | "output" | "intermediate"
    dtype: str


def check_launch_shape(launch: Launch) -> None:
    """Reject launch geometries no CUDA device accepts, with the kernel's name."""
    threads = launch.block[0] * launch.block[1] * launch.block[2]
    if min(launch.block) < 1 or min(launch.grid) < 1:
        raise CallError(f"kernel {launch.kernel}: grid {launch.grid} / block {launch.block} empty")
    if threads > MAX_THREADS_PER_BLOCK:
        raise CallError(
            f"kernel {launch.kernel}: block {launch.block} has {threads} threads "
            f"(max {MAX_THREADS_PER_BLOCK})"
        )
    if launch.shared_bytes < 0:
        raise CallError(f"kernel {launch.kernel}: negative dynamic shared memory")


class DeviceProgram:
    """The launches of one compiled graph, ready to run on ``device``.

    ``buffers``: every global buffer (inputs in call order among them); ``inputs`` and
    ``outputs``: buffer names in call and return order; ``constants``: buffer name → array,
    uploaded once; ``labels``: buffer name → the name users know (for messages);
    ``graphs``: capture multi-kernel launches as CUDA graphs where the driver can.
    """

    def __init__(
        self,
        device: Device,
        module: Module,
        launches: Sequence[Launch],
        buffers: Sequence[Buffer],
        inputs: Sequence[str],
        outputs: Sequence[str],
        constants: Mapping[str, np.ndarray] | None = None,
        labels: Mapping[str, str] | None = None,
        *,
        graphs: bool = True,
        name: str = "graph",
    ) -> None:
        self.device = device
        self.module = module
        self.launches = list(launches)
        self.name = name
        self.specs = {b.name: b for b in buffers}
        self._shapes = {b.name: tuple(b.shape) for b in buffers}
        self._dtypes = {
            b.name: _numpy_dtype(getattr(b, "dtype", "float32") or "float32") for b in buffers
        }
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self._io = [*self.inputs, *self.outputs]
        self.labels = dict(labels or {})
        self.graphs = graphs and device.driver.graphs and len(self.launches) >= 2
        self.graph_note = ""
        self.sync_each = os.environ.get(SYNC_ENV, "") not in ("", "0")
        constants = dict(constants or {})
        for launch in self.launches:
            check_launch_shape(launch)
            for a in launch.args:
                if isinstance(a, str) and a not in self.specs:
                    raise CallError(f"kernel {launch.kernel}: no buffer named '{a}'")
        # Everything that can fail without touching device memory comes first.
        self._functions = [module.function(launch.entry) for launch in self.launches]
        smem: dict[str, int] = {}  # one function may serve several launches
        for launch in self.launches:
            smem[launch.entry] = max(smem.get(launch.entry, 0), launch.shared_bytes)
        for function, nbytes in smem.items():
            module.allow_dynamic_shared(function, nbytes)
        device.activate()
        #: Buffers the program owns: intermediates, constants, and the host-mode staging of
        #: inputs and outputs (allocated on first host-mode call).
        self._owned: dict[str, int] = {}
        for spec in buffers:
            if spec.role == "intermediate" or spec.name in constants:
                self._owned[spec.name] = device.alloc(self._nbytes(spec.name))
        for name, array in constants.items():
            a = np.ascontiguousarray(array, dtype=self._dtype(name))
            if a.nbytes:
                device.driver.memcpy_htod(self._owned[name], a, 0)
                device.stats.copies_htod += 1
        if constants:
            device.driver.stream_synchronize(0)
        self._constants = set(constants)
        self._packed: OrderedDict[tuple[int, ...], list[Any]] = OrderedDict()
        self._graphs: OrderedDict[tuple[int, ...], tuple[Any, Any]] = OrderedDict()
        self._seen: OrderedDict[tuple[int, ...], None] = OrderedDict()
        self._done = device.driver.event_create()
        self._sync_event = device.driver.event_create()
        self._last_stream: int | None = None
        self._last_key: tuple[int, ...] | None = None
        seen: dict[str, None] = {}
        for launch in self.launches:
            for a in launch.args:
                if isinstance(a, str):
                    seen.setdefault(a, None)
        #: Every buffer the launches use, in a fixed order (the key of an address set).
        self._order = list(seen)
        self._closed = False

    # -- helpers ---------------------------------------------------------------------------
    def _label(self, name: str) -> str:
        return self.labels.get(name, name)

    def _dtype(self, name: str) -> np.dtype:
        return self._dtypes[name]

    def _nbytes(self, name: str) -> int:
        return math.prod(self._shapes[name]) * self._dtypes[name].itemsize

    def __repr__(self) -> str:
        return (
            f"<DeviceProgram {self.name}: {len(self.launches)} launches on {self.device!r}, "
            f"CUDA graphs {'on' if self.graphs else 'off'}>"
        )

    def close(self) -> None:
        """Free the program's buffers and graphs (also done when it is collected)."""
        if self._closed:
            return
        self._closed = True
        drv = self.device.driver
        for graph, graph_exec in self._graphs.values():
            drv.graph_destroy(graph, graph_exec)
        self._graphs.clear()
        for ptr in self._owned.values():
            try:
                self.device.free(ptr)
            except Exception:
                pass
        self._owned.clear()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- argument checks -------------------------------------------------------------------
    def _check(self, name: str, info: ArrayInfo | None, obj: Any, what: str) -> ArrayInfo:
        if info is None:
            raise CallError(
                f"{what} '{self._label(name)}': expected a numpy array or a CUDA array "
                f"(torch.Tensor, cupy.ndarray, JAX array), got {type(obj).__name__}"
            )
        shape = self._shapes[name]
        if info.shape != shape:
            raise CallError(
                f"{what} '{self._label(name)}': expected shape {shape}, got {tuple(info.shape)}"
            )
        dtype = self._dtypes[name]
        if isinstance(info.dtype, str) or info.dtype != dtype:
            hint = " (use .astype(np.float32))" if info.framework == "numpy" else ""
            raise CallError(
                f"{what} '{self._label(name)}': expected {dtype}, got {info.dtype_name}{hint}"
            )
        host_input = what == "input" and info.framework == "numpy"  # copied anyway
        if info.strides is not None and not host_input and not info.c_contiguous:
            raise CallError(
                f"{what} '{self._label(name)}': not C-contiguous (strides {info.strides}); "
                "pass a contiguous copy (.contiguous() / np.ascontiguousarray)"
            )
        if not host_input and info.ptr % VECTOR_ALIGN:
            raise CallError(
                f"{what} '{self._label(name)}': device pointer {info.ptr:#x} is not "
                f"{VECTOR_ALIGN}-byte aligned (kernels use 128-bit accesses); pass an aligned "
                "copy (.clone() / .copy())"
            )
        if what == "out" and info.readonly:
            raise CallError(f"out '{self._label(name)}': the array is read-only")
        if info.device == -1:  # the producer did not say: ask the driver
            if self.device.driver.knows_pointers:
                owner = self.device.driver.pointer_device(info.ptr)
                if owner is None:
                    raise CallError(
                        f"{what} '{self._label(name)}': its __cuda_array_interface__ pointer "
                        f"{info.ptr:#x} is not CUDA device memory"
                    )
                info.device = owner
            else:
                info.device = self.device.ordinal
        return info

    def _classify(
        self, args: Mapping[str, Any], out: Mapping[str, Any], stream: Any
    ) -> tuple[bool, int, dict[str, ArrayInfo], dict[str, ArrayInfo]]:
        """(host mode?, stream handle, input infos, out= infos), all arguments checked."""
        for name in self.inputs:
            if name not in args:
                raise CallError(f"{self.name}: missing input '{self._label(name)}'")
        for name in out:
            if name not in self.outputs:
                known = ", ".join(self._label(n) for n in self.outputs)
                raise CallError(f"{self.name}: out has no output '{name}' (outputs: {known})")
        objs = [("input", n, args[n]) for n in self.inputs] + [
            ("out", n, o) for n, o in out.items() if o is not None
        ]
        handle = None if stream is None else stream_handle(stream)
        if handle is None:  # default: the caller's framework's current stream
            first = next((o for _, _, o in objs if not isinstance(o, np.ndarray)), None)
            handle = 0 if first is None else default_stream(first)
        infos: dict[str, ArrayInfo] = {}
        outs: dict[str, ArrayInfo] = {}
        reference: tuple[str, str, ArrayInfo] | None = None
        for what, name, obj in objs:
            info = self._check(name, describe(obj, handle), obj, what)
            (infos if what == "input" else outs)[name] = info
            if reference is None:
                reference = (what, name, info)
                continue
            rwhat, rname, rinfo = reference
            if (info.device is None) != (rinfo.device is None) or info.device != rinfo.device:
                if info.device is None:
                    need = f"a device array on cuda:{rinfo.device}"
                else:
                    need = "a numpy array" if rinfo.device is None else f"on cuda:{rinfo.device}"
                raise CallError(
                    f"{what} '{self._label(name)}' is a {info.where} but {rwhat} "
                    f"'{self._label(rname)}' is a {rinfo.where}: pass {need} (all arrays of a "
                    "call are numpy arrays, or all live on the same GPU)"
                )
        host = reference is None or reference[2].device is None
        if not host and reference is not None and reference[2].device != self.device.ordinal:
            raise CallError(
                f"{reference[0]} '{self._label(reference[1])}' is on cuda:{reference[2].device} "
                f"but this graph runs on cuda:{self.device.ordinal}; use device="
                f"'cuda:{reference[2].device}' or move the arrays"
            )
        return host, handle, infos, outs

    def _check_aliasing(self, infos: dict[str, ArrayInfo], outs: dict[str, ArrayInfo]) -> None:
        """An ``out=`` array must not overlap an input or another output (kernels read inputs
        after writing outputs)."""
        ranges = [(i.ptr, i.ptr + i.nbytes, n) for n, i in [*infos.items(), *outs.items()]]
        for k, (s0, e0, n0) in enumerate(ranges):
            for s1, e1, n1 in ranges[k + 1 :]:
                if s0 < e1 and s1 < e0 and e0 > s0 and e1 > s1 and (n0 in outs or n1 in outs):
                    raise CallError(
                        f"'{self._label(n0)}' and '{self._label(n1)}' overlap in memory; "
                        "outputs must not alias inputs or each other"
                    )

    # -- running ---------------------------------------------------------------------------
    def __call__(
        self, args: Mapping[str, Any], out: Mapping[str, Any] | None = None, stream: Any = None
    ) -> list[Any]:
        """Run on ``args`` (buffer name → array); return the outputs in order.

        ``out``: output name → array to write into (None entries are allocated). ``stream``:
        where to run (see :func:`.arrays.stream_handle`).
        """
        if self._closed:
            raise DeviceError(f"{self.name}: the device program was closed")
        out = out or {}
        host, handle, infos, outs = self._classify(args, out, stream)
        dev, drv = self.device, self.device.driver
        if handle != 0 and not drv.foreign_streams and not drv.owns_stream(handle):
            raise CallError(
                f"stream {handle:#x}: the {drv.name} runtime launches only on streams it "
                "created; use POLYFUSE_CUDA_RUNTIME=cuda-bindings for framework streams"
            )
        with dev.lock:
            dev.activate()
            ptrs = dict(self._owned)  # intermediates, constants, host-mode staging
            results: list[Any] = []
            if host:
                for name in self._io:
                    if name not in ptrs:
                        ptrs[name] = self._owned[name] = dev.alloc(self._nbytes(name))
                for name in self.outputs:
                    info = outs.get(name)
                    results.append(
                        info.obj
                        if info is not None
                        else np.empty(self._shapes[name], self._dtypes[name])
                    )
            else:
                like = next(iter(infos.values()), None) or next(iter(outs.values()))
                for name, info in infos.items():
                    ptrs[name] = info.ptr
                for name in self.outputs:
                    info = outs.get(name)
                    if info is None:
                        obj, ptrs[name] = empty_like_framework(
                            like, self._shapes[name], self._dtypes[name], dev
                        )
                        results.append(obj)
                    else:
                        ptrs[name] = info.ptr
                        results.append(info.obj)
                if outs:
                    self._check_aliasing(infos, outs)

            # Order: after this program's previous call (on another stream), and after the
            # inputs' producers.
            if self._last_stream is not None and self._last_stream != handle:
                drv.event_record(self._done, self._last_stream)
                drv.stream_wait_event(handle, self._done)
            self._last_stream = handle
            for info in infos.values():
                if info.stream is not None and info.stream != handle:
                    drv.event_record(self._sync_event, info.stream)
                    drv.stream_wait_event(handle, self._sync_event)

            if host:
                for name in self.inputs:
                    a = args[name]
                    if a.nbytes:
                        drv.memcpy_htod(ptrs[name], np.ascontiguousarray(a), handle)
                        dev.stats.copies_htod += 1
            self._launch_all(tuple([ptrs[n] for n in self._order]), handle)

            if host:
                for name, result in zip(self.outputs, results, strict=True):
                    if result.nbytes:
                        drv.memcpy_dtoh(result, ptrs[name], handle)
                        dev.stats.copies_dtoh += 1
                self._synchronize(handle)
                return results
            for i, (name, obj) in enumerate(zip(self.outputs, results, strict=True)):
                if name in outs:
                    continue
                if isinstance(obj, DeviceArray) and obj.ready is None:
                    obj.stream = handle
                    obj.ready = drv.event_create()
                    drv.event_record(obj.ready, handle)
                results[i] = finish_output(like, obj)
            if self.sync_each:
                self._synchronize(handle)
            return results

    def _pack(self, key: tuple[int, ...]) -> list[Any]:
        packed = self._packed.get(key)
        if packed is not None:
            self._packed.move_to_end(key)
            return packed
        ptrs = dict(zip(self._order, key, strict=True))
        drv = self.device.driver
        packed = []
        for launch, fn in zip(self.launches, self._functions, strict=True):
            params = [
                (a.ctype, a.value) if isinstance(a, ScalarArg) else ("ptr", ptrs[a])
                for a in launch.args
            ]
            packed.append(drv.pack(fn, params))
        self._packed[key] = packed
        if len(self._packed) > CACHED_ADDRESS_SETS:
            self._packed.popitem(last=False)
        return packed

    def _direct(self, packed: list[Any], stream: int) -> None:
        drv, stats = self.device.driver, self.device.stats
        for launch, fn, params in zip(self.launches, self._functions, packed, strict=True):
            try:
                drv.launch(fn, launch.grid, launch.block, launch.shared_bytes, stream, params)
            except DeviceError as e:
                raise DeviceError(
                    f"kernel {launch.kernel}: launch <<<{launch.grid}, {launch.block}, "
                    f"{launch.shared_bytes}>>> failed: {e}"
                ) from None
            stats.launches += 1
            stats.per_kernel[launch.kernel] = stats.per_kernel.get(launch.kernel, 0) + 1
            if self.sync_each:
                self._synchronize(stream, [launch.kernel])

    def _launch_all(self, key: tuple[int, ...], stream: int) -> None:
        packed = self._pack(key)
        self._last_key = key
        if not self.graphs or self.sync_each:
            self._direct(packed, stream)
            return
        drv, stats = self.device.driver, self.device.stats
        entry = self._graphs.get(key)
        if entry is None and key in self._seen:
            entry = self._capture(packed)
        if entry is None:  # first sighting of these addresses: launch directly
            self._seen[key] = None
            if len(self._seen) > 8 * CACHED_ADDRESS_SETS:
                self._seen.popitem(last=False)
            self._direct(packed, stream)
            return
        self._graphs.move_to_end(key)
        try:
            drv.graph_launch(entry[1], stream)
        except DeviceError as e:
            names = ", ".join(launch.kernel for launch in self.launches)
            raise DeviceError(f"CUDA graph of {self.name} ({names}): launch failed: {e}") from None
        stats.graph_launches += 1

    def _capture(self, packed: list[Any]) -> tuple[Any, Any] | None:
        """Capture the launches into a CUDA graph (on the device's capture stream)."""
        drv, dev = self.device.driver, self.device
        cs = dev.capture_stream()
        key = self._last_key
        graph = None
        try:
            drv.begin_capture(cs)
            try:
                for launch, fn, params in zip(self.launches, self._functions, packed, strict=True):
                    drv.launch(fn, launch.grid, launch.block, launch.shared_bytes, cs, params)
            finally:
                graph = drv.end_capture(cs)
            graph_exec = drv.graph_instantiate(graph)
        except DeviceError as e:
            # A driver that refuses capture: note why and launch directly from now on.
            drv.graph_destroy(graph, None)
            self.graphs = False
            self.graph_note = f"CUDA graphs off: {e}"
            return None
        dev.stats.graph_captures += 1
        assert key is not None
        self._graphs[key] = (graph, graph_exec)
        self._seen.pop(key, None)
        if len(self._graphs) > CACHED_ADDRESS_SETS:
            old_graph, old_exec = self._graphs.popitem(last=False)[1]
            drv.graph_destroy(old_graph, old_exec)
        return graph, graph_exec

    def _synchronize(self, stream: int, kernels: list[str] | None = None) -> None:
        try:
            self.device.driver.stream_synchronize(stream)
        except DeviceError as e:
            names = ", ".join(kernels or [launch.kernel for launch in self.launches])
            raise DeviceError(f"kernel execution failed ({names}): {e}") from None

    # -- measurement -----------------------------------------------------------------------
    def time_launches(self, repeats: int = 10, stream: int = 0) -> list[float]:
        """Median milliseconds of each launch on the buffers of the last call, timed one by
        one with CUDA events (for a breakdown by kernel; the graph's total is the sum plus
        nothing else only when the launches do not overlap)."""
        if self._last_key is None:
            raise CallError(f"{self.name}: call the program once before timing its launches")
        drv = self.device.driver
        packed = self._pack(self._last_key)
        start, end = drv.event_create(timing=True), drv.event_create(timing=True)
        times: list[list[float]] = [[] for _ in self.launches]
        with self.device.lock:
            self.device.activate()
            for _ in range(max(1, repeats)):
                for i, (launch, fn, params) in enumerate(
                    zip(self.launches, self._functions, packed, strict=True)
                ):
                    drv.event_record(start, stream)
                    drv.launch(fn, launch.grid, launch.block, launch.shared_bytes, stream, params)
                    drv.event_record(end, stream)
                    drv.event_synchronize(end)
                    times[i].append(drv.event_elapsed_ms(start, end))
        drv.event_destroy(start)
        drv.event_destroy(end)
        return [float(np.median(t)) for t in times]
