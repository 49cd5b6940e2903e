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
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from polyfuse.cuda.codegen.kernel_ast import Kernel
from polyfuse.cuda.codegen.layer3 import kernel_accesses
from polyfuse.cuda.runtime.launch import Launch
from polyfuse.errors import CompilerNotFound
from polyfuse.graph.dtypes import register_dtype
from polyfuse.graph.expr import Tensor
from polyfuse.runner import BufferSpec, GraphRunner
from polyfuse.stitch.order import dependence_order

__all__ = [
    "BufferSpec",
    "CompiledGraph",
    "kernel_accesses",
    "kernel_order",
    "plan_buffers",
    "plan_summary",
]

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


def _buffer_dtype(graph, ident: str) -> str:
    """The dtype of the buffer behind a kernel parameter (an accumulator holds its result's
    register dtype: float32 for 16-bit floats)."""
    if ident in graph.prims:
        return graph.prims[ident].tensor.dtype
    if ident.endswith("_acc") and ident[:-4] in graph.prims:
        return register_dtype(graph.prims[ident[:-4]].tensor.dtype)
    return "float32"


def kernel_order(kernels: list[Kernel]) -> list[int]:
    """Indices of ``kernels`` in a launch order that follows the dependences between them,
    computed from the buffers each kernel reads (``const`` pointers) and writes."""
    return dependence_order(kernel_accesses(kernels), [k.name for k in kernels])


def plan_buffers(graph, kernels: list[Kernel]) -> tuple[list[BufferSpec], list[Launch]]:
    """Buffers every kernel parameter refers to, and the launches in dependence order
    (:func:`kernel_order`)."""
    ins = {graph.ident(t) for t in graph.inputs}
    outs = {graph.ident(t) for t in graph.outputs}
    specs: dict[str, BufferSpec] = {}
    for t in graph.inputs:  # graph inputs include constants (weights)
        specs[graph.ident(t)] = BufferSpec(graph.ident(t), t.shape, "input", t.dtype)
    for t in graph.outputs:
        specs[graph.ident(t)] = BufferSpec(graph.ident(t), t.shape, "output", t.dtype)
    launches = []
    for k in (kernels[i] for i in kernel_order(kernels)):
        for p in k.params:
            if p.tensor and p.tensor not in specs:
                role = "output" if p.tensor in outs else "intermediate"
                role = "input" if p.tensor in ins else role
                shape, dtype = _buffer_shape(graph, p.tensor), _buffer_dtype(graph, p.tensor)
                specs[p.tensor] = BufferSpec(p.tensor, shape, role, dtype)
        launches.append(
            Launch(
                k.name,
                k.grid,
                k.block,
                tuple(p.tensor or p.name for p in k.params),  # buffers, by tensor
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


def plan_summary(plan: Any, kernels: list[Kernel]) -> Any:
    """The :class:`~polyfuse.artifact.PlanSummary` of a plan (None: no plan): its text, kernels,
    micrographs and decisions, without the isl objects."""
    from polyfuse.artifact import KernelSummary, MicrographSummary, PlanSummary

    ks = tuple(
        KernelSummary(
            name=k.name,
            function=k.function,
            grid=tuple(k.grid),
            block=tuple(k.block),
            shared_bytes=k.shared_bytes,
            dynamic_shared_bytes=k.dynamic_shared_bytes,
            micrographs=tuple(k.micrographs),
            registers=k.registers,
            bytes_read=k.bytes_read,
            bytes_written=k.bytes_written,
        )
        for k in kernels
    )
    if plan is None:
        return PlanSummary(kernels=ks)
    mgs = tuple(MicrographSummary(m.name, m.kind.value, tuple(m.prims)) for m in plan.micrographs)
    return PlanSummary(str(plan), ks, mgs, tuple(str(d) for d in plan.records()))


class CompiledGraph(GraphRunner):
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
        self._init_runner()
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
        from polyfuse.cuda.toolchain.compiler import compile_cuda

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

    # ------------------------------------------------------------------ artifacts
    def artifact(
        self, archs: Sequence[str] | None = None, metadata: dict[str, Any] | None = None
    ) -> Any:
        """This graph as a :class:`~polyfuse.artifact.LoadedGraph` (what :meth:`save` writes):
        its cubins compiled now with NVRTC/nvcc for ``archs`` (default: the compile's arch;
        ``()``: none — a GPU then compiles the CUDA source where it runs, which needs NVRTC
        there). ``metadata``: JSON the artifact carries for its user."""
        from polyfuse.cuda.toolchain.compiler import SUPPORTED_ARCHS, compile_cuda
        from polyfuse.errors import ArtifactError

        archs = (self.arch,) if archs is None else tuple(archs)
        binaries = {}
        for arch in dict.fromkeys(archs):
            if arch not in SUPPORTED_ARCHS:
                raise ArtifactError(
                    f"{self.name}: cannot save for unknown arch '{arch}'; use any of "
                    f"{', '.join(SUPPORTED_ARCHS)}"
                )
            b = self.cuda_binaries.get(arch)
            if b is None or b.output != "cubin":
                try:
                    b = compile_cuda(self.cuda_source, arch, output="cubin")
                except CompilerNotFound as e:
                    raise CompilerNotFound(
                        f"{self.name}: cannot build the {arch} cubin to save ({e}); "
                        "fn.save(path, archs=()) saves the CUDA source only"
                    ) from None
            binaries[arch] = b
        return self._artifact(binaries, metadata)

    def _artifact(self, binaries: dict[str, Any], metadata: dict[str, Any] | None) -> Any:
        from polyfuse.artifact import LoadedGraph

        idents = self._idents
        return LoadedGraph(
            name=self.name,
            arch=self.arch,
            cuda_source=self.cuda_source,
            launches=self.launches,
            buffers=self.buffers,
            inputs=[(t.name, idents[t.uid]) for t in self.inputs],
            outputs=[(t.name, idents[t.uid]) for t in self.outputs],
            constants=self.constants,
            binaries=binaries,
            plan=plan_summary(self.plan, self.kernels),
            metadata=metadata,
        )

    def save(
        self,
        path: str | os.PathLike,
        archs: Sequence[str] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Path:
        """Save this graph as one file that ``polyfuse.load(path)`` runs without the compiler
        (:mod:`polyfuse.artifact`): CUDA source, a cubin per arch in ``archs`` (default: the
        compile's arch, compiled now with NVRTC), launches, buffers, constants, the plan
        summary, versions and checksums. Returns the path."""
        return self.artifact(archs, metadata).save(Path(path))

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        """Pickling keeps what runs: the artifact (with the cubins already built, no new
        compile), so an unpickled graph is a :class:`~polyfuse.artifact.LoadedGraph` — called
        the same way, with the plan as a summary. The isl objects of the plan do not pickle."""
        from polyfuse.artifact import loads

        cubins = {a: b for a, b in self.cuda_binaries.items() if b.output == "cubin"}
        return (loads, (self._artifact(cubins, None).dumps(),))

    def __copy__(self) -> CompiledGraph:
        """A shallow copy is still a compiled graph (only pickling goes through the artifact)."""
        other = type(self).__new__(type(self))
        other.__dict__.update(self.__dict__)
        return other

    # ------------------------------------------------------------------ report
    def visualize(self, path: str | os.PathLike = "report.html", json_path=None) -> Path:
        """Write the scheduling debug report (self-contained HTML, :mod:`polyfuse.viz`) to
        ``path`` (default ``report.html``), its data as JSON to ``json_path`` when given;
        returns the absolute path of the HTML file, to open in a browser."""
        from polyfuse.viz import visualize

        visualize(self, path, json_path)
        return Path(path).resolve()

    # ------------------------------------------------------------------ measurements
    def global_bytes(self) -> int:
        """Distinct global bytes all kernels move, computed exactly by isl (no emulation)."""
        return sum(k.bytes_read + k.bytes_written for k in self.kernels)
