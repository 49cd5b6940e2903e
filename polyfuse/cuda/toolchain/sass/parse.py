"""SASS listings → typed instructions, basic blocks and the control-flow graph.

Both listing formats are read: ``nvdisasm -c -g`` (functions as ``.text.NAME`` sections,
branch targets as ``.L_x_N`` labels, ``//## File "...", line N`` before the instructions of a
source line) and ``cuobjdump -sass`` (``Function : NAME``, branch targets as addresses). An
instruction line is ``/*ADDR*/ [@[!]PRED] OPCODE[.MOD...] [OPERAND, ...] ;``.

A function's basic blocks start at its first instruction, at every branch target and after
every branch or exit; the successors of a block follow its last instruction (a predicated
branch or exit falls through as well; ``@!PT`` never executes; ``CALL.REL.NOINC``, which ptxas
uses to leave a loop, is a jump). Blocks unreachable from the
entry (the ``BRA`` to itself and the ``NOP`` padding after ``EXIT``) are kept but marked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = [
    "Block",
    "Instruction",
    "SassFunction",
    "parse_instruction",
    "parse_listing",
]

_INSTR_RE = re.compile(r"/\*([0-9a-fA-F]+)\*/\s+([^;{}]*?)\s*;")
_LABEL_RE = re.compile(r"^\s*(\.L_[\w.]+):\s*$")
_LINE_RE = re.compile(r'//## File "[^"]*", line (\d+)')
_NVDISASM_FN_RE = re.compile(r"^\s*\.section\s+\.text\.([^,\s]+)")
_CUOBJDUMP_FN_RE = re.compile(r"^\s*Function\s*:\s*(\S+)")
_ARCH_RE = re.compile(r"^\s*(?:\.target|code for)\s+(sm_\d+[af]?)")

#: Opcodes that transfer control (a block ends after them).
BRANCHES = frozenset({"BRA", "BRX", "JMP", "JMX", "CALL", "RET", "EXIT", "BPT", "KILL"})
#: Opcodes after which control never falls through when they are not predicated.
_NO_FALLTHROUGH = frozenset({"BRA", "BRX", "JMP", "JMX", "RET", "EXIT", "KILL"})
#: Memory-access widths named by opcode modifiers (bits); no width modifier means 32.
_WIDTHS = {"128": 128, "64": 64, "U8": 8, "S8": 8, "U16": 16, "S16": 16}


@dataclass(frozen=True)
class Instruction:
    """One SASS instruction: ``opcode`` is the mnemonic with its modifiers (``LDG.E.128``),
    ``base`` the mnemonic alone, ``predicate`` the guard as printed (``@P0``, ``@!PT``, or
    empty), ``target`` the address a branch goes to, ``line`` the source line (nvdisasm with
    line information only)."""

    address: int
    opcode: str
    predicate: str = ""
    operands: tuple[str, ...] = ()
    target: int | None = None
    line: int | None = None

    @property
    def base(self) -> str:
        return self.opcode.split(".", 1)[0]

    @property
    def modifiers(self) -> tuple[str, ...]:
        return tuple(self.opcode.split(".")[1:])

    @property
    def jumps(self) -> bool:
        """Goes to ``target`` for good: ``BRA``, ``JMP`` and ``CALL.REL.NOINC`` (ptxas's loop
        exit: a call that pushes no return address)."""
        return self.base in ("BRA", "JMP") or (self.base == "CALL" and "NOINC" in self.modifiers)

    @property
    def never(self) -> bool:
        """Predicated off for good (``@!PT``): the slot issues but does nothing."""
        return self.predicate in ("@!PT", "@!UPT")

    @property
    def guarded(self) -> bool:
        """Runs under a run-time predicate (``@P0``, ``@!P1`` ...)."""
        return bool(self.predicate) and self.predicate not in ("@PT", "@UPT") and not self.never

    @property
    def width(self) -> int:
        """Bits one thread moves (memory instructions): 8/16/32/64/128."""
        for m in self.modifiers:
            if m in _WIDTHS:
                return _WIDTHS[m]
        return 32

    def __str__(self) -> str:
        pred = f"{self.predicate} " if self.predicate else ""
        operands = list(self.operands)
        if self.target is not None:  # one spelling of targets whatever the tool
            operands[-1] = f"0x{self.target:x}"
        ops = " " + ", ".join(operands) if operands else ""
        line = f"  // line {self.line}" if self.line is not None else ""
        return f"/*{self.address:04x}*/ {pred}{self.opcode}{ops} ;{line}"


@dataclass
class Block:
    """A basic block: ``instructions`` in address order, ``successors`` as block indices."""

    index: int
    instructions: list[Instruction]
    successors: list[int] = field(default_factory=list)
    reachable: bool = True

    @property
    def start(self) -> int:
        return self.instructions[0].address

    @property
    def end(self) -> int:
        """Address of the last instruction."""
        return self.instructions[-1].address


@dataclass
class SassFunction:
    """The SASS of one function of a cubin, with its basic blocks (see the module doc)."""

    name: str
    arch: str
    instructions: list[Instruction]
    blocks: list[Block] = field(default_factory=list)

    def block_of(self, address: int) -> Block:
        for b in self.blocks:
            if b.start <= address <= b.end:
                return b
        raise KeyError(f"no instruction at 0x{address:x} in {self.name}")

    @property
    def reachable(self) -> list[Instruction]:
        """The instructions of the blocks reachable from the entry."""
        return [i for b in self.blocks if b.reachable for i in b.instructions]

    def __str__(self) -> str:
        out = [f"function {self.name} ({self.arch}): {len(self.instructions)} instructions"]
        for b in self.blocks:
            succ = ", ".join(f"B{s}" for s in b.successors) or "-"
            dead = "" if b.reachable else " (unreachable)"
            out.append(f"B{b.index} @0x{b.start:04x} -> {succ}{dead}")
            out += [f"  {i}" for i in b.instructions]
        return "\n".join(out)


def _split_operands(text: str) -> tuple[str, ...]:
    """Split on the commas that are not inside brackets."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return tuple(out)


def parse_instruction(
    address: int, text: str, labels: dict[str, int] | None = None, line: int | None = None
) -> Instruction:
    """One instruction from its printed text (``@!P0 BRA `(.L_x_0)``, ``FFMA R1, R2, R3, R4``).

    A branch target is resolved through ``labels`` (nvdisasm) or read as an address
    (cuobjdump); :func:`parse_listing` resolves labels after reading the whole function.
    """
    text = text.strip()
    pred = ""
    if text.startswith("@"):
        pred, _, text = text.partition(" ")
    opcode, _, rest = text.strip().partition(" ")
    operands = _split_operands(rest)
    target = None
    if opcode.split(".", 1)[0] in BRANCHES and operands:
        target = _target(operands[-1], labels or {})
    return Instruction(address, opcode, pred, operands, target, line)


def _target(operand: str, labels: dict[str, int]) -> int | None:
    op = operand.strip().strip("`").strip("()")
    if op in labels:
        return labels[op]
    if re.fullmatch(r"0x[0-9a-fA-F]+", op):
        return int(op, 16)
    return None


def _label_name(operand: str) -> str | None:
    op = operand.strip().strip("`").strip("()")
    return op if op.startswith(".L") else None


def parse_listing(text: str, arch: str | None = None) -> dict[str, SassFunction]:
    """Every function of a listing (nvdisasm or cuobjdump), by name, with its blocks."""
    functions: dict[str, SassFunction] = {}
    raw: dict[str, list[tuple[int, str, int | None]]] = {}
    labels: dict[str, dict[str, int]] = {}
    pending: dict[str, list[str]] = {}
    current: str | None = None
    cur_arch = arch or ""
    line: int | None = None
    for ln in text.splitlines():
        if m := _ARCH_RE.match(ln):
            cur_arch = arch or m.group(1)
            continue
        m = _NVDISASM_FN_RE.match(ln) or _CUOBJDUMP_FN_RE.match(ln)
        if m:
            current = m.group(1)
            raw.setdefault(current, [])
            labels.setdefault(current, {})
            pending[current] = []
            functions[current] = SassFunction(current, cur_arch, [])
            line = None
            continue
        if current is None:
            continue
        if m := _LINE_RE.search(ln):
            line = int(m.group(1))
            continue
        if m := _LABEL_RE.match(ln):
            pending[current].append(m.group(1))
            continue
        if m := _INSTR_RE.search(ln):
            addr = int(m.group(1), 16)
            for name in pending[current]:
                labels[current][name] = addr
            pending[current] = []
            raw[current].append((addr, m.group(2), line))
    for name, fn in functions.items():
        lab = labels[name]
        end = raw[name][-1][0] + 16 if raw[name] else 0
        for label in pending[name]:  # a label after the last instruction
            lab[label] = end
        fn.instructions = [parse_instruction(a, t, lab, ln) for a, t, ln in raw[name]]
        fn.blocks = build_blocks(fn.instructions)
    return functions


def build_blocks(instructions: list[Instruction]) -> list[Block]:
    """Split ``instructions`` into basic blocks and link them (see the module doc)."""
    if not instructions:
        return []
    addrs = {i.address for i in instructions}
    leaders = {instructions[0].address}
    for k, ins in enumerate(instructions):
        if ins.base in BRANCHES:
            if ins.target is not None and ins.target in addrs:
                leaders.add(ins.target)
            if k + 1 < len(instructions):
                leaders.add(instructions[k + 1].address)
    blocks: list[Block] = []
    for ins in instructions:
        if ins.address in leaders or not blocks:
            blocks.append(Block(len(blocks), []))
        blocks[-1].instructions.append(ins)
    index = {b.start: b.index for b in blocks}
    for b in blocks:
        last = b.instructions[-1]
        succ: list[int] = []
        taken = last.base in BRANCHES and not last.never
        if taken and last.jumps and last.target in index:
            succ.append(index[last.target])  # type: ignore[index]
        # a guard, a divergence test (BRA.DIV) or a predicate operand (BRA.U !UP0, ...)
        conditional = (
            last.guarded
            or last.never
            or ".DIV" in last.opcode
            or (last.base == "BRA" and len(last.operands) > 1)
        )
        ends = last.base in _NO_FALLTHROUGH or last.jumps
        falls = not ends or conditional
        if falls and b.index + 1 < len(blocks):
            succ.append(b.index + 1)
        b.successors = list(dict.fromkeys(succ))
    seen = {0}
    stack = [0]
    while stack:
        for s in blocks[stack.pop()].successors:
            if s not in seen:
                seen.add(s)
                stack.append(s)
    for b in blocks:
        b.reachable = b.index in seen
    return blocks
