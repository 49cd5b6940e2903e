"""Lowering pass: element types of parameters and allocations, and the dtypes kernels print.

A global buffer holds its tensor's dtype: float32, float16/bfloat16 (``__half``, ``__nv_bfloat16``),
float64 (``double``), uint8/int8/int16 (``unsigned char``, ``signed char``, ``short``), int32
(``int``), int64 (``long long``) or bool. 16-bit arithmetic runs in float32 registers: a 16-bit
value is widened when it is loaded and rounded to nearest even when it is stored or cast, so the
operations of one body round once, at its end; a 16-bit tensor kept in a register or shared memory
holds its rounded value too (``lower_accesses.narrowed``), as the reference rounds every tensor
(reductions of 16-bit values accumulate in float32, the default of
:func:`polyfuse.graph.dtypes.accumulate_dtype`). Every other dtype is computed in its own C type
(float64 in doubles, int32 arithmetic wrapping in 32 bits; the narrow integers in C's ``int``, each
operation's result cast back to its type, which wraps it as torch does). Shared-memory and register
allocations hold :func:`polyfuse.graph.dtypes.register_dtype` of their tensor (float32 for the
16-bit floats). Parameters get their C pointer type: :mod:`polyfuse.cuda.codegen.lower_buffers`
leaves their ``ctype`` as ``"const"`` (read-only) or ``""``. :func:`check_codegen_dtypes` is where a
graph the printer cannot emit is refused, at the
start of ``polyfuse.compile``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace

from polyfuse.base.errors import UnsupportedDtypeError
from polyfuse.cuda.codegen.kernel_ast import KernelIR, KParam
from polyfuse.graph import expr as ex
from polyfuse.graph.dtypes import info, register_dtype

BUFFER_DTYPE = "float32"
#: C element types of the buffers and registers a kernel declares.
C_TYPES = {
    "float32": "float",
    "float16": "__half",
    "bfloat16": "__nv_bfloat16",
    "float64": "double",
    "uint8": "unsigned char",
    "int8": "signed char",
    "int16": "short",
    "int32": "int",
    "int64": "long long",
    "bool": "bool",
}
#: Dtypes a global buffer may hold.
STORAGE_DTYPES = tuple(C_TYPES)
#: 16-bit storage dtypes: widened to float on load, rounded on store (CUDA's conversions).
HALF_TO_FLOAT = {"float16": "__half2float", "bfloat16": "__bfloat162float"}
FLOAT_TO_HALF = {"float16": "__float2half_rn", "bfloat16": "__float2bfloat16_rn"}
#: Dtypes an expression may have (float16/bfloat16 values are computed in float32).
EXPR_DTYPES = STORAGE_DTYPES
_ONLY = (
    "code generation accumulates a reduction in its result's register dtype "
    "(float32 for 16-bit floats; polyfuse.reference.evaluate runs every accumulator)"
)


def is_float_register(dtype: str) -> bool:
    """Whether values of ``dtype`` live in float registers (float32 and the 16-bit floats)."""
    return dtype in ("float32", "float16", "bfloat16")


def check_codegen_dtypes(inputs: Sequence[ex.Tensor], outputs: Sequence[ex.Tensor]) -> None:
    """Refuse, before anything is scheduled, a graph the code generator cannot print: a tensor
    stored in a dtype other than :data:`STORAGE_DTYPES`, or a reduction whose accumulator is
    not its result's register dtype (``accumulate="float16"``, or float64 for a float32
    sum). A matmul or conv of
    16-bit operands is not refused: the GEMM path (whose tiles are float32) declines it with
    its reason and the reduction mapping computes it. Raises :class:`UnsupportedDtypeError`
    naming the tensor."""
    tensors = sorted(_reachable([*inputs, *outputs]), key=lambda t: not t.is_placeholder)
    for t in tensors:
        if t.dtype not in STORAGE_DTYPES:
            kind = "input" if t.is_placeholder else "compute"
            raise UnsupportedDtypeError(f"compile: {kind} '{t.name}' is {t.dtype}; {_ONLY}")
    for t in tensors:
        if t.op is None:
            continue
        for e in ex.walk(t.op.body):
            if (why := _unsupported(e)) is not None:
                raise UnsupportedDtypeError(f"compile: compute '{t.name}' {why}; {_ONLY}")


def _unsupported(e: ex.Expr) -> str | None:
    """Why the printer cannot emit node ``e`` (None when it can)."""
    if isinstance(e, ex.Cast) and e.dtype not in C_TYPES:
        return f"casts to {e.dtype}"
    if isinstance(e, ex.Reduce) and e.accumulate_dtype != register_dtype(e.dtype):
        return f"accumulates its {e.op} in {e.accumulate_dtype}"
    if e.dtype not in EXPR_DTYPES:
        return f"computes in {e.dtype}"
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


def storage_dtypes(model) -> dict[str, str]:
    """Buffer name → the dtype its global buffer holds, for the tensors of a poly model."""
    return {name: role.dtype for name, role in model.tensors.items()}


def alloc_dtypes(ir: KernelIR, dtypes: Mapping[str, str]) -> dict[str, str]:
    """Allocation name → the register dtype it holds: a tensor's shared tile and register
    hold :func:`register_dtype` of the tensor's dtype (an accumulator too: the model's
    ``<t>_acc`` tensors have their own dtype); a combine's scratch the widest of its
    reductions' (float32 when none is 8 bytes wide)."""
    namer = ir.namer
    out: dict[str, str] = {}
    for t, d in dtypes.items():
        reg = register_dtype(d)
        out[namer.shared(t)] = out[namer.register(t)] = reg  # accumulators are tensors too
    combines = ir.combines
    if combines:
        regs = [register_dtype(dtypes.get(c.reduction, BUFFER_DTYPE)) for c in combines]
        widest = max(regs, key=lambda d: (info(d).itemsize, d), default=BUFFER_DTYPE)
        out[combines[0].scratch] = widest if info(widest).itemsize > 4 else BUFFER_DTYPE
    return out


def assign_dtypes(ir: KernelIR, dtypes: Mapping[str, str] | None = None) -> KernelIR:
    """A new IR whose parameters and allocations all have an element type: a parameter its
    tensor's storage dtype (``dtypes``: buffer name → dtype; float32 where absent), an
    allocation its tensor's register dtype (:func:`alloc_dtypes`; float32 where unknown:
    shared and register copies of 16-bit tensors hold widened values)."""
    dtypes = dtypes or {}
    params = tuple(
        p
        if p.ctype not in ("", "const")
        else KParam(
            p.name,
            f"{p.ctype} {C_TYPES[dtypes.get(p.tensor or '', BUFFER_DTYPE)]}*".strip(),
            p.tensor,
        )
        for p in ir.params
    )
    held = alloc_dtypes(ir, dtypes)
    allocs = tuple(
        a if a.dtype else replace(a, dtype=held.get(a.name, BUFFER_DTYPE)) for a in ir.allocs
    )
    return ir.with_(params=params, allocs=allocs)
