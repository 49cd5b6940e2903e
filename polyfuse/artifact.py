"""Compiled graphs saved to one file and run later without the compiler.

``fn.save(path)`` (:meth:`polyfuse.compiled.CompiledGraph.save`) writes everything a graph
needs to run — the CUDA source, a cubin (and its PTX) per requested arch compiled by NVRTC at
save time, the launches (grids, blocks, dynamic shared bytes, buffer and scalar arguments, the
shared ``__global__`` function each runs), the buffers (names, shapes, dtypes, roles), the
inputs and outputs in call order, the constants (weights), a plan summary (kernels,
micrographs, decisions as text), the versions that wrote it, and checksums — as one
:mod:`polyfuse.base.store` entry (:mod:`polyfuse.artifact_format`). ``polyfuse.load(path)`` reads
it back as a :class:`LoadedGraph`, which is called exactly like the compiled graph:

* ``device="cuda"`` / ``"cuda:N"``: the runtime (:mod:`polyfuse.cuda.runtime`) loads the cubin
  for the GPU's arch — the same arch, else one of the same major version and a lower minor
  (binary compatible), else the PTX of the highest arch not above it (the driver compiles it),
  else the CUDA source compiled here with NVRTC when a compiler is installed;
* ``device="emulate"``: the CPU emulator runs the same CUDA source (needs a C++ compiler).

This module and everything it imports (the runner, the store, the runtime, the emulator) work
without islpy or any compiler package: a serving process or a GPU machine that only has numpy
and NVIDIA's ``cuda-bindings`` loads and runs artifacts. Pickling a loaded graph (or a
compiled one, :meth:`~polyfuse.compiled.CompiledGraph.__reduce__`) pickles its artifact bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from polyfuse import artifact_format
from polyfuse.artifact_format import FORMAT_VERSION, SUFFIX
from polyfuse.base.store import FORMAT as STORE_FORMAT
from polyfuse.cuda.runtime.launch import Launch, ScalarArg
from polyfuse.cuda.toolchain.compiler import CudaBinary, KernelResources
from polyfuse.errors import ArtifactError, CompilerNotFound
from polyfuse.runner import BufferSpec, GraphRunner, TensorSpec, load_source
from polyfuse.version import CODEGEN_REVISION, __version__

__all__ = [
    "FORMAT_VERSION",
    "SUFFIX",
    "KernelSummary",
    "LoadedGraph",
    "MicrographSummary",
    "PlanSummary",
    "load",
    "loads",
]

_SCALAR_CTYPES = ("int", "long long", "float")
_RESAVE = "re-save it with fn.save(path)"


@dataclass(frozen=True)
class KernelSummary:
    """One kernel as the plan summary keeps it (the fields of ``fn.kernels`` that matter once
    compiled): launch shape, shared memory, ptxas registers for the compile's arch, the
    micrographs it runs, the ``__global__`` function it shares, isl's distinct global bytes."""

    name: str
    function: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    dynamic_shared_bytes: int
    micrographs: tuple[str, ...]
    registers: int | None = None
    bytes_read: int = 0
    bytes_written: int = 0


@dataclass(frozen=True)
class MicrographSummary:
    """A micrograph: its name, op kind and primitives."""

    name: str
    kind: str
    prims: tuple[str, ...]


@dataclass(frozen=True)
class PlanSummary:
    """What the compiler decided, as saved: ``text`` is ``print(fn.plan)``; ``decisions``
    every decision record as the plan prints it."""

    text: str = ""
    kernels: tuple[KernelSummary, ...] = ()
    micrographs: tuple[MicrographSummary, ...] = ()
    decisions: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.text

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PlanSummary:
        kernels = tuple(
            KernelSummary(
                **{
                    **k,
                    "grid": tuple(k["grid"]),
                    "block": tuple(k["block"]),
                    "micrographs": tuple(k["micrographs"]),
                }
            )
            for k in d.get("kernels", ())
        )
        mgs = tuple(
            MicrographSummary(m["name"], m["kind"], tuple(m["prims"]))
            for m in d.get("micrographs", ())
        )
        return cls(d.get("text", ""), kernels, mgs, tuple(d.get("decisions", ())))


def _versions() -> dict[str, Any]:
    return {
        "polyfuse": __version__,
        "format": FORMAT_VERSION,
        "store": STORE_FORMAT,
        "codegen": CODEGEN_REVISION,
    }


@dataclass
class _Parts:
    """Everything a :class:`LoadedGraph` holds (what the file holds)."""

    name: str
    arch: str
    cuda_source: str
    launches: list[Launch]
    buffers: list[BufferSpec]
    inputs: list[tuple[str, str]]  # (name users call it, buffer)
    outputs: list[tuple[str, str]]
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    binaries: dict[str, CudaBinary] = field(default_factory=dict)
    plan: PlanSummary = field(default_factory=PlanSummary)
    versions: dict[str, Any] = field(default_factory=_versions)
    metadata: dict[str, Any] = field(default_factory=dict)


class LoadedGraph(GraphRunner):
    """A compiled graph read from an artifact (:func:`load`), or assembled to be saved.

    Call it as the :class:`~polyfuse.compiled.CompiledGraph` it was saved from:
    ``g(x, device="cuda")``, ``g(x, device="emulate")``, ``out=``, ``stream=``,
    ``g.device_program(...)``. Attributes: ``name``, ``arch`` (the compile's), ``inputs`` /
    ``outputs`` (:class:`~polyfuse.runner.TensorSpec` in call order), ``launches``,
    ``buffers``, ``constants``, ``cuda_source``, ``binaries`` (arch → cubin
    :class:`~polyfuse.cuda.toolchain.compiler.CudaBinary`), ``plan`` (:class:`PlanSummary`),
    ``kernels``,
    ``versions`` (what wrote it), ``metadata`` (free JSON the saver attached), ``path``.
    """

    def __init__(
        self,
        *,
        name: str,
        arch: str,
        cuda_source: str,
        launches: Sequence[Launch],
        buffers: Sequence[BufferSpec],
        inputs: Sequence[tuple[str, str]],
        outputs: Sequence[tuple[str, str]],
        constants: Mapping[str, np.ndarray] | None = None,
        binaries: Mapping[str, CudaBinary] | None = None,
        plan: PlanSummary | None = None,
        versions: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        path: Path | None = None,
    ) -> None:
        self.name = name
        self.arch = arch
        self.cuda_source = cuda_source
        self.launches = list(launches)
        self.buffers = list(buffers)
        self.constants = {k: np.ascontiguousarray(v) for k, v in (constants or {}).items()}
        self.binaries = dict(binaries or {})
        self.plan = plan or PlanSummary()
        self.versions = dict(versions or _versions())
        self.metadata = dict(metadata or {})
        self.path = path
        specs = {b.name: b for b in self.buffers}
        where = f"artifact '{path}'" if path else f"graph {name}"
        for label, buf in [*inputs, *outputs]:
            if buf not in specs:
                raise ArtifactError(f"{where}: '{label}' names no buffer ('{buf}'): {_RESAVE}")
        for launch in self.launches:
            for a in launch.args:
                if isinstance(a, str) and a not in specs:
                    raise ArtifactError(
                        f"{where}: kernel {launch.kernel} uses no-such buffer '{a}': {_RESAVE}"
                    )
        self._idents: dict[int, str] = {}
        self.inputs: list[TensorSpec] = []
        self.outputs: list[TensorSpec] = []
        for uid, (label, buf) in enumerate([*inputs, *outputs]):
            spec = TensorSpec(label, tuple(specs[buf].shape), specs[buf].dtype, uid)
            (self.inputs if uid < len(inputs) else self.outputs).append(spec)
            self._idents[uid] = buf
        self._init_runner()

    def __repr__(self) -> str:
        archs = ", ".join(sorted(self.binaries)) or "source only"
        return (
            f"<LoadedGraph {self.name}: {len(self.launches)} launches, cubins {archs}"
            + (f", from {self.path}" if self.path else "")
            + ">"
        )

    @property
    def kernels(self) -> tuple[KernelSummary, ...]:
        """The kernels as the plan summary keeps them."""
        return self.plan.kernels

    # ------------------------------------------------------------------ the GPU module
    def binary_for(self, arch: str) -> CudaBinary | None:
        """The saved image a GPU of ``arch`` loads: the cubin for ``arch``; else a cubin of the
        same major version and a lower minor (cubins run on later minors); else the PTX of the
        highest arch not above ``arch`` (the driver compiles it); else None."""
        if arch in self.binaries and self.binaries[arch].output == "cubin":
            return self.binaries[arch]
        want = _cc(arch)
        cubins = sorted(
            (_cc(a), b)
            for a, b in self.binaries.items()
            if b.output == "cubin" and _cc(a)[0] == want[0] and _cc(a) <= want
        )
        if cubins:
            return cubins[-1][1]
        ptx = sorted((_cc(a), b) for a, b in self.binaries.items() if b.ptx and _cc(a) <= want)
        if ptx:
            b = ptx[-1][1]
            image = (b.ptx or "").encode() + b"\0"
            return CudaBinary(b.arch, b.compiler, "ptx", image, b.ptx, {}, "", 0.0,
                              b.compiler_version)  # fmt: skip
        return None

    def _load_module(self, device: Any) -> Any:
        binary = self.binary_for(device.arch)
        if binary is not None:
            return device.load_binary(binary)
        try:
            return load_source(device, self.cuda_source)
        except CompilerNotFound:
            saved = ", ".join(sorted(self.binaries)) or "none"
            raise ArtifactError(
                f"{self.name}: the artifact has no cubin for {device.arch} (it has: {saved}) "
                f"and no CUDA compiler is installed here to build one: save it with "
                f"fn.save(path, archs=[..., '{device.arch}']), or pip install 'polyfuse[nvrtc]'"
            ) from None

    # ------------------------------------------------------------------ saving
    def _parts(self) -> _Parts:
        io = [(t.name, self._idents[t.uid]) for t in self.inputs]
        out = [(t.name, self._idents[t.uid]) for t in self.outputs]
        return _Parts(
            self.name, self.arch, self.cuda_source, self.launches, self.buffers, io, out,
            self.constants, self.binaries, self.plan, self.versions, self.metadata,
        )  # fmt: skip

    def save(self, path: str | Path) -> Path:
        """Write this graph as an artifact at ``path`` (atomically); returns the path."""
        path = Path(path)
        manifest, blobs = _encode(self._parts())
        artifact_format.write(path, manifest, blobs)
        return path

    def dumps(self) -> bytes:
        """The artifact's bytes (what :meth:`save` writes)."""
        return artifact_format.dumps(*_encode(self._parts()))

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return (loads, (self.dumps(),))


def _cc(arch: str) -> tuple[int, int]:
    """(major, minor) of ``sm_XY`` (``sm_100`` → (10, 0))."""
    digits = arch.removeprefix("sm_").removeprefix("compute_").rstrip("af")
    return (int(digits[:-1] or 0), int(digits[-1:] or 0)) if digits.isdigit() else (0, 0)


def _arg_json(a: str | ScalarArg) -> Any:
    return a if isinstance(a, str) else {"value": a.value, "ctype": a.ctype}


def _encode(p: _Parts) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest and blobs of ``p`` (see :mod:`polyfuse.artifact_format`)."""
    blobs: dict[str, bytes] = {"source.cu": p.cuda_source.encode()}
    binaries = {}
    for arch, b in sorted(p.binaries.items()):
        blobs[f"cubin/{arch}"] = bytes(b.image)
        if b.ptx:
            blobs[f"ptx/{arch}"] = b.ptx.encode()
        binaries[arch] = {
            "output": b.output,
            "compiler": b.compiler,
            "compiler_version": b.compiler_version,
            "options": list(b.options),
            "resources": {k: asdict(r) for k, r in b.resources.items()},
        }
    constants = []
    for ident, a in p.constants.items():
        blobs[f"constant/{ident}"] = a.tobytes()
        constants.append({"buffer": ident, "dtype": a.dtype.str, "shape": list(a.shape)})
    manifest = {
        "name": p.name,
        "arch": p.arch,
        "versions": {**p.versions, "format": FORMAT_VERSION, "store": STORE_FORMAT},
        "launches": [
            {
                "kernel": lc.kernel,
                "function": lc.function,
                "grid": list(lc.grid),
                "block": list(lc.block),
                "shared_bytes": lc.shared_bytes,
                "args": [_arg_json(a) for a in lc.args],
            }
            for lc in p.launches
        ],
        "buffers": [asdict(b) | {"shape": list(b.shape)} for b in p.buffers],
        "inputs": [{"name": n, "buffer": b} for n, b in p.inputs],
        "outputs": [{"name": n, "buffer": b} for n, b in p.outputs],
        "constants": constants,
        "binaries": binaries,
        "plan": p.plan.to_json(),
        "metadata": p.metadata,
    }
    return manifest, blobs


def _arg(a: Any) -> str | ScalarArg:
    if isinstance(a, str):
        return a
    if a["ctype"] not in _SCALAR_CTYPES:
        raise ValueError(f"scalar argument of type {a['ctype']!r}")
    value = float(a["value"]) if a["ctype"] == "float" else int(a["value"])
    return ScalarArg(value, a["ctype"])


def _decode(d: artifact_format.Decoded, path: Path | None) -> LoadedGraph:
    m, blobs = d.manifest, d.blobs
    binaries = {}
    for arch, b in m["binaries"].items():
        ptx = blobs.get(f"ptx/{arch}")
        binaries[arch] = CudaBinary(
            arch=arch,
            compiler=b["compiler"],
            output=b["output"],
            image=blobs[f"cubin/{arch}"],
            ptx=ptx.decode() if ptx is not None else None,
            resources={k: KernelResources(**r) for k, r in b["resources"].items()},
            log="",
            seconds=0.0,
            compiler_version=b["compiler_version"],
            cached=True,
            options=tuple(b["options"]),
        )
    constants = {}
    for c in m["constants"]:
        raw = blobs[f"constant/{c['buffer']}"]
        constants[c["buffer"]] = np.frombuffer(raw, np.dtype(c["dtype"])).reshape(c["shape"])
    return LoadedGraph(
        name=m["name"],
        arch=m["arch"],
        cuda_source=blobs["source.cu"].decode(),
        launches=[
            Launch(
                lc["kernel"],
                tuple(lc["grid"]),
                tuple(lc["block"]),
                tuple(_arg(a) for a in lc["args"]),
                int(lc["shared_bytes"]),
                lc["function"],
            )
            for lc in m["launches"]
        ],
        buffers=[
            BufferSpec(b["name"], tuple(b["shape"]), b["role"], b["dtype"]) for b in m["buffers"]
        ],
        inputs=[(t["name"], t["buffer"]) for t in m["inputs"]],
        outputs=[(t["name"], t["buffer"]) for t in m["outputs"]],
        constants=constants,
        binaries=binaries,
        plan=PlanSummary.from_json(m["plan"]),
        versions=m["versions"],
        metadata=m["metadata"],
        path=path,
    )


def _build(d: artifact_format.Decoded, origin: str, path: Path | None) -> LoadedGraph:
    try:
        return _decode(d, path)
    except ArtifactError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, UnicodeDecodeError) as e:
        raise ArtifactError(
            f"artifact '{origin}' is corrupt (its manifest is malformed: "
            f"{type(e).__name__} {e}): {_RESAVE}"
        ) from None


def load(path: str | Path) -> LoadedGraph:
    """Read the artifact ``fn.save(path)`` wrote; runs with the runtime alone (no islpy).

    Raises :class:`~polyfuse.errors.ArtifactError` (one line naming the file and what to do)
    for a missing, truncated, corrupt or other-format-version file.
    """
    return _build(artifact_format.read(path), str(path), Path(path))


def loads(data: bytes) -> LoadedGraph:
    """The graph in artifact bytes (:meth:`LoadedGraph.dumps`; how pickles restore)."""
    return _build(artifact_format.decode(data, "<bytes>"), "<bytes>", None)
