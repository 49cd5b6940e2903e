"""Trip counts of SASS loops, read off their counters.

A loop is counted when its back edge is a branch under a predicate set by
``ISETP.<cmp> P, PT, R, IMM, PT`` in the loop, ``R`` is incremented by a constant once per
iteration (``IADD3 R, R, IMM, RZ`` / ``VIADD`` / ``UIADD3``) and set to a constant before the
loop (``MOV``, ``IMAD.MOV.U32``, ``HFMA2.MMA -RZ, RZ, hi, lo``, ``CS2R``, found in the nearest
dominator of the header outside the loop). The branch is taken back while the compare holds
(``@P``) or fails (``@!P``); the count is the first iteration after which it is not. A loop of
two trips may have no counter: its predicate enters as the constant true and is set false in
the body after the test reads it (``UPLOP3.LUT UP0, UPT, UPT, UPT, UPT, 0x80`` before,
``0x40`` inside); or its counter's register is reused once the test has read it and set to a
constant before the back edge (``IADD3 R19, R19, 0x1`` and ``ISETP.GE.U32.AND P1, PT, R19,
0x2`` first, ``MOV R19, 0x1`` by the branch). Anything else (a bound in a register or a
kernel parameter) leaves the count unknown, with the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from polyfuse.cuda.toolchain.sass.parse import Instruction, SassFunction

__all__ = ["TripCount", "trip_count"]


@dataclass(frozen=True)
class TripCount:
    """Iterations of a loop per entry (None: unknown) and how they were found (or why not)."""

    iterations: int | None
    how: str

    def __str__(self) -> str:
        return f"{self.iterations if self.iterations is not None else '?'} ({self.how})"


_REG_RE = re.compile(r"^(U?R)(\d+)(?:\.(\d+))?$")


def _imm(op: str) -> int | None:
    """A 32-bit immediate operand as a signed integer (``0xffffffff`` → -1), else None."""
    op = op.strip()
    if op in ("RZ", "URZ", "SRZ"):
        return 0
    m = re.fullmatch(r"(-?)(0x[0-9a-fA-F]+|\d+)", op)
    if not m:
        return None
    v = int(m.group(2), 0) & 0xFFFFFFFF
    v = v - (1 << 32) if v >= 1 << 31 else v
    return -v if m.group(1) else v


def _regs_written(ins: Instruction) -> set[str]:
    """The registers an instruction writes (its first operand, wide destinations expanded)."""
    if not ins.operands:
        return set()
    m = _REG_RE.match(ins.operands[0].split()[0].lstrip("-"))
    if not m:
        return set()
    kind, n = m.group(1), int(m.group(2))
    words = 1
    for mod in ins.modifiers:
        if mod in ("64", "WIDE"):
            words = 2
        elif mod == "128":
            words = 4
    if ins.base == "CS2R" and ins.modifiers[:1] != ("32",):
        words = 2
    return {f"{kind}{n + w}" for w in range(words)}


def _constant_value(ins: Instruction) -> int | None:
    """The constant a register-setting instruction writes, or None."""
    ops = ins.operands
    base = ins.base
    if base in ("MOV", "MOV32I", "UMOV") and len(ops) >= 2:
        return _imm(ops[1])
    if base == "IMAD" and ins.modifiers[:1] == ("MOV",) and len(ops) == 4:
        return _imm(ops[3]) if ops[1] in ("RZ",) and ops[2] in ("RZ",) else None
    if base == "CS2R" and len(ops) >= 2 and ops[1] == "SRZ":
        return 0
    if base == "HFMA2" and ops[1:3] == ("-RZ", "RZ") and len(ops) == 5:
        try:
            hi, lo = (int(np.float16(float(x)).view(np.uint16)) for x in ops[3:5])
        except ValueError:
            return None
        v = (hi << 16) | lo
        return v - (1 << 32) if v >= 1 << 31 else v
    if base in ("IADD3", "UIADD3", "VIADD"):
        vals = [_imm(o) for o in ops[1:] if not _is_pred(o)]
        return sum(vals) if vals and all(v is not None for v in vals) else None  # type: ignore[misc]
    return None


def _is_pred(op: str) -> bool:
    return bool(re.fullmatch(r"!?U?P(\d+|T)", op.strip()))


def _increment(ins: Instruction, reg: str) -> int | None:
    """The step when ``ins`` is ``reg = reg + constant`` (IADD3 / VIADD / UIADD3)."""
    if ins.base not in ("IADD3", "VIADD", "UIADD3") or ins.guarded or ins.never:
        return None
    if _regs_written(ins) != {reg}:
        return None
    srcs = [o for o in ins.operands[1:] if not _is_pred(o)]
    if srcs.count(reg) != 1:
        return None
    rest = [_imm(o) for o in srcs if o != reg]
    if any(v is None for v in rest):
        return None
    return sum(rest)  # type: ignore[arg-type]


_CMP = {
    "LT": lambda a, b: a < b,
    "LE": lambda a, b: a <= b,
    "GT": lambda a, b: a > b,
    "GE": lambda a, b: a >= b,
    "EQ": lambda a, b: a == b,
    "NE": lambda a, b: a != b,
}


def _iterations(start: int, step: int, cmp: str, limit: int, back_if: bool) -> int | None:
    """Smallest k >= 1 such that the compare of ``start + k*step`` with ``limit`` no longer
    sends control back (``back_if``: the loop goes on while the compare holds)."""
    if step == 0:
        return None

    def back(k: int) -> bool:
        return _CMP[cmp](start + k * step, limit) == back_if

    if not back(1):
        return 1
    # The compare flips at most once along an arithmetic sequence (NE/EQ: at one point).
    if cmp in ("NE", "EQ"):
        d = limit - start
        if (cmp == "NE") == back_if:
            return d // step if d % step == 0 and d // step >= 1 else None
        return 2 if back(1) and not back(2) else None
    lo, hi = 1, 1
    while back(hi):
        lo, hi = hi, hi * 2
        if hi > 1 << 40:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if back(mid) else (lo, mid)
    return hi


def trip_count(
    fn: SassFunction,
    header: int,
    blocks: frozenset[int],
    latches: tuple[int, ...],
    dom: dict[int, set[int]],
) -> TripCount:
    """Iterations per entry of the loop of ``fn`` with this ``header`` address, ``blocks``
    (indices) and back-edge branches (``latches``, addresses), read off its counter (see the
    module doc); ``dom``: the dominators of
    :func:`polyfuse.cuda.toolchain.sass.loops.dominators`."""
    if len(latches) != 1:
        return TripCount(None, f"{len(latches)} back edges")
    body = [i for b in sorted(blocks) for i in fn.blocks[b].instructions]
    br = next(i for i in body if i.address == latches[0])
    if br.guarded:
        pred = br.predicate.lstrip("@")
        back_if = not pred.startswith("!")  # the loop goes on while the predicate holds
    else:  # an unconditional back edge: the loop goes on while its one exit is not taken
        exits = [
            (b, t)
            for b in sorted(blocks)
            for t in fn.blocks[b].successors
            if t not in blocks and fn.blocks[t].reachable
        ]
        if len(exits) != 1 or br.base != "BRA":
            return TripCount(None, f"{len(exits)} exits and an unconditional back edge")
        b, t = exits[0]
        test = fn.blocks[b].instructions[-1]
        if not (test.jumps and test.guarded):
            return TripCount(None, "the exit is not a predicated branch")
        pred = test.predicate.lstrip("@")
        leaves_if = not pred.startswith("!")  # the exit edge is taken while this holds
        if test.target != fn.blocks[t].start:  # the exit is the fall-through edge
            leaves_if = not leaves_if
        back_if = not leaves_if
        br = test
    pred = pred.lstrip("!")
    cmp_ins = _setter(body, pred, br.address)
    while cmp_ins is not None and (src := _predicate_copy(cmp_ins)) is not None:
        back_if ^= src.startswith("!")  # P = !Q: the loop goes on while Q fails
        pred = src.lstrip("!")
        cmp_ins = _setter(body, pred, cmp_ins.address)
    if cmp_ins is None:  # nothing sets it before the test reads it: a toggled predicate?
        toggled = _toggled(fn, header, blocks, body, pred, back_if, dom)
        if toggled is not None:
            return toggled
    if cmp_ins is None or cmp_ins.base not in ("ISETP", "UISETP"):
        return TripCount(None, f"{pred} not set by an integer compare in the loop")
    mods = cmp_ins.modifiers
    ops = cmp_ins.operands
    if len(ops) != 5 or ops[1] not in _TRUE or ops[4] not in _TRUE or mods[0] not in _CMP:
        return TripCount(None, f"compare {cmp_ins.opcode} is not a plain counter test")
    cmp = mods[0]
    reg, limit = ops[2], _imm(ops[3])
    if limit is None and _imm(ops[2]) is not None:  # constant first: C < R is R > C
        reg, limit, cmp = ops[3], _imm(ops[2]), _SWAPPED[cmp]
    if limit is None:
        return TripCount(None, f"bound {ops[3]} is not a constant")
    incs = [i for i in body if reg in _regs_written(i)]
    restored = _restored(fn, header, blocks, body, br, cmp_ins, reg, dom)
    if restored is not None:
        return _two_values(restored, cmp, limit, back_if, "U32" in mods)
    start = _entry_value(fn, header, blocks, reg, dom)
    if len(incs) != 1 or (step := _increment(incs[0], reg)) is None:
        return TripCount(None, f"{reg} is not stepped by a constant once per iteration")
    if start is None:
        return TripCount(None, f"{reg} does not enter the loop as a constant")
    first = start if incs[0].address < cmp_ins.address else start - step
    unsigned = "U32" in mods
    if unsigned:
        first, limit = first & 0xFFFFFFFF, limit & 0xFFFFFFFF
    n = _iterations(first, step, cmp, limit, back_if)
    cond = ("" if back_if else "not ") + f"{cmp} {limit:#x}"
    how = f"{reg} from {start} step {step}, back while {cond}"
    return TripCount(n, how if n is not None else f"{how}: no exit")


def _restored(
    fn: SassFunction,
    header: int,
    blocks: frozenset[int],
    body: list[Instruction],
    end: Instruction,
    test: Instruction,
    reg: str,
    dom: dict[int, set[int]],
) -> tuple[int, int, str] | None:
    """The values a loop's test sees on its first and its later iterations where ptxas
    reuses the counter's register once the test has read it and sets it to a constant before
    the iteration ends (a loop it knows runs at most twice): the test reads ``reg = C + step``
    (``C`` the counter, ``reg`` itself or another register) and nothing writes ``C`` between the
    header and that addition; ``C`` enters the loop as a constant and its last write in the
    loop is a constant, in the block of ``end`` (the back edge, or the exit test of a loop whose
    back edge is unconditional); with how. None for any other shape."""
    defs = [i for i in body if reg in _regs_written(i) and i.address < test.address]
    if not defs or defs[-1].base not in ("IADD3", "VIADD", "UIADD3") or defs[-1].guarded:
        return None
    add = defs[-1]
    srcs = [o for o in add.operands[1:] if not _is_pred(o)]
    regs = [o for o in srcs if _imm(o) is None]
    if len(regs) != 1 or _regs_written(add) != {reg}:
        return None
    counter = regs[0]
    step = sum(_imm(o) or 0 for o in srcs if o != counter)
    writes = [i for i in body if counter in _regs_written(i)]
    if not writes or any(w.address < add.address for w in writes):
        return None  # the addition does not read the counter as the iteration found it
    last = writes[-1]
    value = _constant_value(last)
    home = fn.block_of(end.address).index
    if value is None or last.guarded or fn.block_of(last.address).index != home:
        return None
    if last.address > end.address or any(w.address > last.address for w in writes):
        return None
    start = _entry_value(fn, header, blocks, counter, dom)
    if start is None:
        return None
    how = (
        f"{counter} from {start}, set to {value} before the iteration ends, tested as "
        f"{counter} + {step}"
    )
    return start + step, value + step, how


def _two_values(
    seen: tuple[int, int, str], cmp: str, limit: int, back_if: bool, unsigned: bool
) -> TripCount:
    """Trips of a loop whose test sees ``seen``'s first value once and its second on every
    later iteration (:func:`_restored`): 1 or 2, or none where the second never exits."""
    first, later, how = seen
    if unsigned:
        first, later, limit = first & 0xFFFFFFFF, later & 0xFFFFFFFF, limit & 0xFFFFFFFF
    test = _CMP[cmp]
    if test(first, limit) != back_if:
        return TripCount(1, how)
    if test(later, limit) != back_if:
        return TripCount(2, how)
    return TripCount(None, f"{how}: no exit")


_TRUE = ("PT", "UPT")
_SWAPPED = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE", "EQ": "EQ", "NE": "NE"}


def _setter(body: list[Instruction], pred: str, before: int) -> Instruction | None:
    """The last instruction of the loop before address ``before`` that writes ``pred``."""
    found = [i for i in body if i.address < before and i.operands[:1] == (pred,)]
    return found[-1] if found else None


def _predicate_copy(ins: Instruction) -> str | None:
    """``Q`` (or ``!Q``) when ``ins`` copies a predicate: ``PLOP3.LUT P, PT, PT, PT, Q, 0x80,
    0x0`` (the AND of ``Q`` with two true predicates), as ptxas moves a uniform compare's
    ``UP0`` into ``P0`` for a branch."""
    ops = ins.operands
    if ins.opcode != "PLOP3.LUT" or len(ops) != 7 or ops[5] != "0x80" or ops[6] != "0x0":
        return None
    rest = [o for o in ops[2:5] if o not in _TRUE]
    return rest[0] if len(rest) == 1 else None


def _constant_predicate(ins: Instruction) -> bool | None:
    """The value ``ins`` writes when it sets a predicate to a constant: ``PLOP3.LUT P, A, B,
    C, LUT, 0x0`` (or ``UPLOP3``) with constant inputs ``A, B, C`` (``PT``/``!PT``), the
    result the LUT's bit at index ``4a + 2b + c``; None for anything else."""
    ops = ins.operands
    if ins.opcode not in ("PLOP3.LUT", "UPLOP3.LUT") or len(ops) != 7 or ins.guarded:
        return None
    bits = []
    for o in ops[2:5]:
        if o.lstrip("!") not in _TRUE:
            return None
        bits.append(not o.startswith("!"))
    lut = _imm(ops[5])
    if lut is None:
        return None
    return bool((lut >> (4 * bits[0] + 2 * bits[1] + bits[2])) & 1)


def _toggled(
    fn: SassFunction,
    header: int,
    blocks: frozenset[int],
    body: list[Instruction],
    pred: str,
    back_if: bool,
    dom: dict[int, set[int]],
) -> TripCount | None:
    """The trip count of a loop whose back edge tests a predicate that only constants set:
    ``pred`` enters the loop as one constant and is set to another inside the loop after the
    test reads it (ptxas's form of a loop of two trips: ``UP0 = true`` before, the branch on
    ``UP0``, ``UP0 = false`` in the body; the caller found no setter before the test reads
    it). None when ``pred`` is set otherwise."""
    inside = [i for i in body if i.operands[:1] == (pred,)]
    if len(inside) != 1:
        return None
    later = _constant_predicate(inside[0])
    if later is None:
        return None
    head = fn.block_of(header).index
    first: bool | None = None
    for b in sorted(dom[head] - blocks, key=lambda b: len(dom[b]), reverse=True):
        found = [i for i in fn.blocks[b].instructions if i.operands[:1] == (pred,)]
        if found:
            first = _constant_predicate(found[-1])
            break
    if first is None:
        return None
    how = f"{pred} = {first} on entry, {later} after the first test"
    if (first == back_if) and (later == back_if):
        return TripCount(None, f"{how}: no exit")
    return TripCount(2 if first == back_if else 1, how)


def _entry_value(
    fn: SassFunction, header: int, blocks: frozenset[int], reg: str, dom: dict[int, set[int]]
) -> int | None:
    """The constant ``reg`` holds on entry to the loop, from the nearest definition in the
    header's dominators outside the loop."""
    head = fn.block_of(header).index
    chain = sorted(dom[head] - blocks, key=lambda b: len(dom[b]), reverse=True)
    for b in chain:
        for ins in reversed(fn.blocks[b].instructions):
            if reg in _regs_written(ins):
                if ins.guarded:
                    return None
                return _constant_value(ins)
    return None
