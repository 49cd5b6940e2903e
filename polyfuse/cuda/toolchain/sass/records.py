"""Typed results of the SASS instrument and their printed forms.

:class:`KernelSass` (one kernel on one arch) and :class:`SassReport` (a translation unit) print
as blocks of text and a table (:func:`format_table`, columns :data:`TABLE_COLUMNS`: the hot
loop's counts per iteration, resources, occupancy, estimate); ``to_dict()`` gives the JSON
form that ``polyfuse sass --json`` and ``benchmarks/sass.py`` write.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from polyfuse.cuda.toolchain.compiler import KernelResources
from polyfuse.cuda.toolchain.sass.loops import HotLoop, Loop
from polyfuse.cuda.toolchain.sass.mix import InstrMix
from polyfuse.cuda.toolchain.sass.parse import SassFunction
from polyfuse.poly.device import Occupancy

__all__ = [
    "TABLE_COLUMNS",
    "Estimate",
    "KernelSass",
    "Launch",
    "SassReport",
    "VectorAccess",
    "VectorCheck",
    "format_kernel",
    "format_report",
    "format_table",
    "table_row",
]


@dataclass(frozen=True)
class Launch:
    """A kernel's launch shape: grid and block (x, y, z) and dynamic shared bytes."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_smem: int = 0

    @property
    def blocks(self) -> int:
        return math.prod(self.grid)

    @property
    def threads(self) -> int:
        return math.prod(self.block)

    def __str__(self) -> str:
        return f"grid {self.blocks} x block {self.threads}"


@dataclass
class Estimate:
    """Issue-bound time of one kernel launch (a model; see the module doc)."""

    us: float
    bound: str  # "issue", "FP32 pipe", "tensor pipe" or "shared memory"
    bounds_us: dict[str, float]
    blocks_per_sm_run: int  # blocks the busiest SM runs (ceil(blocks / SMs))
    waves: float  # blocks / (resident blocks per SM x SMs)
    assumptions: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        us = f"{self.us:.1f}" if self.us >= 10 else f"{self.us:.3g}"
        return f"{us} us {self.bound}-bound ({self.waves:.2f} waves)"


@dataclass(frozen=True)
class VectorAccess:
    """One vector source line (a ``float4``, or a ``uint4``/``uint2`` word of 16-bit
    elements) and the memory instructions ptxas emitted for it."""

    line: int
    text: str
    sass: tuple[str, ...]  # opcodes of the memory instructions at this line
    bits: int = 128  # the word's width
    word: str = "float4"

    @property
    def ok(self) -> bool:
        """Every memory instruction of the line moves the word's bits. A line without any
        (ptxas reused the registers of an identical earlier load) makes no access to check."""
        return all(moves(op, self.bits) for op in self.sass)

    def __str__(self) -> str:
        counts = Counter(self.sass)
        got = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in counts.items())
        got = got or "no memory instruction (an identical earlier access reused)"
        flag = "" if self.ok else f"  <-- not {self.bits}-bit"
        return f"line {self.line}: {got}{flag}  | {self.text}"


def moves(opcode: str, bits: int) -> bool:
    """Whether a memory instruction moves ``bits`` per thread (its ``.128``/``.64`` suffix)."""
    return str(bits) in opcode.split(".")[1:]


@dataclass
class VectorCheck:
    """The float4 check of one kernel: ``expected`` vector accesses in the kernel IR, the
    ``float4`` lines of its source with their SASS, and ``problems`` (empty: passed)."""

    expected: int
    accesses: list[VectorAccess]
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        head = (
            f"float4 check: {self.expected} vector accesses in the IR, "
            f"{len(self.accesses)} float4 lines: {'ok' if self.ok else 'FAILED'}"
        )
        return "\n".join([head, *(f"  {a}" for a in self.accesses), *self.problems])


@dataclass
class KernelSass:
    """What the SASS of one kernel says (see the module doc); ``sass`` is the parsed function."""

    kernel: str
    function: str
    arch: str
    resources: KernelResources | None
    launch: Launch | None
    occupancy: Occupancy | None
    hot: HotLoop
    loops: list[Loop]
    per_thread: InstrMix
    estimate: Estimate | None
    vector: VectorCheck | None = None
    notes: list[str] = field(default_factory=list)
    sass: SassFunction | None = field(default=None, repr=False)

    @property
    def shared_bytes(self) -> int:
        """Static (ptxas) plus dynamic (launch) shared memory per block."""
        static = self.resources.shared_bytes if self.resources else 0
        return static + (self.launch.dynamic_smem if self.launch else 0)

    def to_dict(self) -> dict[str, Any]:
        r = self.resources
        hot = self.hot
        out: dict[str, Any] = {
            "kernel": self.kernel,
            "function": self.function,
            "arch": self.arch,
            "registers": r.registers if r else None,
            "spill_stores": r.spill_stores if r else None,
            "spill_loads": r.spill_loads if r else None,
            "stack_frame": r.stack_frame if r else None,
            "static_smem": r.shared_bytes if r else None,
            "dynamic_smem": self.launch.dynamic_smem if self.launch else None,
            "launch": (
                {"grid": list(self.launch.grid), "block": list(self.launch.block)}
                if self.launch
                else None
            ),
            "occupancy": (
                {
                    "blocks_per_sm": self.occupancy.blocks_per_sm,
                    "limiter": self.occupancy.limiter,
                    "warps_per_sm": self.occupancy.warps_per_sm,
                    "fraction": round(self.occupancy.fraction, 4),
                    "limits": dict(self.occupancy.limits),
                }
                if self.occupancy
                else None
            ),
            "hot_loop": {
                "kind": hot.kind,
                "header": f"0x{hot.loop.header:04x}" if hot.loop else None,
                "depth": hot.loop.depth if hot.loop else 0,
                "trip": hot.loop.trip.iterations if hot.loop else 1,
                "trip_how": hot.loop.trip.how if hot.loop else "no loop",
                "iterations_per_thread": hot.iterations,
                "per_iteration": hot.mix.to_dict(),
                "per_iteration_all_paths": hot.loop.static.to_dict() if hot.loop else None,
                "inner": (
                    {
                        "header": f"0x{hot.inner.header:04x}",
                        "trip": hot.inner.trip.iterations,
                        "trip_how": hot.inner.trip.how,
                        "per_iteration": hot.inner_mix.to_dict() if hot.inner_mix else None,
                    }
                    if hot.inner
                    else None
                ),
                "notes": list(hot.notes),
            },
            "loops": [
                {
                    "header": f"0x{lp.header:04x}",
                    "depth": lp.depth,
                    "blocks": len(lp.blocks),
                    "trip": lp.trip.iterations,
                    "trip_how": lp.trip.how,
                    "parent": f"0x{self.loops[lp.parent].header:04x}"
                    if lp.parent is not None
                    else None,
                    "per_iteration": lp.mix.to_dict(),
                    "per_iteration_all_paths": lp.static.to_dict(),
                }
                for lp in self.loops
            ],
            "per_thread": self.per_thread.to_dict(),
            "estimate": (
                {
                    "us": round(self.estimate.us, 3),
                    "bound": self.estimate.bound,
                    "bounds_us": {k: round(v, 3) for k, v in self.estimate.bounds_us.items()},
                    "waves": round(self.estimate.waves, 3),
                    "assumptions": list(self.estimate.assumptions),
                }
                if self.estimate
                else None
            ),
            "notes": list(dict.fromkeys(self.notes)),
        }
        if self.vector is not None:
            out["vector_check"] = {
                "ok": self.vector.ok,
                "expected": self.vector.expected,
                "lines": [
                    {"line": a.line, "source": a.text, "sass": list(a.sass), "ok": a.ok}
                    for a in self.vector.accesses
                ],
                "problems": list(self.vector.problems),
            }
        return out

    def __str__(self) -> str:
        return format_kernel(self)


@dataclass
class SassReport:
    """The instrument's result for one translation unit: a :class:`KernelSass` per kernel
    and arch, with the tools that made it."""

    name: str
    kernels: list[KernelSass]
    disassembler: str
    compiler: dict[str, str]  # arch -> compiler and version

    def for_arch(self, arch: str) -> list[KernelSass]:
        return [k for k in self.kernels if k.arch == arch]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "disassembler": self.disassembler,
            "compiler": dict(self.compiler),
            "kernels": [k.to_dict() for k in self.kernels],
        }

    def __str__(self) -> str:
        return format_report(self)


# ---------------------------------------------------------------------------- printing


TABLE_COLUMNS = (
    "kernel", "arch", "loop", "iters", "instr", "FFMA", "FFMA%", "FMUL/FADD", "HMMA",
    "LDS 32/64/128", "STS", "LDG", "STG", "LDGSTS", "BAR", "int", "branch", "pred-off", "MOV",
    "other", "regs", "spill", "smem", "blocks/SM (limit)", "estimate",
)  # fmt: skip


def _n(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.1f}"


def _us(x: float) -> str:
    return f"{x:.1f}" if x >= 10 else f"{x:.3g}"


def _widths(mix: InstrMix, cls: str) -> str:
    """``n`` when every access of ``cls`` is 32-bit, else ``n32/n64/n128`` style parts."""
    w = mix.widths.get(cls, {})
    if not w:
        return "0"
    if set(w) == {32}:
        return _n(w[32])
    return " ".join(f"{_n(n)}x{b}" for b, n in sorted(w.items(), reverse=True))


def table_row(k: KernelSass) -> list[str]:
    """The :data:`TABLE_COLUMNS` cells of one kernel."""
    m = k.hot.mix
    r = k.resources
    lds = "/".join(_n(m.width("LDS", b)) for b in (32, 64, 128))
    if m.widths.get("LDS") and set(m.widths["LDS"]) - {32, 64, 128}:
        lds += "+"
    loop = k.hot.kind + (f"+kk{k.hot.inner.trip.iterations or '?'}" if k.hot.inner else "")
    other = m["other"] + m["FP other"] + m["MUFU"] + m["LDC"] + m["DEPBAR"] + m["warp"]
    other += m["local"] + m["generic"] + m["atomic"] + m["LDSM"]
    occ = f"{k.occupancy.blocks_per_sm} ({k.occupancy.limiter})" if k.occupancy else "-"
    est = f"{_us(k.estimate.us)} us {k.estimate.bound}" if k.estimate else "-"
    spill = f"{r.spill_stores}/{r.spill_loads}" if r else "-"
    return [
        k.kernel,
        k.arch,
        loop,
        str(k.hot.iterations) if k.hot.iterations is not None else "?",
        _n(m.total),
        _n(m["FFMA"]),
        f"{m.ffma_share:.0%}",
        f"{_n(m['FMUL'])}/{_n(m['FADD'])}",
        _n(m["HMMA"]),
        lds,
        _widths(m, "STS"),
        _widths(m, "LDG"),
        _widths(m, "STG"),
        _widths(m, "LDGSTS"),
        _n(m["BAR"]),
        _n(m["int"]),
        _n(m["branch"]),
        _n(m["predicated-off"]),
        _n(m["MOV"]),
        _n(other),
        str(r.registers) if r else "-",
        spill,
        str(k.shared_bytes),
        occ,
        est,
    ]


def format_table(kernels: Sequence[KernelSass], columns: Sequence[str] = TABLE_COLUMNS) -> str:
    """A fixed-width table of ``kernels`` (one row each, hot-loop counts per iteration)."""
    rows = [list(columns)] + [table_row(k) for k in kernels]
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_kernel(k: KernelSass) -> str:
    """Several lines on one kernel: resources, occupancy, hot loop, estimate, float4 check."""
    r = k.resources
    out = [f"{k.kernel} ({k.function}, {k.arch})"]
    if r is not None:
        dyn = k.launch.dynamic_smem if k.launch else 0
        out.append(
            f"  {r.registers} registers, spills {r.spill_stores}/{r.spill_loads} B (st/ld), "
            f"stack {r.stack_frame} B, shared {r.shared_bytes} B static + {dyn} B dynamic"
        )
    if k.launch is not None:
        out.append(f"  launch: {k.launch}; occupancy: {k.occupancy or '-'}")
    h = k.hot
    if h.loop is None:
        out.append(f"  no loop: whole body, {h.mix}")
    else:
        it = h.iterations if h.iterations is not None else "?"
        out.append(
            f"  hot loop: {h.kind} loop @0x{h.loop.header:04x} (depth {h.loop.depth}), trip "
            f"{h.loop.trip}, {it} iterations per thread"
        )
        out.append(f"    per iteration (costliest path): {h.mix}")
        if h.loop.static.total != h.mix.total:
            out.append(f"    every path (diverged warps): {h.loop.static}")
        if h.inner is not None and h.inner_mix is not None:
            out.append(f"    inner kk loop @0x{h.inner.header:04x}, trip {h.inner.trip}")
            out.append(f"      per iteration: {h.inner_mix}")
        elif h.kind == "k-tile":
            out.append("    no separate kk loop (unrolled into the k-tile loop)")
    for lp in k.loops:
        pad = "  " * lp.depth
        out.append(f"  {pad}loop @0x{lp.header:04x}, trip {lp.trip}: {lp.mix}")
    out.append(f"  per thread: {k.per_thread}")
    if k.estimate is not None:
        e = k.estimate
        bounds = ", ".join(f"{b} {v:.1f} us" for b, v in e.bounds_us.items())
        out.append(f"  estimate (modelled): {e} [{bounds}]")
        out += [f"    assumes: {a}" for a in e.assumptions]
    out += [f"  note: {n}" for n in dict.fromkeys(k.notes + h.notes)]
    if k.vector is not None:
        out += ["  " + ln for ln in str(k.vector).splitlines()]
    return "\n".join(out)


def format_report(rep: SassReport) -> str:
    """Every kernel's block, then the table of all kernels."""
    head = f"SASS of {rep.name or 'the translation unit'} ({rep.disassembler}; " + ", ".join(
        f"{a}: {c}" for a, c in rep.compiler.items()
    )
    parts = [head + ")", ""]
    for k in rep.kernels:
        parts += [str(k), ""]
    parts.append("hot loop per iteration (estimates are modelled, not measured):")
    parts.append(format_table(rep.kernels))
    return "\n".join(parts)
