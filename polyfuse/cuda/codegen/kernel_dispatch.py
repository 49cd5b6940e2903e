"""The Layer 3 dispatch node of the kernel IR and its printer.

A packed launch's body is one :class:`KDispatch`: the padded block, the pack's parameters and,
per part (:class:`KPart`), its kernel (its IR body, its printed function with real and with
canonical names), the range of ``blockIdx.x`` it owns, how many of its blocks share one padded
block (``fold``) and whether it gets a local thread index. :func:`print_dispatch` prints it:
each part as a ``__device__`` function printed by
:func:`polyfuse.cuda.codegen.kernel_function.print_function` with its block index (and, for a part
given a local one, its thread index) as parameters, then the ``__global__`` dispatcher calling
part ``i`` for its block range. Which parts and which layout come from
:mod:`polyfuse.stitch.parallel`; the dispatch semantics are :mod:`polyfuse.cuda.codegen.pack`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from polyfuse.cuda.codegen.kernel_ast import Kernel, KNode, KParam
from polyfuse.cuda.codegen.kernel_function import (
    PART_BLOCK,
    PART_THREAD,
    THREAD_INDEX,
    KFunction,
    print_function,
    signature,
)


@dataclass(frozen=True)
class KPart:
    """One kernel of a dispatch: blocks ``[first, first + blocks)`` of the launch run it.

    ``fold > 1``: that many of its ``threads``-thread blocks share one padded block;
    ``threads`` above the padded block (a multiple): each of its blocks is split over
    ``threads / block`` padded blocks. ``local_thread``: its thread index is a parameter
    (its block is folded, split or guarded), not ``threadIdx.x``; only a part without
    barriers, shuffles or shared memory gets one. ``args``: the positions of its parameters
    among the dispatch's. ``body``: its kernel IR (empty when served by the compile cache).
    """

    kernel: str
    function: KFunction
    canonical: KFunction | None
    first: int
    blocks: int
    fold: int
    grid: int
    threads: int
    local_thread: bool
    args: tuple[int, ...]
    body: tuple[KNode, ...] = ()


@dataclass(frozen=True)
class KDispatch(KNode):
    """Block-range dispatch of several kernels in one launch of ``block`` threads."""

    block: int
    params: tuple[KParam, ...]
    parts: tuple[KPart, ...]

    def format_lines(self, depth: int, lines: Callable[[list[KNode], int], list[str]]):
        """``print(kernel)``'s pseudo-code: each part's range, then its IR."""
        out = []
        for p in self.parts:
            local = " local thread" if p.local_thread else ""
            fold = f" fold {p.fold}" if p.fold > 1 else ""
            head = f"dispatch blocks [{p.first}, {p.first + p.blocks}) -> {p.kernel}"
            out.append(f"{'  ' * depth}{head}{fold}{local}")
            out += lines(list(p.body), depth + 1)
        return out


def dispatch_of(kernel: Kernel) -> KDispatch | None:
    """The dispatch node of a packed launch (None for a plain kernel)."""
    if len(kernel.body) == 1 and isinstance(kernel.body[0], KDispatch):
        return kernel.body[0]
    return None


def part_function(kernel: str, i: int) -> str:
    """The ``__device__`` function of part ``i`` of the dispatch printed as ``kernel``."""
    return f"{kernel}_p{i}"


def print_dispatch(d: KDispatch, name: str) -> str:
    """``d`` as CUDA: its parts' ``__device__`` functions and the ``__global__`` function
    ``name`` that calls part ``i`` for the blocks it owns."""
    funcs, calls = [], []
    block = d.block
    for i, p in enumerate(d.parts):
        fn = part_function(name, i)
        thread = PART_THREAD if p.local_thread else THREAD_INDEX
        funcs.append(print_function(p.function, fn, PART_BLOCK, thread))
        args = ", ".join(d.params[j].name for j in p.args)
        first, threads = p.first, p.threads
        if threads > block:  # split: part block pf_b / split, threads past block * part
            split = threads // block
            call = [
                f"    const int pf_v = (pf_b - {first}) / {split};",
                f"    {fn}({args}, pf_v, ((pf_b - {first}) % {split}) * {block} + "
                "(int)threadIdx.x);",
            ]
        elif p.local_thread:
            call = [
                f"    const int pf_v = (pf_b - {first}) * {p.fold} + (int)threadIdx.x / {threads};",
                f"    if (pf_v < {p.grid}) {fn}({args}, pf_v, (int)threadIdx.x % {threads});",
            ]
        else:
            call = [f"    {fn}({args}, pf_b - {first}, (int)threadIdx.x);"]
        kw = "if" if not calls else "} else if"
        cond = f"pf_b < {first + p.blocks}"
        calls += [f"  {kw} ({cond}) {{  // {p.kernel}: {p.grid} blocks of {threads}"] + call
    sig = signature(tuple((p.ctype, p.name) for p in d.params))
    lines = [f'extern "C" __global__ void __launch_bounds__({block}) {name}({sig}) {{']
    lines += ["  const int pf_b = blockIdx.x;"] + calls + ["  }", "}"]
    return "\n".join(funcs) + "\n" + "\n".join(lines) + "\n"


def print_kernel(kernel: Kernel, name: str) -> str:
    """``kernel``'s function (a dispatch's functions) printed under the name ``name``."""
    d = dispatch_of(kernel)
    if d is not None:
        return print_dispatch(d, name)
    assert kernel.printed is not None, f"{kernel.name}: not printed by polyfuse"
    return print_function(kernel.printed, name)
