"""Instruction mix: SASS instructions sorted into the classes a loop's cost depends on.

Every instruction slot falls in exactly one class of :data:`CLASSES` (a slot predicated off
for good, ``@!PT``, is ``predicated-off`` whatever its opcode: it issues and does nothing).
Memory instructions are also counted by the bits one thread moves (``LDS.128`` → 128), the
figure the float4 checks and the shared-memory bandwidth need.

Classes: the FP32 work (``FFMA``, ``FMUL``, ``FADD``), tensor-core ``HMMA`` (every MMA
opcode), other floating point (``FP other``: selects, compares, conversions, half2),
``MUFU`` (special functions), memory (``LDS``, ``STS``, ``LDG``, ``STG``, ``LDGSTS``,
``LDSM``, ``local`` = LDL/STL spills, ``generic`` = LD/ST, ``atomic``, ``LDC`` constant
loads), ``BAR``, ``DEPBAR`` (async-copy waits), ``warp`` (shuffles, votes), ``int`` (integer
and address arithmetic, uniform datapath included), ``branch`` (control flow), ``MOV``
(moves, special-register reads, constant materialisation) and ``other`` (NOP ...).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from polyfuse.cuda.toolchain.sass.parse import Instruction
from polyfuse.poly.costs import Mix

__all__ = ["CLASSES", "MEMORY", "InstrMix", "classify"]

CLASSES = (
    "FFMA", "FMUL", "FADD", "HMMA", "FP other", "MUFU",
    "LDS", "STS", "LDG", "STG", "LDGSTS", "LDSM", "local", "generic", "atomic", "LDC",
    "BAR", "DEPBAR", "warp", "int", "branch", "MOV", "predicated-off", "other",
)  # fmt: skip
#: The memory classes counted by width.
MEMORY = ("LDS", "STS", "LDG", "STG", "LDGSTS", "LDSM", "local", "generic")

_MMA = {"HMMA", "IMMA", "DMMA", "BMMA", "HGMMA", "IGMMA", "BGMMA", "QGMMA", "UTCHMMA", "UTCQMMA"}
_FP_OTHER = {
    "FSEL", "FMNMX", "FSETP", "FSET", "FCHK", "FRND", "F2F", "F2I", "I2F", "I2FP", "F2FP",
    "F2IP", "HFMA2", "HADD2", "HMUL2", "HSETP2", "HSET2", "HMNMX2", "DFMA", "DADD", "DMUL",
    "DSETP", "DMNMX", "FSWZADD", "FFMA32I", "FMUL32I", "FADD32I",
}  # fmt: skip
_INT = {
    "IMAD", "IADD3", "IADD", "IADD32I", "LEA", "SHF", "SHL", "SHR", "LOP3", "LOP", "LOP32I",
    "ISETP", "IMNMX", "VIADD", "VIADDMNMX", "VIMNMX", "VIMNMX3", "IABS", "POPC", "FLO", "BREV",
    "BMSK", "PRMT", "SEL", "SGXT", "IDP", "IMUL", "IMUL32I", "IMAD32I", "PLOP3", "P2R", "R2P",
    "ISCADD", "XMAD", "LEPC", "ICMP",
}  # fmt: skip
_MEMORY_OPS = {
    "LDS": "LDS", "STS": "STS", "LDG": "LDG", "STG": "STG", "LDGSTS": "LDGSTS",
    "LDSM": "LDSM", "LDL": "local", "STL": "local", "LD": "generic", "ST": "generic",
    "ATOM": "atomic", "ATOMS": "atomic", "ATOMG": "atomic", "RED": "atomic",
    "LDC": "LDC", "ULDC": "LDC",
}  # fmt: skip
_BRANCH = {
    "BRA", "BRX", "JMP", "JMX", "CALL", "RET", "EXIT", "BSSY", "BSYNC", "WARPSYNC", "BREAK",
    "BMOV", "KILL", "BPT", "YIELD", "NANOSLEEP", "ACQBULK", "ELECT",
}  # fmt: skip
_MOVE = {"MOV", "MOV32I", "UMOV", "CS2R", "S2R", "S2UR", "R2UR", "CS2UR", "UCS2R", "SHFL.IDX"}


def classify(ins: Instruction) -> str:
    """The class of one instruction slot (one of :data:`CLASSES`)."""
    if ins.never:
        return "predicated-off"
    base = ins.base
    if base in ("FFMA", "FMUL", "FADD"):
        return base
    if base in _MMA:
        return "HMMA"
    if base == "IMAD" and ins.modifiers[:1] == ("MOV",):
        return "MOV"
    if base == "HFMA2" and "MMA" in ins.modifiers and ins.operands[1:3] == ("-RZ", "RZ"):
        return "MOV"  # a constant materialised on the FMA pipe: 0 * 0 + (hi, lo)
    if base in _FP_OTHER:
        return "FP other"
    if base == "MUFU":
        return "MUFU"
    if base in _MEMORY_OPS:
        return _MEMORY_OPS[base]
    if base in ("BAR", "SYNCS"):
        return "BAR"
    if base in ("DEPBAR", "LDGDEPBAR", "ARRIVES"):
        return "DEPBAR"
    if base in ("SHFL", "VOTE", "VOTEU", "MATCH", "REDUX"):
        return "warp"
    if base in _INT or (base.startswith("U") and base[1:] in _INT):
        return "int"
    if base in _BRANCH:
        return "branch"
    if base in _MOVE:
        return "MOV"
    return "other"


@dataclass
class InstrMix:
    """Counts of instruction slots by class (``classes``), by width for the memory classes
    (``widths['LDS'][128]``), by base opcode (``opcodes``); ``guarded``: slots under a
    run-time predicate. Counts are floats so a mix can be scaled by trip counts."""

    classes: dict[str, float] = field(default_factory=dict)
    widths: dict[str, dict[int, float]] = field(default_factory=dict)
    opcodes: dict[str, float] = field(default_factory=dict)
    guarded: float = 0

    @classmethod
    def of(cls, instructions: Iterable[Instruction]) -> InstrMix:
        classes: Counter[str] = Counter()
        opcodes: Counter[str] = Counter()
        widths: dict[str, Counter[int]] = {}
        guarded = 0
        for ins in instructions:
            c = classify(ins)
            classes[c] += 1
            opcodes[ins.base] += 1
            guarded += ins.guarded
            if c in MEMORY:
                widths.setdefault(c, Counter())[ins.width] += 1
        return cls(
            dict(classes),
            {k: dict(v) for k, v in widths.items()},
            dict(opcodes),
            guarded,
        )

    @property
    def total(self) -> float:
        return sum(self.classes.values())

    def __getitem__(self, cls: str) -> float:
        return self.classes.get(cls, 0)

    def width(self, cls: str, bits: int) -> float:
        return self.widths.get(cls, {}).get(bits, 0)

    def share(self, cls: str) -> float:
        """The fraction of all slots in class ``cls`` (``share('FFMA')``: the FFMA share)."""
        return self[cls] / self.total if self.total else 0.0

    @property
    def ffma_share(self) -> float:
        return self.share("FFMA")

    def scaled(self, k: float) -> InstrMix:
        return InstrMix(
            {c: n * k for c, n in self.classes.items()},
            {c: {b: n * k for b, n in w.items()} for c, w in self.widths.items()},
            {o: n * k for o, n in self.opcodes.items()},
            self.guarded * k,
        )

    def __add__(self, other: InstrMix) -> InstrMix:
        classes = Counter(self.classes)
        classes.update(other.classes)
        opcodes = Counter(self.opcodes)
        opcodes.update(other.opcodes)
        widths = {c: Counter(w) for c, w in self.widths.items()}
        for c, w in other.widths.items():
            widths.setdefault(c, Counter()).update(w)
        return InstrMix(
            dict(classes),
            {c: dict(w) for c, w in widths.items()},
            dict(opcodes),
            self.guarded + other.guarded,
        )

    def cost_mix(self) -> Mix:
        """This mix as the cost model's input (:class:`polyfuse.poly.costs.Mix`): slots, FP32
        work, and the bytes one thread moves per memory path (``LDSM`` with the shared loads;
        generic ``LD``/``ST`` split evenly between loads and stores)."""

        def nbytes(*classes: str) -> float:
            return sum(n * b / 8 for c in classes for b, n in self.widths.get(c, {}).items())

        return Mix(
            slots=self.total,
            ints=self["int"],
            ffma=self["FFMA"],
            fmul=self["FMUL"],
            fadd=self["FADD"],
            mufu=self["MUFU"],
            bar=self["BAR"],
            shfl=self["warp"],
            mma=self["HMMA"],
            lds=nbytes("LDS", "LDSM"),
            sts=nbytes("STS"),
            ldg=nbytes("LDG") + nbytes("generic") / 2,
            stg=nbytes("STG") + nbytes("generic") / 2,
            ldgsts=nbytes("LDGSTS"),
            local=nbytes("local"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "total": _num(self.total),
            "ffma_share": round(self.ffma_share, 4),
            "classes": {c: _num(self[c]) for c in CLASSES if self[c]},
            "widths": {
                c: {str(b): _num(n) for b, n in sorted(w.items())} for c, w in self.widths.items()
            },
            "opcodes": {o: _num(n) for o, n in sorted(self.opcodes.items())},
            "guarded": _num(self.guarded),
        }

    def summary(self) -> str:
        """One line: total, FFMA share and the non-zero classes (memory by width)."""
        parts = []
        for c in CLASSES:
            n = self[c]
            if not n:
                continue
            if (
                c in self.widths
                and len(self.widths[c]) > 1
                or any(b != 32 for b in self.widths.get(c, {}))
            ):
                ws = "+".join(
                    f"{_fmt(v)}x{b}" for b, v in sorted(self.widths[c].items(), reverse=True)
                )
                parts.append(f"{c} {ws}")
            else:
                parts.append(f"{c} {_fmt(n)}")
        return f"{_fmt(self.total)} slots, FFMA {self.ffma_share:.0%}: " + ", ".join(parts)

    def __str__(self) -> str:
        return self.summary()


def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else round(x, 2)


def _fmt(x: float) -> str:
    return str(_num(x))
