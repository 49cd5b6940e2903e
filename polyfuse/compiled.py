"""CompiledGraph: the callable result of ``polyfuse.compile``.

It owns the CUDA translation unit, the ordered launches and the buffers they use (graph
inputs and outputs, intermediates between kernels, scratch), and runs them on the CPU
emulator (``device="emulate"``) or a GPU (``device="cuda"`` / ``"cuda:N"``) through
:mod:`polyfuse.cuda.runtime`: there the module, the functions and every intermediate buffer are
made once per device, numpy arrays are copied in and out, and device arrays (PyTorch, CuPy, JAX,
anything with ``__cuda_array_interface__`` or DLPack) are used in place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from polyfuse.cuda.kernel_ast import Kernel
from polyfuse.cuda.launch import Launch, LaunchTraffic, dependence_order
from polyfuse.errors import CallError, CompilerNotFound
from polyfuse.graph.expr import Tensor
from polyfuse.host_arrays import as_torch, host_arguments, host_view


@dataclass(frozen=True)
class BufferSpec:
    """A global-memory buffer of the compiled graph."""

    name: str
    shape: tuple[int, ...]
    role: str  # "input" | "output" | "intermediate"
    dtype: str = "float32"


_MISSING = object()  # an input no argument was given for

#: Longest one-line repr before it is cut with "...".
_REPR_WIDTH = 160


def _clip(text: str) -> str:
    return text if len(text) <= _REPR_WIDTH else text[: _REPR_WIDTH - 3] + "..."


def _buffer_shape(graph, ident: str) -> tuple[int, ...]:
    """Shape of the tensor behind a kernel parameter (a primitive or its accumulator)."""
    if ident in graph.prims:
        return graph.prims[ident].tensor.shape
    if ident.endswith("_acc") and ident[:-4] in graph.prims:
        return graph.prims[ident[:-4]].tensor.shape
    raise KeyError(ident)


def _not_host_array(name: str, obj: Any, what: str = "input") -> str:
    """The message for a non-numpy argument of the emulator (a device array, or junk)."""
    device = None
    try:
        if hasattr(obj, "__cuda_array_interface__"):
            device = "a CUDA array"
        elif hasattr(obj, "__dlpack_device__") and int(obj.__dlpack_device__()[0]) == 2:
            device = "a CUDA array"
    except Exception:
        device = None
    kind = f"{type(obj).__module__.split('.')[0]}.{type(obj).__name__}"
    if device:
        return (
            f"{what} '{name}' is {device} ({kind}); the emulator runs on host numpy arrays: "
            "use device='cuda', or copy it to the host"
        )
    return f"{what} '{name}': expected a numpy array, got {type(obj).__name__}"


def kernel_order(kernels: list[Kernel]) -> list[int]:
    """Indices of ``kernels`` in a launch order that follows the dependences between them,
    computed from the buffers each kernel reads (``const`` pointers) and writes."""
    return dependence_order(kernel_accesses(kernels), [k.name for k in kernels])


def kernel_accesses(kernels: list[Kernel]) -> list[tuple[set[str], set[str]]]:
    """(buffers read, buffers written) per kernel: ``const`` pointers are read only."""
    accesses = []
    for k in kernels:
        bufs = [p for p in k.params if p.tensor]
        reads = {p.tensor for p in bufs if p.ctype.startswith("const")}
        writes = {p.tensor for p in bufs if not p.ctype.startswith("const")}
        accesses.append((reads, writes))
    return accesses


def plan_buffers(graph, kernels: list[Kernel]) -> tuple[list[BufferSpec], list[Launch]]:
    """Buffers every kernel parameter refers to, and the launches in dependence order
    (:func:`kernel_order`)."""
    ins = {graph.ident(t) for t in graph.inputs}
    outs = {graph.ident(t) for t in graph.outputs}
    specs: dict[str, BufferSpec] = {}
    for t in graph.inputs:  # graph inputs include constants (weights)
        specs[graph.ident(t)] = BufferSpec(graph.ident(t), t.shape, "input")
    for t in graph.outputs:
        specs[graph.ident(t)] = BufferSpec(graph.ident(t), t.shape, "output")
    launches = []
    for k in (kernels[i] for i in kernel_order(kernels)):
        for p in k.params:
            if p.tensor and p.tensor not in specs:
                role = "output" if p.tensor in outs else "intermediate"
                role = "input" if p.tensor in ins else role
                specs[p.tensor] = BufferSpec(p.tensor, _buffer_shape(graph, p.tensor), role)
        launches.append(
            Launch(
                k.name,
                k.grid,
                k.block,
                tuple(p.name for p in k.params),
                k.dynamic_shared_bytes,
                k.function,
            )
        )
    return list(specs.values()), launches


def _with_resources(k: Kernel, binary: Any) -> Kernel:
    """``k`` with the registers, static shared memory and spills the CUDA compiler reported
    for its function (``k`` itself when it reported none)."""
    r = binary.resources.get(k.function or k.name)
    if r is None:
        return k
    return replace(
        k,
        registers=r.registers,
        static_shared_bytes=r.shared_bytes,
        spill_stores=r.spill_stores,
        spill_loads=r.spill_loads,
    )


class CompiledGraph:
    """A compiled graph: call it on numpy arrays.

    Attributes: ``kernels`` (name, source, grid, block, shared_bytes, micrographs),
    ``cuda_source`` (one translation unit), ``launches``, ``plan`` (printable decisions),
    ``last_traffic`` (global bytes per launch of the last emulated call).
    """

    def __init__(
        self,
        name,
        arch,
        inputs,
        outputs,
        kernels,
        source,
        launches,
        buffers,
        plan,
        idents,
        constants: dict[str, np.ndarray] | None = None,
    ):
        self.name = name
        self.arch = arch
        self.inputs: list[Tensor] = inputs
        self.outputs: list[Tensor] = outputs
        self.kernels: list[Kernel] = kernels
        self.cuda_source: str = source
        self.launches: list[Launch] = launches
        self.buffers: list[BufferSpec] = buffers
        self.constants: dict[str, np.ndarray] = constants or {}
        self.plan = plan
        self._idents = idents
        self._emulated = None
        self._emulated_racecheck = None
        self._programs: dict[int, Any] = {}
        self.last_traffic: list[LaunchTraffic] = []
        self.cuda_binaries: dict[str, Any] = {}
        self.cache_stats: dict[str, int] = {"hits": 0, "misses": 0}

    def __repr__(self) -> str:
        ins = ", ".join(f"{t.name}{list(t.shape)}" for t in self.inputs)
        outs = ", ".join(f"{t.name}{list(t.shape)}" for t in self.outputs)
        head = f"<CompiledGraph {self.name}: ({ins}) -> ({outs}), {len(self.kernels)} kernels"
        return _clip(f"{head} for {self.arch}") + ">"

    def describe(self) -> str:
        """Everything about the compile, for reading: the plan (every decision and its
        reason, ``print(fn.plan)``), then each launch in order."""
        lines = [repr(self), str(self.plan) if self.plan is not None else "(no plan)"]
        lines.append("launches, in order (<<<grid, block, dynamic shared bytes>>>):")
        lines += [f"  {launch}" for launch in self.launches]
        return "\n".join(lines)

    # ------------------------------------------------------------------ compile checks
    def check_cuda(self, arch: str | None = None, required: bool = True):
        """Compile the CUDA source with NVRTC/nvcc for ``arch``; fill per-kernel resources.

        With ``required=False`` a missing compiler is noted in the plan instead of raised.
        """
        from polyfuse.cuda.compiler import compile_cuda

        arch = arch or self.arch
        try:
            binary = compile_cuda(self.cuda_source, arch)
        except CompilerNotFound as e:
            if required:
                raise
            note = f"not compiled for {arch}: {e}"
            self._set_kernels([replace(k, notes=[*k.notes, note]) for k in self.kernels])
            return None
        self.cuda_binaries[arch] = binary
        for k in self.kernels:  # also by kernel name: identical kernels share one function
            if k.function and k.function in binary.resources:
                binary.resources.setdefault(k.name, binary.resources[k.function])
        if arch == self.arch:
            self._set_kernels([_with_resources(k, binary) for k in self.kernels])
        return binary

    def _set_kernels(self, kernels: list[Kernel]) -> None:
        """Use new kernel records (the compiled graph and its plan), never edit the old ones."""
        self.kernels = kernels
        if self.plan is not None:
            self.plan = replace(self.plan, kernels=kernels)

    # ------------------------------------------------------------------ calling
    def _given(self, args: tuple, kwargs: dict) -> list[Any]:
        """The argument for each input, in input order: positional arguments by position,
        keyword arguments by input name (refused for a name several inputs share)."""
        names = [t.name for t in self.inputs]
        if len(args) > len(self.inputs):
            raise CallError(
                f"{self.name}: expected {len(self.inputs)} input arrays ({', '.join(names)}), "
                f"got {len(args)}"
            )
        given: list[Any] = [*args] + [_MISSING] * (len(names) - len(args))
        for k, v in kwargs.items():
            if k not in names:
                raise CallError(f"{self.name}: unknown input '{k}'; inputs are {', '.join(names)}")
            if names.count(k) > 1:
                raise CallError(
                    f"{self.name}: {names.count(k)} inputs are named '{k}'; pass them by position"
                )
            i = names.index(k)
            if given[i] is not _MISSING:
                raise CallError(f"{self.name}: input '{k}' given twice")
            given[i] = v
        for t, a in zip(self.inputs, given, strict=True):
            if a is _MISSING:
                raise CallError(f"{self.name}: missing input array for '{t.name}' {t.shape}")
        return given

    def _bind(self, args: tuple, kwargs: dict) -> dict[str, np.ndarray]:
        bufs: dict[str, np.ndarray] = {}
        for t, a in zip(self.inputs, self._given(args, kwargs), strict=True):
            if not isinstance(a, np.ndarray):
                raise CallError(_not_host_array(t.name, a))
            if a.shape != t.shape:
                raise CallError(f"input '{t.name}': expected shape {t.shape}, got {a.shape}")
            if a.dtype != np.float32:
                raise CallError(
                    f"input '{t.name}': expected float32, got {a.dtype} (use .astype(np.float32))"
                )
            bufs[self._idents[t.uid]] = np.ascontiguousarray(a).copy()
        for ident, a in self.constants.items():
            bufs[ident] = a.copy()
        for b in self.buffers:
            if b.role != "input":
                bufs[b.name] = np.full(b.shape, np.nan, dtype=np.float32)
        return bufs

    def __call__(
        self,
        *args: Any,
        device: str = "emulate",
        race_check: bool | str = False,
        out: Any = None,
        stream: Any = None,
        **kwargs: Any,
    ):
        """Run the graph; returns one array, or a tuple when there are several outputs.

        Arrays bind to ``inputs`` by position; a keyword argument names an input (refused
        when several inputs share that name: placeholders are distinct by identity).

        ``device``: "emulate" (the CPU emulator: numpy arrays, torch CPU tensors or any host
        DLPack array — read through ``np.from_dlpack`` without a copy; torch tensors in →
        torch tensors out, other kinds → numpy arrays) or "cuda" / "cuda:N" (a GPU,
        see :mod:`polyfuse.cuda.runtime`): numpy arrays in → numpy arrays out; device arrays
        (``torch.Tensor``, ``cupy.ndarray``, JAX arrays, any ``__cuda_array_interface__`` or
        DLPack producer) in → outputs in the same framework on the same GPU, without copies.
        ``out``: array(s) to write the outputs into — one array, a sequence in output order,
        or a dict by output name. ``stream`` (GPU): a stream handle or framework stream to run
        on (default: the inputs' framework's current stream). ``race_check``: emulator only;
        True/"reverse" runs each block's threads in reverse order between barriers, "random"
        in a shuffled order (a missing barrier shows as a wrong result); "shadow" runs a
        race-check build that tracks every shared and global access and raises
        :class:`~polyfuse.errors.RaceError` naming the kernel, lines and threads of the first
        data race. Inputs named ``device``, ``out``,
        ``stream`` or ``race_check`` must be passed positionally.
        """
        if isinstance(device, str) and device.startswith("cuda"):
            if race_check:
                raise CallError("race_check is an emulator mode; use device='emulate'")
            return self._run_cuda(device, args, kwargs, out, stream)
        if device != "emulate":
            raise CallError(f"unknown device '{device}'; use 'emulate', 'cuda' or 'cuda:N'")
        if stream is not None:
            raise CallError("stream= is for device='cuda'; the emulator runs synchronously")
        args, kwargs, torch_in = host_arguments(args, kwargs)
        bufs = self._bind(args, kwargs)
        order = {False: "forward", True: "reverse", "shadow": "forward"}.get(race_check, race_check)
        if order not in ("forward", "reverse", "random"):
            raise CallError(
                "race_check must be False, True, 'reverse', 'random' or 'shadow', not "
                f"{race_check!r}"
            )
        from polyfuse.cuda.emulator import Emulator

        if race_check == "shadow":
            if self._emulated_racecheck is None:
                self._emulated_racecheck = Emulator().load(self.cuda_source, racecheck=True)
            module = self._emulated_racecheck
        else:
            if self._emulated is None:
                self._emulated = Emulator().load(self.cuda_source)
            module = self._emulated
        self.last_traffic = module.run(self.launches, bufs, order=order)
        res = tuple(bufs[self._idents[t.uid]] for t in self.outputs)
        if out is not None:
            for t, given, value in zip(self.outputs, self._outs(out), res, strict=True):
                if given is None:
                    continue
                target = host_view(given)
                if not isinstance(target, np.ndarray):
                    raise CallError(_not_host_array(t.name, target, what="out"))
                if target.shape != value.shape or target.dtype != value.dtype:
                    raise CallError(
                        f"out '{t.name}': expected a {value.dtype} array of shape {value.shape}, "
                        f"got {target.dtype} {target.shape}"
                    )
                target[...] = value
            res = tuple(v if o is None else o for v, o in zip(res, self._outs(out), strict=True))
        if torch_in:
            res = as_torch(res)
        return res[0] if len(res) == 1 else res

    def _outs(self, out: Any) -> list[Any]:
        """``out=`` as one entry (array or None) per output."""
        names = [t.name for t in self.outputs]
        if isinstance(out, dict):
            unknown = set(out) - set(names)
            if unknown:
                raise CallError(
                    f"out: unknown output '{sorted(unknown)[0]}'; outputs are {', '.join(names)}"
                )
            return [out.get(n) for n in names]
        if isinstance(out, (list, tuple)):
            if len(out) != len(names):
                raise CallError(f"out: expected {len(names)} arrays ({', '.join(names)})")
            return list(out)
        if len(names) != 1:
            raise CallError(
                f"out: the graph has {len(names)} outputs ({', '.join(names)}); pass a "
                "sequence or a dict"
            )
        return [out]

    def device_program(self, device: str = "cuda", *, graphs: bool = True):
        """The :class:`~polyfuse.cuda.runtime.DeviceProgram` that runs this graph on
        ``device`` ("cuda" or "cuda:N"): made on first use (module loaded, constants
        uploaded, intermediates allocated), then reused by every call."""
        from polyfuse.cuda.runtime import DeviceProgram, open_device, parse_device

        ordinal = parse_device(device)
        prog = self._programs.get(ordinal)
        if prog is None:
            dev = open_device(ordinal)
            module = dev.load(self.cuda_source)
            idents = self._idents
            prog = DeviceProgram(
                dev,
                module,
                self.launches,
                self.buffers,
                inputs=[idents[t.uid] for t in self.inputs],
                outputs=[idents[t.uid] for t in self.outputs],
                constants=self.constants,
                labels={idents[t.uid]: t.name for t in [*self.inputs, *self.outputs]},
                graphs=graphs,
                name=self.name,
            )
            self._programs[ordinal] = prog
        return prog

    def _run_cuda(self, device: str, args: tuple, kwargs: dict, out: Any, stream: Any):
        given = self._given(args, kwargs)
        prog = self.device_program(device)
        idents = self._idents
        argmap = {idents[t.uid]: a for t, a in zip(self.inputs, given, strict=True)}
        outmap = {}
        if out is not None:
            for t, o in zip(self.outputs, self._outs(out), strict=True):
                if o is not None:
                    outmap[idents[t.uid]] = o
        res = prog(argmap, outmap, stream)
        return res[0] if len(res) == 1 else tuple(res)

    # ------------------------------------------------------------------ report
    def visualize(self, path: str | os.PathLike = "report.html", json_path=None) -> Path:
        """Write the scheduling debug report (self-contained HTML, :mod:`polyfuse.viz`) to
        ``path`` (default ``report.html``), its data as JSON to ``json_path`` when given;
        returns the absolute path of the HTML file, to open in a browser."""
        from polyfuse.viz import visualize

        visualize(self, path, json_path)
        return Path(path).resolve()

    # ------------------------------------------------------------------ measurements
    def traffic_bytes(self) -> int:
        """Global bytes moved by the last emulated call (unique elements × 4, per launch)."""
        return sum(t.bytes_total for t in self.last_traffic)

    def requested_bytes(self) -> int:
        """Global bytes requested by the last emulated call: every load and store, repeats
        included (a naive matrix product reads 8 bytes per multiply-add)."""
        return sum(t.bytes_requested for t in self.last_traffic)

    def global_bytes(self) -> int:
        """Distinct global bytes all kernels move, computed exactly by isl (no emulation)."""
        return sum(k.bytes_read + k.bytes_written for k in self.kernels)

    def compulsory_bytes(self) -> int:
        """Inputs read once plus outputs written once."""
        n = 0
        for b in self.buffers:
            if b.role in ("input", "output"):
                k = 4
                for d in b.shape:
                    k *= d
                n += k
        return n
