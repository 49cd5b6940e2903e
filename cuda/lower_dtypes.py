"""Lowering pass: element types of parameters and allocations.

Every buffer holds float32 today (int and bool values live only in expressions), so every
parameter and allocation left undecided by the earlier passes gets :data:`BUFFER_DTYPE`.
Parameters get their C pointer type: :mod:`polyfuse.cuda.lower_buffers` leaves their ``ctype``
as ``"const"`` (read-only) or ``""``. :func:`check_codegen_dtypes` is where a graph of
another dtype is refused, at the start of ``polyfuse.compile``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

from polyfuse.base.errors import UnsupportedDtypeError
from polyfuse.cuda.kernel_ast import KernelIR, KParam
from polyfuse.graph import expr as ex

BUFFER_DTYPE = "float32"
C_TYPES = {"float32": "float", "int32": "int", "bool": "bool"}
#: Dtypes an expression inside a float32 kernel may have (int64 only from wide constants).
EXPR_DTYPES = ("float32", "int32", "int64", "bool")
_ONLY = (
    "code generation supports float32 only for now (polyfuse.reference.evaluate runs every dtype)"
)


def check_codegen_dtypes(inputs: Sequence[ex.Tensor], outputs: Sequence[ex.Tensor]) -> None:
    """Refuse, before anything is scheduled, a graph the code generator cannot print: a tensor
    that is not float32, or an expression whose dtype no kernel computes in (a float16 cast, a
    float64 accumulator, an int64 cast or integer ``//``). Index arithmetic, comparisons and
    selects in int32/bool (and int64 constants) inside float32 kernels are what they were.
    Raises :class:`UnsupportedDtypeError` naming the tensor and the dtype."""
    tensors = sorted(_reachable([*inputs, *outputs]), key=lambda t: not t.is_placeholder)
    for t in tensors:
        if t.dtype != BUFFER_DTYPE:
            kind = "input" if t.is_placeholder else "compute"
            raise UnsupportedDtypeError(f"compile: {kind} '{t.name}' is {t.dtype}; {_ONLY}")
    for t in tensors:
        if t.op is not None:
            for e in ex.walk(t.op.body):
                if (why := _unsupported(e)) is not None:
                    raise UnsupportedDtypeError(f"compile: compute '{t.name}' {why}; {_ONLY}")


def _unsupported(e: ex.Expr) -> str | None:
    """Why the printer cannot emit node ``e`` (None when it can)."""
    if isinstance(e, ex.Cast) and e.dtype not in C_TYPES:
        return f"casts to {e.dtype}"
    if isinstance(e, ex.Reduce) and e.accumulate_dtype != BUFFER_DTYPE:
        return f"accumulates its {e.op} in {e.accumulate_dtype}"
    if e.dtype not in EXPR_DTYPES:
        return f"computes in {e.dtype}"
    if isinstance(e, ex.Binary) and e.op in ("floordiv", "mod") and e.dtype == "int64":
        return "divides int64 integers"
    return None


def _reachable(roots: Sequence[ex.Tensor]) -> Iterator[ex.Tensor]:
    """Every tensor ``roots`` depend on (themselves included), each once."""
    seen: set[int] = set()
    stack = [t for t in roots if isinstance(t, ex.Tensor)]  # the driver reports the rest
    while stack:
        t = stack.pop()
        if t.uid in seen:
            continue
        seen.add(t.uid)
        yield t
        if t.op is not None:
            stack.extend(t.op.inputs())


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
