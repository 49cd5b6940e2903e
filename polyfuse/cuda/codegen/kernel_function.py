"""A kernel as the printer wrote it, apart from its launch indices, and how it is printed as a
function of given ones.

The printer (:func:`polyfuse.cuda.codegen.printer.emit_kernel`) writes a lowered kernel's
parameters,
allocations and statements; the only place the printed kernel reads its launch indices is its
prologue, which splits the block index and the thread index into the IR's named coordinates
(:attr:`polyfuse.cuda.codegen.kernel_ast.KernelIR.grid_dims` / ``thread_dims``). A
:class:`KFunction` keeps those coordinates as data and the rest as the printed body, so the
same kernel is printed as its own ``__global__`` function (indices ``blockIdx.x`` and
``threadIdx.x``) or as a part of a Layer 3 dispatch (a ``__device__`` function whose indices
are its parameters ``pf_block`` and ``pf_thread``, :mod:`polyfuse.cuda.codegen.kernel_dispatch`),
under any function name: the printer is given the indices and the name, nothing is
substituted in text afterwards. A body whose copy thread grids (GEMM operand copies) or
combine helpers read ``threadIdx.x`` themselves says so (:attr:`KFunction.own_thread_index`);
such a kernel is collective and is printed only with its block's real thread index.

The compile cache stores a kernel's :class:`KFunction` with canonical names
(:meth:`KFunction.to_json`); dedup hashes it (:mod:`polyfuse.cuda.codegen.dedup`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from polyfuse.cuda.codegen.namer import fill

#: the launch indices of a ``__global__`` function
BLOCK_INDEX = "blockIdx.x"
THREAD_INDEX = "threadIdx.x"
#: the launch indices of a dispatch part: parameters of its ``__device__`` function
PART_BLOCK = "pf_block"
PART_THREAD = "pf_thread"


@dataclass(frozen=True)
class KFunction:
    """One printed kernel function without its name and launch indices.

    ``params``: (C type, name) in order; ``threads``/``min_blocks``: its launch bounds;
    ``grid_dims``/``thread_dims``: the coordinates the block / thread index decompose into
    (slowest first); ``body``: its allocations and statements as printed (lines, each ending
    in a newline), reading no block index but through those coordinates, and the thread index
    itself only where ``own_thread_index`` (copy thread grids, a lane combine).
    """

    params: tuple[tuple[str, str], ...]
    threads: int
    min_blocks: int
    grid_dims: tuple[tuple[str, int], ...]
    thread_dims: tuple[tuple[str, int], ...]
    body: str
    own_thread_index: bool = False
    #: the body reads ``blockIdx.x`` itself (its sections split it, a GEMM + row-reduction
    #: kernel, :mod:`polyfuse.cuda.codegen.lower_gemm_rows`): printed only as its own
    #: ``__global__`` function
    own_block_index: bool = False

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable form (the compile cache's; dedup hashes it)."""
        return {
            "params": [list(p) for p in self.params],
            "threads": self.threads,
            "min_blocks": self.min_blocks,
            "grid_dims": [list(d) for d in self.grid_dims],
            "thread_dims": [list(d) for d in self.thread_dims],
            "body": self.body,
            "own_thread_index": self.own_thread_index,
        } | ({"own_block_index": True} if self.own_block_index else {})

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> KFunction:
        """The function :meth:`to_json` wrote."""
        return cls(
            tuple((c, n) for c, n in d["params"]),
            d["threads"],
            d["min_blocks"],
            tuple((n, s) for n, s in d["grid_dims"]),
            tuple((n, s) for n, s in d["thread_dims"]),
            d["body"],
            d["own_thread_index"],
            d.get("own_block_index", False),
        )


def decompose(lin: str, tmp: str, coords: list[tuple[str, int]]) -> list[str]:
    """Split a linear index into coordinates (slowest first), the last varying fastest."""
    if not coords:
        return []
    lines = [f"  int {tmp} = {lin};"]
    for i in reversed(range(len(coords))):
        name, size = coords[i]
        if i == 0:
            lines.append(f"  const int {name} = {tmp};")
        else:
            lines.append(f"  const int {name} = {tmp} % {size}; {tmp} /= {size};")
    return lines


def signature(params: tuple[tuple[str, str], ...]) -> str:
    """The parameter list of a kernel function (every pointer ``__restrict__``)."""
    return ", ".join(f"{ctype} __restrict__ {name}" for ctype, name in params)


def print_function(
    fn: KFunction, name: str, block: str = BLOCK_INDEX, thread: str = THREAD_INDEX
) -> str:
    """``fn`` as the function ``name`` whose block and thread indices are the C expressions
    ``block`` and ``thread``: an ``extern "C" __global__`` function for the launch indices, a
    ``__device__`` part taking them as the parameters ``pf_block``/``pf_thread`` otherwise
    (``thread`` may stay ``threadIdx.x`` in a part: a collective part keeps its real one)."""
    sig = signature(fn.params)
    if block == BLOCK_INDEX:
        assert thread == THREAD_INDEX, "a __global__ function reads its own thread index"
        bounds = f"{fn.threads}, {fn.min_blocks}" if fn.min_blocks else f"{fn.threads}"
        head = f'extern "C" __global__ void __launch_bounds__({bounds}) {name}({sig}) {{'
    else:
        assert block == PART_BLOCK and thread in (PART_THREAD, THREAD_INDEX), (block, thread)
        assert not fn.own_block_index, f"{name} reads blockIdx.x"
        assert thread == THREAD_INDEX or not fn.own_thread_index, f"{name} reads threadIdx.x"
        head = (
            f"__device__ __forceinline__ void {name}({sig}, "
            f"const int {PART_BLOCK}, const int {PART_THREAD}) {{"
        )
    lines = [head]
    lines += decompose(block, "_b", list(fn.grid_dims))
    lines += decompose(thread, "_t", list(fn.thread_dims))
    return "\n".join(lines) + "\n" + fn.body + "}\n"


def instantiate_function(
    canonical: KFunction, params: list[tuple[str, str]], real: Mapping[str, str]
) -> KFunction:
    """A function printed with canonical names (:mod:`polyfuse.cuda.codegen.namer`) under real ones:
    the parameters ``params`` ((C type, name), in order) and the body's slots filled with
    ``real[canonical name]`` (:func:`polyfuse.cuda.codegen.namer.fill`)."""
    return replace(canonical, params=tuple(params), body=fill(canonical.body, real))
