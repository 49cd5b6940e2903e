"""The vector check: the kernel IR's vector accesses keep their width in the machine code.

Every vector access the IR holds (a :class:`~polyfuse.cuda.codegen.kernel_ast.KVector`'s loads and
stores: isl proved them contiguous and aligned, :mod:`polyfuse.cuda.codegen.lower_vectorize`; a
:class:`~polyfuse.cuda.codegen.kernel_ast.KVectorStore` of a register tile) is printed as one vector
access on a source line: a ``float4`` of float32 elements, a ``uint4`` word of eight or a
``uint2`` word of four 16-bit elements (float16/bfloat16). With ``-lineinfo`` nvdisasm names
the source line of every SASS instruction, so each such line's memory instructions can be read
off: all must move the word's bits (``LDG.E.128``, ``STG.E.128``, ``LDS.128``, ``STS.128``;
``.64`` for a ``uint2``). A line whose loads ptxas split into narrower ones, or fewer vector
lines than the IR's vector accesses, fails the check.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from polyfuse.cuda.codegen.kernel_ast import KNode, KVector, KVectorStore, map_children
from polyfuse.cuda.codegen.kernel_dispatch import KDispatch
from polyfuse.cuda.toolchain.sass.mix import classify
from polyfuse.cuda.toolchain.sass.parse import SassFunction
from polyfuse.cuda.toolchain.sass.records import VectorAccess, VectorCheck

__all__ = [
    "VECTOR_RE",
    "function_lines",
    "kernel_lines",
    "top_level_blocks",
    "vector_check",
    "vector_sites",
]

_MEMORY = ("LDS", "STS", "LDG", "STG", "LDGSTS", "generic")


def vector_sites(body: Sequence[KNode]) -> int:
    """Vector accesses a kernel IR holds: per :class:`KVector`, one per tensor it loads and
    one per tensor it stores (a staged input's store into its shared tile too); one per
    :class:`KVectorStore`."""
    count = 0

    def walk(nodes: list[KNode]) -> list[KNode]:
        nonlocal count
        for n in nodes:
            if isinstance(n, KVector):
                count += len({a.tensor for a in n.loads}) + len({a.tensor for a in n.stores})
                loaded = {x.lanes.name for x in n.lane_loads}  # a staged input's tile store
                count += sum(x.lanes.name in loaded for x in n.lane_stores)
            elif isinstance(n, KVectorStore):
                count += 1
            elif isinstance(n, KDispatch):  # a Layer 3 pack: each part's IR
                for p in n.parts:
                    walk(list(p.body))
            map_children(n, walk)
        return nodes

    walk(list(body))
    return count


def top_level_blocks(source: str) -> list[range]:
    """The 1-based line spans of the translation unit's top-level brace blocks (functions,
    structs), from the line that opens one to the line that closes it."""
    spans: list[range] = []
    depth, start = 0, 0
    for i, line in enumerate(source.splitlines(), 1):
        if depth == 0 and "{" in line:
            start = i
        depth += line.count("{") - line.count("}")
        if depth == 0 and start:
            spans.append(range(start, i + 1))
            start = 0
    return spans


def function_lines(source: str, name: str) -> range | None:
    """The 1-based source lines of ``__global__`` function ``name`` (signature to closing
    brace), or None when the source has no such function."""
    lines = source.splitlines()
    pat = re.compile(rf"__global__\b.*\b{re.escape(name)}\s*\(")
    start = next((i for i, ln in enumerate(lines) if pat.search(ln)), None)
    if start is None:
        return None
    depth, opened = 0, False
    for i in range(start, len(lines)):
        depth += lines[i].count("{") - lines[i].count("}")
        opened = opened or "{" in lines[i]
        if opened and depth <= 0:
            return range(start + 1, i + 2)
    return range(start + 1, len(lines) + 1)


#: A vector access as the printer writes it; the word type names its width.
VECTOR_RE = re.compile(r"reinterpret_cast<\s*(?:const\s+)?(float4|uint4|uint2)\s*\*\s*>")
_WORD_BITS = {"float4": 128, "uint4": 128, "uint2": 64}


def kernel_lines(fn: SassFunction, source: str) -> list[int]:
    """The source lines that belong to kernel ``fn``: its own function and every top-level
    function the SASS executes a line of (the device functions it inlined: the parts of a
    Layer 3 pack, helpers)."""
    executed = {ins.line for ins in fn.reachable if ins.line is not None}
    own = function_lines(source, fn.name)
    spans = [sp for sp in top_level_blocks(source) if any(ln in sp for ln in executed)]
    lines = set(own or ()) | {ln for sp in spans for ln in sp}
    return sorted(lines)


def vector_check(fn: SassFunction, source: str, body: Sequence[KNode] = ()) -> VectorCheck:
    """Check that the vector accesses of a kernel are 128-bit in its SASS (module doc).

    ``fn`` must come from a cubin compiled with ``-lineinfo`` and disassembled by nvdisasm
    (the instructions carry source lines); ``body`` is the kernel IR (empty: only the source's
    vector lines are checked; a Layer 3 pack's IR holds its first part, so its count is a
    lower bound)."""
    expected = vector_sites(body)
    src = source.splitlines()
    words = {ln: VECTOR_RE.search(src[ln - 1]) for ln in kernel_lines(fn, source)}
    lines = [ln for ln, m in words.items() if m]
    problems: list[str] = []
    if not any(ins.line is not None for ins in fn.instructions):
        problems.append("no source lines in the SASS (compile with -lineinfo, use nvdisasm)")
    by_line: dict[int, list[str]] = {}
    for ins in fn.reachable:
        if ins.line is not None and classify(ins) in _MEMORY:
            by_line.setdefault(ins.line, []).append(ins.opcode)
    accesses = []
    for ln in lines:
        word = words[ln].group(1)  # type: ignore[union-attr]
        sass = tuple(by_line.get(ln, ()))
        accesses.append(VectorAccess(ln, src[ln - 1].strip(), sass, _WORD_BITS[word], word))
    if len(lines) < expected:
        problems.append(
            f"the IR holds {expected} vector accesses but the source prints {len(lines)} "
            "vector accesses"
        )
    if accesses and not any(a.sass for a in accesses):
        problems.append("no memory instruction at any vector line (line information lost?)")
    for a in accesses:
        if not a.ok:
            problems.append(
                f"line {a.line} is {a.word} in the source but {', '.join(a.sass)} in SASS"
            )
    return VectorCheck(expected, accesses, problems)
