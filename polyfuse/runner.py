"""Running a compiled graph: the half of a compiled graph that needs no compiler.

:class:`GraphRunner` binds call arguments to the graph's buffers and runs the launches on the
CPU emulator (``device="emulate"``) or a GPU (``device="cuda"`` / ``"cuda:N"``) through
:mod:`polyfuse.cuda.runtime`. :class:`~polyfuse.compiled.CompiledGraph` (just compiled) and
:class:`~polyfuse.artifact.LoadedGraph` (read back from a saved artifact) are both runners, so
a loaded graph takes the same arguments, checks them the same way and gives the same outputs.
This module imports neither islpy nor any compiler module: a serving process that loads an
artifact imports it with numpy and the driver bindings only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from polyfuse.cuda.runtime.launch import Launch, LaunchTraffic
from polyfuse.cuda.toolchain.compiler import compile_cuda
from polyfuse.errors import CallError
from polyfuse.host_arrays import as_torch, host_arguments, host_view


def load_source(device: Any, source: str, arch: str | None = None, **compile_options: Any) -> Any:
    """Compile CUDA ``source`` to a cubin for ``device``'s arch (or ``arch``) and load it there
    (a :class:`polyfuse.cuda.runtime.Device`, which loads binaries only: the runtime compiles
    nothing, so it runs without the toolchain)."""
    binary = compile_cuda(source, arch or device.arch, output="cubin", **compile_options)
    return device.load_binary(binary)


@dataclass(frozen=True)
class BufferSpec:
    """A global-memory buffer of the compiled graph."""

    name: str
    shape: tuple[int, ...]
    role: str  # "input" | "output" | "intermediate"
    dtype: str = "float32"


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output as a loaded graph knows it: the name users call it by, its
    shape and dtype, and ``uid`` (its key in the runner's buffer names, as a tensor's)."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    uid: int = 0


_MISSING = object()  # an input no argument was given for


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype of a buffer's dtype name (bfloat16 from ml_dtypes). The runner runs
    saved artifacts without the compiler, so it does not import the graph layer's table."""
    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def _poisoned(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A buffer a kernel must overwrite, filled with a value a kernel rarely computes: NaN
    for floats, the most negative integer for integers, True for bools (NaN has no integer
    value: numpy's cast of it is undefined and warns)."""
    if dtype.kind in "iu":
        return np.full(shape, np.iinfo(dtype).min, dtype=dtype)
    if dtype.kind == "b":
        return np.ones(shape, dtype=dtype)
    return np.full(shape, np.nan, dtype=dtype)


def _astype(dtype: str) -> str:
    """How a user converts an array to ``dtype`` (bfloat16 comes from ml_dtypes)."""
    return "ml_dtypes.bfloat16" if dtype == "bfloat16" else f"np.{dtype}"


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


class GraphRunner:
    """Calls of a compiled graph on the emulator or a GPU.

    A subclass sets ``name``, ``arch``, ``inputs`` / ``outputs`` (objects with ``name``,
    ``shape`` and ``uid``: te tensors or :class:`TensorSpec`), ``_idents`` (uid → buffer
    name), ``cuda_source``, ``launches``, ``buffers`` and ``constants`` (buffer name → array),
    then calls :meth:`_init_runner`.
    """

    name: str
    arch: str
    inputs: list[Any]
    outputs: list[Any]
    cuda_source: str
    launches: list[Launch]
    buffers: list[BufferSpec]
    constants: dict[str, np.ndarray]
    _idents: dict[int, str]

    def _init_runner(self) -> None:
        self._emulated = None
        self._emulated_racecheck = None
        self._programs: dict[Any, Any] = {}
        self.last_traffic: list[LaunchTraffic] = []

    @property
    def input_buffers(self) -> list[str]:
        """The buffer name of each input, in call order."""
        return [self._idents[t.uid] for t in self.inputs]

    @property
    def output_buffers(self) -> list[str]:
        """The buffer name of each output, in return order."""
        return [self._idents[t.uid] for t in self.outputs]

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
            want = numpy_dtype(t.dtype)
            if a.dtype != want:
                raise CallError(
                    f"input '{t.name}': expected {t.dtype}, got {a.dtype} "
                    f"(use .astype({_astype(t.dtype)}))"
                )
            bufs[self._idents[t.uid]] = np.ascontiguousarray(a).copy()
        for ident, a in self.constants.items():
            bufs[ident] = a.copy()
        for b in self.buffers:
            if b.role != "input":
                bufs[b.name] = _poisoned(b.shape, numpy_dtype(b.dtype))
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

        ``device``: "emulate" (the CPU emulator, numpy arrays) or "cuda" / "cuda:N" (a GPU,
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
        data race; "banks" is "shadow" that also counts shared-memory bank conflicts per access
        site (``last_traffic[i].shared_banks``, :mod:`polyfuse.cuda.emulator.banks`). Inputs
        named ``device``, ``out``, ``stream`` or ``race_check`` must be passed positionally.
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
        order = {False: "forward", True: "reverse", "shadow": "forward", "banks": "forward"}.get(
            race_check, race_check
        )
        if order not in ("forward", "reverse", "random"):
            raise CallError(
                "race_check must be False, True, 'reverse', 'random', 'shadow' or 'banks', not "
                f"{race_check!r}"
            )
        from polyfuse.cuda.emulator import Emulator

        if race_check in ("shadow", "banks"):
            if self._emulated_racecheck is None:
                self._emulated_racecheck = Emulator().load(self.cuda_source, racecheck=True)
            module = self._emulated_racecheck
        else:
            if self._emulated is None:
                self._emulated = Emulator().load(self.cuda_source)
            module = self._emulated
        self.last_traffic = module.run(
            self.launches, bufs, order=order, banks=race_check == "banks"
        )
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

    def device_program(self, device: Any = "cuda", *, graphs: bool = True):
        """The :class:`~polyfuse.cuda.runtime.DeviceProgram` that runs this graph on
        ``device`` ("cuda", "cuda:N", or an opened :class:`~polyfuse.cuda.runtime.Device`):
        made on first use (module loaded, constants uploaded, intermediates allocated), then
        reused by every call."""
        from polyfuse.cuda.runtime import DeviceProgram, open_device, parse_device

        key = (parse_device(device) if isinstance(device, str) else device, graphs)
        prog = self._programs.get(key)
        if prog is None:
            dev = open_device(key[0]) if isinstance(device, str) else device
            module = self._load_module(dev)
            idents = self._idents
            prog = DeviceProgram(
                dev,
                module,
                self.launches,
                self.buffers,
                inputs=self.input_buffers,
                outputs=self.output_buffers,
                constants=self.constants,
                labels={idents[t.uid]: t.name for t in [*self.inputs, *self.outputs]},
                graphs=graphs,
                name=self.name,
            )
            self._programs[key] = prog
        return prog

    def _load_module(self, device: Any) -> Any:
        """This graph's module on ``device``: its CUDA source compiled for the device's arch."""
        return load_source(device, self.cuda_source)

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

    # ------------------------------------------------------------------ measurements
    def traffic_bytes(self) -> int:
        """Global bytes moved by the last emulated call (unique elements × 4, per launch)."""
        return sum(t.bytes_total for t in self.last_traffic)

    def requested_bytes(self) -> int:
        """Global bytes requested by the last emulated call: every load and store, repeats
        included (a naive matrix product reads 8 bytes per multiply-add)."""
        return sum(t.bytes_requested for t in self.last_traffic)

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
