"""Lowering pass: element types of parameters and allocations.

Every buffer holds float32 today (int and bool values live only in expressions), so every
parameter and allocation left undecided by the earlier passes gets :data:`BUFFER_DTYPE`.
Parameters get their C pointer type: :mod:`polyfuse.cuda.lower_buffers` leaves their ``ctype``
as ``"const"`` (read-only) or ``""``.
"""

from __future__ import annotations

from dataclasses import replace

from polyfuse.cuda.kernel_ast import KernelIR, KParam

BUFFER_DTYPE = "float32"
C_TYPES = {"float32": "float", "int32": "int", "bool": "bool"}


def assign_dtypes(ir: KernelIR, dtype: str = BUFFER_DTYPE) -> KernelIR:
    """A new IR whose parameters and allocations all have an element type."""
    ctype = C_TYPES[dtype]
    params = tuple(
        p
        if p.ctype not in ("", "const")
        else KParam(p.name, f"{p.ctype} {ctype}*".strip(), p.tensor)
        for p in ir.params
    )
    allocs = tuple(a if a.dtype else replace(a, dtype=dtype) for a in ir.allocs)
    return ir.with_(params=params, allocs=allocs)
