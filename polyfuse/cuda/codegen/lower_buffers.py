"""Lowering pass: buffers from placements — kernel parameters, shared tiles, registers.

Global tensors become parameters (read-only ones ``const``); shared tiles (and the tiles of
staged inputs) become ``s_<tensor>`` allocations with their boxes' lower bounds;
register-resident tensors (and register copies of global outputs) become scalars
``r_<tensor>``. Policy: shared tiles are static ``__shared__``
arrays while the kernel's shared memory (tiles plus one float per thread of combine scratch)
fits the default :data:`polyfuse.poly.policy.STATIC_SMEM_LIMIT`, so ptxas reports them;
beyond that they are slices of one dynamic buffer at their placement's offset, and the launch
opts in to the size.
Names come from the IR's namer (:mod:`polyfuse.cuda.codegen.namer`).
Element types are left undecided (``""``) for :mod:`polyfuse.cuda.codegen.lower_dtypes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from polyfuse.cuda.codegen.kernel_ast import KAlloc, KernelIR, KExpr, KParam, MemSpace
from polyfuse.poly.policy import FLOAT_BYTES as SMEM_ELEMENT_BYTES
from polyfuse.poly.policy import STATIC_SMEM_LIMIT, fits_static, smem_words

__all__ = ["STATIC_SMEM_LIMIT", "BufferPlacement", "alloc_buffers"]


@dataclass(frozen=True)
class BufferPlacement:
    """A placement as the pass needs it: space, shared box (lower bound, size), offset."""

    tensor: str
    space: MemSpace
    register_copy: bool = False
    box: tuple[tuple[KExpr, int], ...] = ()
    smem_offset: int = 0
    read_only: bool = False
    #: bytes of one element of its shared tile (:func:`polyfuse.poly.policy.smem_itemsize`)
    itemsize: int = 4
    #: a global input staged in a shared tile by this statement (:mod:`polyfuse.poly.stage`)
    stage: str = ""

    @property
    def in_register(self) -> bool:
        return self.space is MemSpace.REGISTER or self.register_copy


def alloc_buffers(
    ir: KernelIR, placements: Sequence[BufferPlacement], tensor_order: Sequence[str]
) -> KernelIR:
    """A new IR with parameters (in ``tensor_order``) and allocations for ``placements``."""
    by_name = {p.tensor: p for p in placements}
    namer = ir.namer
    params = tuple(
        KParam(namer.tensor(t), "const" if by_name[t].read_only else "", t)
        for t in tensor_order
        if by_name[t].space is MemSpace.GLOBAL
    )
    shared = [p for p in placements if p.space is MemSpace.SHARED or p.stage]
    elements = [_product(size for _, size in p.box) for p in shared]
    words = [smem_words(n, p.itemsize) for p, n in zip(shared, elements, strict=True)]
    # a combine's scratch may hold doubles: count it at 8 bytes where a tile does (an upper
    # bound; float32 kernels count 4 as before)
    wide = any(p.itemsize == 8 for p in placements)
    static = fits_static(sum(words), ir.threads, 2 if wide else 1)
    allocs: list[KAlloc] = []
    dynamic = 0
    for p, n in zip(shared, words, strict=True):
        offset = None if static else p.smem_offset
        if offset is not None:  # in 4-byte words of the pool
            dynamic = max(dynamic, (offset + n) * SMEM_ELEMENT_BYTES)
        shape = tuple(size for _, size in p.box)
        lo = tuple(lo for lo, _ in p.box)
        allocs.append(KAlloc(namer.shared(p.tensor), MemSpace.SHARED, "", shape, offset, lo))
    allocs += [
        KAlloc(namer.register(p.tensor), MemSpace.REGISTER, "", ())
        for p in placements
        if p.in_register
    ]
    return ir.with_(
        params=ir.params + params,
        allocs=ir.allocs + tuple(allocs),
        dynamic_smem_bytes=max(ir.dynamic_smem_bytes, dynamic),
    )


def _product(sizes) -> int:
    n = 1
    for s in sizes:
        n *= s
    return n
