"""The cost model's input: a typed description of one kernel launch (never its CUDA text).

:class:`Mix` counts what one thread executes, by the classes the model prices: issue slots,
FP32 work (FFMA, FMUL, FADD), tensor-core mma instructions, special functions, and the bytes
one thread moves through each memory path (shared loads and stores, global loads, stores and
asynchronous copies, local spills), barriers and warp shuffles. :class:`KernelDesc` adds the
launch (blocks, threads), the resources that set occupancy (registers, shared bytes), the
DRAM bytes isl counted, the bytes the SMs fetch from L2 where known, and where the mix came
from (:attr:`KernelDesc.source`):

- ``SASS`` — counted by the SASS instrument from the cubin
  (:func:`polyfuse.cuda.codegen.kernel_cost.describe_sass`);
- ``kernel IR estimate`` — counted on the lowered kernel IR, statement by statement
  (:func:`polyfuse.cuda.codegen.kernel_cost.ir_work`), when no disassembler is installed or no cubin
  exists yet;
- ``GEMM tile estimate`` — from the sizes of a GEMM tiling before any kernel exists
  (:mod:`polyfuse.poly.costs.gemm`);
- ``stream estimate`` — a memory-bound kernel from its element counts
  (:func:`polyfuse.poly.costs.stream.stream_desc`).

Both are plain data with a JSON form (``to_json`` / ``from_json``): the calibration data file
stores descriptions, and the compile cache stores a kernel's IR work estimate in its facts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

#: Mix fields that count instructions (issue slots or FP32 operations) per thread.
COUNTS = ("slots", "ints", "ffma", "fmul", "fadd", "mufu", "bar", "shfl", "mma")
#: Mix fields that count bytes one thread moves per memory path.
BYTES = ("lds", "sts", "ldg", "stg", "ldgsts", "local", "l1")


@dataclass(frozen=True)
class Mix:
    """What one thread executes over the whole kernel (or one loop iteration): instruction
    slots and the bytes it moves per memory path. Counts are floats (loops scale them)."""

    slots: float = 0.0  # every issued instruction (warp instruction slots per thread)
    ints: float = 0.0  # of those, integer, address and predicate arithmetic
    ffma: float = 0.0
    fmul: float = 0.0
    fadd: float = 0.0
    mufu: float = 0.0  # special-function unit (exp, rsqrt, ...)
    bar: float = 0.0  # block barriers
    shfl: float = 0.0  # warp shuffles / votes
    #: tensor-core ``mma.sync`` (HMMA/IMMA) instructions, each
    #: :data:`polyfuse.poly.device.MMA_FMA_PER_INSTRUCTION` 16-bit-rate multiply-adds per warp
    mma: float = 0.0
    lds: float = 0.0  # bytes loaded from shared memory
    sts: float = 0.0  # bytes stored to shared memory
    ldg: float = 0.0  # bytes loaded from global memory (through L1)
    stg: float = 0.0  # bytes stored to global memory
    ldgsts: float = 0.0  # bytes copied global -> shared asynchronously (cp.async)
    local: float = 0.0  # bytes of local-memory (spill) traffic
    #: bytes of L1 wavefronts beyond the global bytes moved: a request whose lanes use part of
    #: a 128-byte line costs the whole line (a tile copy's rows shorter than a warp's request)
    l1: float = 0.0

    @property
    def fp32(self) -> float:
        """FP32 pipe instructions (FFMA, FMUL, FADD)."""
        return self.ffma + self.fmul + self.fadd

    @property
    def flops(self) -> float:
        """Floating-point operations (an FFMA counts two)."""
        return 2 * self.ffma + self.fmul + self.fadd

    @property
    def shared_bytes(self) -> float:
        """Bytes through the shared-memory pipe (loads, stores and async-copy writes)."""
        return self.lds + self.sts + self.ldgsts

    @property
    def global_bytes(self) -> float:
        """Bytes through L1 to or from global (or local) memory."""
        return self.ldg + self.stg + self.ldgsts + self.local

    @property
    def global_read_bytes(self) -> float:
        return self.ldg + self.ldgsts

    def scaled(self, k: float) -> Mix:
        return Mix(**{f.name: getattr(self, f.name) * k for f in fields(self)})

    def __add__(self, other: Mix) -> Mix:
        return Mix(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def to_json(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in asdict(self).items() if v}

    @classmethod
    def from_json(cls, d: dict[str, float]) -> Mix:
        return cls(**d)

    def __str__(self) -> str:
        parts = [f"{self.slots:.0f} slots", f"FP32 {self.fp32:.0f} ({self.ffma:.0f} FFMA)"]
        for name in BYTES:
            v = getattr(self, name)
            if v:
                parts.append(f"{name.upper()} {v:.0f} B")
        if self.bar:
            parts.append(f"BAR {self.bar:.0f}")
        if self.mma:
            parts.append(f"MMA {self.mma:.0f}")
        return ", ".join(parts)


@dataclass(frozen=True)
class KernelDesc:
    """One kernel launch as the cost model sees it (see the module doc)."""

    name: str
    source: str  # where the mix came from: "SASS ...", "kernel IR estimate", ...
    blocks: int
    threads: int  # per block
    registers: int  # per thread (ptxas's count, or an estimate)
    shared_bytes: int  # per block, static + dynamic
    mix: Mix  # per thread, the whole kernel along its costliest path
    bytes_read: int = 0  # distinct global bytes (isl footprints): the DRAM traffic
    bytes_written: int = 0
    vector_bytes: int = 0  # of those, moved by 128-bit accesses
    #: global bytes one thread keeps in flight (the loads of one hot-loop iteration)
    inflight_bytes: float = 0.0
    #: distinct global bytes one block reads (isl), None when unknown: a block whose reads
    #: exceed the L1 streams them from L2 (no reuse between blocks)
    block_read_bytes: int | None = None
    #: of ``block_read_bytes``, those filled by 16-byte ``cp.async`` (``cp.async.cg``, SASS
    #: ``LDGSTS.E.BYPASS.128``): they bypass the L1, so every block fetches its own from L2
    #: even where a block before it on the same SM read the same bytes
    block_bypass_bytes: int = 0
    #: global bytes later parts of a stitched kernel read again past the L1 (an input several
    #: parts read, not staged in shared memory): read once more, beside ``bytes_read``
    reread_bytes: int = 0
    barriers: bool = False  # the block waits at barriers (its phases do not overlap)
    #: loop iterations per thread that wait at a barrier for their own synchronous global
    #: loads (a single-stage shared-tile fill): each exposes a load latency to its block
    sync_phases: float = 0.0
    spills: int = 0  # bytes of spill stores + loads per thread (ptxas)
    parts: int = 1  # kernels one launch runs (a Layer 3 pack)
    notes: tuple[str, ...] = ()
    #: of ``mix``, what a tensor-core kernel's thread runs outside its k-step loops (the
    #: first fills, the epilogue): it does not overlap the block's own mma instructions
    tail: Mix | None = None

    @property
    def warps(self) -> int:
        return -(-self.threads // 32)

    @property
    def flops(self) -> float:
        return self.mix.flops * self.threads * self.blocks

    @property
    def dram_bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["mix"] = self.mix.to_json()
        d["notes"] = list(self.notes)
        d["tail"] = self.tail.to_json() if self.tail is not None else None
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> KernelDesc:
        d = dict(d)
        d["mix"] = Mix.from_json(d["mix"])
        d["notes"] = tuple(d.get("notes", ()))
        if d.get("tail") is not None:
            d["tail"] = Mix.from_json(d["tail"])
        return cls(**d)

    def with_(self, **kw: Any) -> KernelDesc:
        return replace(self, **kw)


@dataclass(frozen=True)
class LaunchDesc:
    """One launch running ``parts`` side by side (a Layer 3 pack; one part: a plain kernel):
    every block has ``threads`` threads (the padded block), part ``i`` owns ``blocks[i]`` of
    them, and the launch's occupancy follows ``registers`` and ``shared_bytes``."""

    parts: tuple[KernelDesc, ...]
    blocks: tuple[int, ...]
    threads: int
    registers: int
    shared_bytes: int
    notes: tuple[str, ...] = field(default=())

    @classmethod
    def single(cls, d: KernelDesc) -> LaunchDesc:
        return cls((d,), (d.blocks,), d.threads, d.registers, d.shared_bytes)

    @property
    def grid(self) -> int:
        return sum(self.blocks)

    @property
    def name(self) -> str:
        return "+".join(p.name for p in self.parts)

    def pairs(self) -> list[tuple[KernelDesc, int]]:
        """(part, its blocks) of every part."""
        return list(zip(self.parts, self.blocks, strict=True))


@dataclass(frozen=True)
class Work:
    """A kernel's per-thread work as estimated on its IR (a lowering fact, cached with the
    kernel): the mix along the costliest path, the global bytes one thread keeps in flight
    (one loop iteration's loads) and why parts of it are approximate."""

    mix: Mix
    inflight_bytes: float = 0.0
    notes: tuple[str, ...] = ()
    sync_phases: float = 0.0  # see KernelDesc.sync_phases
    tail: Mix | None = None  # see KernelDesc.tail

    def to_json(self) -> dict[str, Any]:
        return {
            "mix": self.mix.to_json(),
            "inflight_bytes": round(self.inflight_bytes, 3),
            "notes": list(self.notes),
            "sync_phases": self.sync_phases,
            "tail": self.tail.to_json() if self.tail is not None else None,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Work:
        tail = d.get("tail")
        return cls(
            Mix.from_json(d["mix"]),
            d.get("inflight_bytes", 0.0),
            tuple(d.get("notes", ())),
            d.get("sync_phases", 0.0),
            Mix.from_json(tail) if tail is not None else None,
        )
