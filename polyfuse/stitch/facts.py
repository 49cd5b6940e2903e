"""Typed facts of a lowered kernel: what Layer 3 and the cost models read instead of its text.

Lowering records them from the final kernel IR
(:func:`polyfuse.cuda.codegen.lower_facts.kernel_facts`):
the static ``__shared__`` arrays (bytes and alignment, in declaration order), the dynamic
shared memory the launch passes, a register estimate where a model has one, whether the body
waits at barriers, uses warp shuffles, tensor-core ``mma`` or asynchronous copies, and which
launch axes it reads, and its per-thread work as estimated on the IR (:attr:`KernelFacts.work`,
the cost model's instruction mix where no SASS is at hand). A Layer 3 pack's facts follow
from its parts' (:func:`pack_facts`). The compile cache stores them
(:meth:`KernelFacts.to_json`), so a kernel served from the cache carries the same facts as
one generated now.

Static shared memory is laid out the way ptxas lays it out (checked against its report for
every kernel of the examples, the suite and the zoo): each array at the next multiple of its
alignment after the previous one, in declaration order. The arrays of a pack's parts are
distinct variables, one after the other (ptxas does not overlay them); the dynamic pool is
one region every part's ``extern __shared__`` names, so the pack needs the largest.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from polyfuse.poly.costs import Work


@dataclass(frozen=True)
class SharedArray:
    """One static ``__shared__`` array: its size and alignment in bytes."""

    bytes: int
    align: int


def shared_layout(arrays: tuple[SharedArray, ...]) -> int:
    """Bytes of static shared memory ``arrays`` take, each placed at the next multiple of its
    alignment after the previous one (declaration order, as ptxas does)."""
    end = 0
    for a in arrays:
        end = -(-end // a.align) * a.align + a.bytes
    return end


@dataclass(frozen=True)
class KernelFacts:
    """What lowering knows of one kernel (see the module doc). ``registers``: an estimate
    (the GEMM tile model's), None where no model estimates it; ptxas's count, once the CUDA
    compiler ran, is :attr:`polyfuse.cuda.codegen.kernel_ast.Kernel.registers`."""

    shared_arrays: tuple[SharedArray, ...] = ()
    dynamic_shared_bytes: int = 0
    registers: int | None = None
    barriers: bool = False  # __syncthreads / __syncwarp (barrier nodes, block combines)
    shuffles: bool = False  # warp shuffles (a warp combine)
    mma: bool = False  # warp-wide tensor-core instructions
    async_copies: bool = False  # cp.async with commit / wait
    axes: tuple[str, ...] = ("x",)  # launch axes the body reads (blockIdx / threadIdx)
    parts: int = 1  # kernels this launch runs (a Layer 3 pack: several)
    #: per-thread work estimated on the IR (polyfuse.cuda.codegen.kernel_cost.ir_work); a pack: its
    #: costliest part's (each block runs one part); None for a kernel written by hand
    work: Work | None = None

    @property
    def static_shared_bytes(self) -> int:
        """Static ``__shared__`` bytes (what ptxas reports as ``smem``)."""
        return shared_layout(self.shared_arrays)

    @property
    def shared_bytes(self) -> int:
        """Shared memory one block uses: static plus dynamic."""
        return self.static_shared_bytes + self.dynamic_shared_bytes

    @property
    def collective(self) -> bool:
        """Whether the threads of a block act together (barriers, warp-wide instructions,
        asynchronous copies, or shared memory they share): such a kernel keeps its whole
        block, whatever launch it runs in."""
        return (
            self.barriers or self.shuffles or self.mma or self.async_copies or self.shared_bytes > 0
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable form (the compile cache's)."""
        d = asdict(self)
        d["shared_arrays"] = [[a.bytes, a.align] for a in self.shared_arrays]
        d["axes"] = list(self.axes)
        d["work"] = self.work.to_json() if self.work is not None else None
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> KernelFacts:
        """The facts :meth:`to_json` wrote."""
        d = dict(d)
        d["shared_arrays"] = tuple(SharedArray(b, a) for b, a in d["shared_arrays"])
        d["axes"] = tuple(d["axes"])
        d["work"] = Work.from_json(d["work"]) if d.get("work") else None
        return cls(**d)


def pack_facts(parts: list[KernelFacts]) -> KernelFacts:
    """The facts of one launch running ``parts`` (in dispatch order): their static arrays one
    after the other, the largest dynamic pool and register estimate, any part's
    synchronisation."""
    regs = [p.registers for p in parts]
    works = [p.work for p in parts if p.work is not None]
    work = max(works, key=lambda w: w.mix.slots) if len(works) == len(parts) and works else None
    return KernelFacts(
        shared_arrays=tuple(a for p in parts for a in p.shared_arrays),
        dynamic_shared_bytes=max((p.dynamic_shared_bytes for p in parts), default=0),
        registers=None if None in regs else max(regs, default=None),  # type: ignore[type-var]
        barriers=any(p.barriers for p in parts),
        shuffles=any(p.shuffles for p in parts),
        mma=any(p.mma for p in parts),
        async_copies=any(p.async_copies for p in parts),
        axes=tuple(sorted({a for p in parts for a in p.axes})),
        parts=sum(p.parts for p in parts),
        work=work,
    )
