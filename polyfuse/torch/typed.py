"""ATen lowerings that follow torch's type promotion, for every dtype polyfuse stores.

A region may hold float16, bfloat16, float32, float64, uint8, int8, int16, int32, int64 and bool
tensors (:data:`STORED_DTYPES`). Each lowering here computes the dtype torch computes in — found
with torch's own rule (``torch._prims_common.elementwise_dtypes``) from the operands' dtypes and
dimensions and the Python numbers beside them — converts every tensor operand to it with an
inline ``te.cast`` and writes each Python number in it, so the result has the dtype of the FX
value and the values torch computes:

- ``int + float`` is float (the int converted first, as torch does), ``int / int`` is the
  default float (true division), a comparison compares in the promoted dtype and gives bool,
  ``where`` converts both branches to their promoted dtype;
- ``div(rounding_mode="trunc")`` of integers is ``te.truncdiv``; ``div(rounding_mode="floor")``,
  ``floor_divide`` and ``remainder`` are te's ``//`` and ``%`` by a constant (Python's floor
  rule, as torch's) and ``te.truncdiv``/``te.truncmod`` moved by one where the truncated
  remainder's sign is not the divisor's, by a tensor. A zero divisor in a tensor gives 0
  (eager torch raises on the CPU; a kernel cannot), a constant zero stays in PyTorch;
- bool ``&``/``|``/``^``/``~`` are logical; ``hardtanh`` keeps its input's dtype;
- integer arithmetic wraps in two's complement (uint8, int8 and int16 at their width, int32
  at 32 bits, int64 at 64 bits) as torch's CPU and CUDA kernels do in practice;
- a 16-bit float is rounded to its dtype (:func:`stored`) before a comparison or a
  conversion, as eager torch stored it (kernels also hold 16-bit tensors rounded; the
  explicit cast keeps the lowering's meaning independent of that).

Reductions, ``argmax`` and gathers are in :mod:`.reduce`. What polyfuse cannot compute
exactly in a dtype (integer division by a constant 0, ``&`` of integers, a float ``div`` with a
rounding mode — torch corrects the rounding of ``a / b``, polyfuse floors it — arithmetic on
bools, integer results of lowerings written for floats) is refused by :func:`dtype_reason`,
and the node stays in PyTorch with a WARNING naming it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.fx

from polyfuse import te
from polyfuse.graph import dtypes as dt
from polyfuse.graph.expr import Expr, Tensor
from polyfuse.graph.inline import stored
from polyfuse.ops._common import bcast, broadcast_shape, op_name

__all__ = [
    "STORED_DTYPES",
    "as_dtype",
    "dtype_reason",
    "result_dtype",
    "te_dtype",
    "torch_dtype",
]

aten = torch.ops.aten

#: torch dtype → te dtype of the tensors a region may read and write (code generation
#: stores all of them; uint16, uint32, uint64, complex and float8 tensors stay in PyTorch)
STORED_DTYPES: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float64: "float64",
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.bool: "bool",
}
_TORCH = {v: k for k, v in STORED_DTYPES.items()}


def te_dtype(dtype: torch.dtype) -> str:
    """The te dtype of a region tensor of torch dtype ``dtype`` (one of :data:`STORED_DTYPES`)."""
    return STORED_DTYPES[dtype]


def torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of te dtype ``dtype``."""
    return _TORCH[dtype]


def as_dtype(x: Tensor, dtype: str) -> Tensor:
    """``x`` converted to ``dtype`` (itself when it has it): one elementwise ``te.cast``
    of the value torch converts — a 16-bit float rounded first (:func:`stored`), so that
    ``(x * 3).float()`` or ``.int()`` of a float16 ``x`` is exactly eager's (39 against
    eager's 40 otherwise: where the next step is discrete, the value must be the one eager's
    operator stored)."""
    if x.dtype == dtype:
        return x
    return te.compute(
        x.shape, lambda *i: te.cast(stored(x[i], x.dtype), dtype), name=f"{x.name}_{dtype}"
    )


# --------------------------------------------------------------------------------------------
# torch's promotion
# --------------------------------------------------------------------------------------------

Operand = Tensor | float | int | bool


def _meta(x: Any) -> Any:
    """A polyfuse tensor, an FX node or a number as ``elementwise_dtypes`` reads it: a meta
    tensor of the same dtype and dimensionality (a 0-d tensor promotes as a weaker operand
    than a dimensioned one), or the number itself."""
    if isinstance(x, torch.fx.Node):
        x = x.meta.get("val")
    if isinstance(x, Tensor):
        return torch.empty(x.shape, dtype=torch_dtype(x.dtype), device="meta")
    if isinstance(x, torch.Tensor):
        return torch.empty((1,) if x.dim() else (), dtype=x.dtype, device="meta")
    return x


def result_dtype(*operands: Any, int_to_float: bool = False) -> torch.dtype:
    """torch's result dtype of an elementwise op on ``operands`` (polyfuse tensors, FX nodes
    or Python numbers; None is skipped); ``int_to_float`` for true division and math."""
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Kind
    from torch._prims_common import elementwise_dtypes

    kind = Kind.INT_TO_FLOAT if int_to_float else Kind.DEFAULT
    args = [_meta(o) for o in operands if o is not None]
    return elementwise_dtypes(*args, type_promotion_kind=kind)[1]


def _number(v: Any, dtype: str, exact: bool = False) -> Any:
    """A Python number as an operand computing in ``dtype``: a weak float beside floats (it
    takes their dtype; beside float16/bfloat16 arithmetic keeps it in float32, as torch's
    ``opmath`` does), a constant of ``dtype`` otherwise or with ``exact`` (comparisons:
    torch rounds the number to the compared dtype, ``x_f16 >= 0.1`` compares with float16's
    0.1, and wraps it into a narrow integer type, ``x_u8 > -3`` with 253)."""
    if dt.is_float(dtype):
        return te.const(float(v), dtype) if exact else float(v)
    if dtype == "bool":
        return te.const(bool(v), "bool")
    if dtype in dt.NARROW_INTS:  # torch converts the number to the type: it wraps
        v = np.asarray(int(v), np.int64).astype(dt.numpy_dtype(dtype))  # x_u8 > -3: x > 253
    return te.const(int(v), dtype)


def _typed(
    dtype: str, *operands: Operand, exact: bool = False
) -> Callable[[tuple[Expr, ...]], list[Any]]:
    """Read ``operands`` at broadcast loop variables, each converted to ``dtype`` (numbers
    as :func:`_number` says; 16-bit floats rounded first where the result is exact or not a
    float, :func:`stored`)."""

    def read(idx: tuple[Expr, ...]) -> list[Any]:
        out: list[Any] = []
        for v in operands:
            if isinstance(v, Tensor):
                e = v[bcast(v.shape, idx)]
                if exact or not dt.is_float(dtype):
                    e = stored(e, v.dtype)
                out.append(e if v.dtype == dtype else te.cast(e, dtype))
            else:
                out.append(_number(v, dtype, exact))
        return out

    return read


def elementwise(
    op: str,
    fn: Callable[..., Any],
    operands: Sequence[Operand],
    dtype: str,
    exact: bool = False,
) -> Tensor:
    """One te.compute applying ``fn`` to ``operands`` (numpy broadcasting) converted to
    ``dtype``; tagged ``op`` as :mod:`polyfuse.ops` tags its composites."""
    tensors = [t for t in operands if isinstance(t, Tensor)]
    name = op_name(op, None)
    shape = broadcast_shape(op, name, [(t.shape, t.name) for t in tensors])
    read = _typed(dtype, *operands, exact=exact)
    return te.compute(shape, lambda *idx: fn(*read(idx)), name=name, tag=op)


def _promoted(*operands: Any, int_to_float: bool = False) -> str:
    return te_dtype(result_dtype(*operands, int_to_float=int_to_float))


# --------------------------------------------------------------------------------------------
# Lowerings
# --------------------------------------------------------------------------------------------


def _scaled(alpha: Any, dtype: str) -> Callable[[Any], Any]:
    return (lambda v: v) if alpha == 1 else (lambda v: v * _number(alpha, dtype))


def add(a: Operand, b: Operand, *, alpha: Any = 1) -> Tensor:
    """``a + alpha * b`` (``alpha`` takes the operands' dtype; torch refuses a float one for
    integers)."""
    dtype = _promoted(a, b)
    if dtype == "bool":  # torch: logical or (alpha, a bool, drops b when False)
        return elementwise("add", lambda x, y: (x | y) if alpha else x, [a, b], dtype)
    s = _scaled(alpha, dtype)
    return elementwise("add", lambda x, y: x + s(y), [a, b], dtype)


def sub(a: Operand, b: Operand, *, alpha: Any = 1) -> Tensor:
    """``a - alpha * b``."""
    dtype = _promoted(a, b)
    s = _scaled(alpha, dtype)
    return elementwise("sub", lambda x, y: x - s(y), [a, b], dtype)


def rsub(a: Operand, b: Operand, alpha: Any = 1) -> Tensor:
    """``b - alpha * a`` (``aten.rsub``: ``1 - x``)."""
    return sub(b, a, alpha=alpha)


def _binary(op: str, fn: Callable[[Any, Any], Any]) -> Callable[[Operand, Operand], Tensor]:
    def lower(a: Operand, b: Operand) -> Tensor:
        return elementwise(op, fn, [a, b], _promoted(a, b))

    return lower




def mul(a: Operand, b: Operand) -> Tensor:
    """``a * b``; of two bools, their logical and (as torch)."""
    dtype = _promoted(a, b)
    return elementwise("mul", (lambda x, y: x & y) if dtype == "bool" else _times, [a, b], dtype)


def _times(x: Any, y: Any) -> Any:
    return x * y


maximum = _binary("maximum", te.maximum)
minimum = _binary("minimum", te.minimum)


def pow_(a: Operand, b: Operand) -> Tensor:
    """``a ** b``: float power, or te's exact integer power (wrapping) for integers."""
    dtype = _promoted(a, b)
    return elementwise("pow", lambda x, y: x**y, [a, b], dtype)


def div(a: Operand, b: Operand, *, rounding_mode: str | None = None) -> Tensor:
    """True division (integers give the default float), or an integer ``floor``/``trunc``
    division (:func:`dtype_reason` refuses floats' and a constant zero divisor)."""
    if rounding_mode is None:
        return elementwise("div", lambda x, y: x / y, [a, b], _promoted(a, b, int_to_float=True))
    dtype = _promoted(a, b)
    if rounding_mode == "trunc":
        return elementwise("truncdiv", te.truncdiv, [a, b], dtype)
    if not isinstance(b, Tensor):
        return elementwise("floordiv", lambda x, y: x // y, [a, b], dtype)

    def floor(x: Any, y: Any) -> Any:
        one, zero = te.const(1, dtype), te.const(0, dtype)
        return te.truncdiv(x, y) - te.where(_below_floor(x, y), one, zero)

    return elementwise("floordiv", floor, [a, b], dtype)


def remainder(a: Operand, b: Operand) -> Tensor:
    """``torch.remainder`` of integers: the divisor's sign (te's ``%`` by a constant, the
    truncated remainder moved by one divisor where its sign is the dividend's otherwise)."""
    dtype = _promoted(a, b)
    if not isinstance(b, Tensor):
        return elementwise("remainder", lambda x, y: x % y, [a, b], dtype)

    def floor_mod(x: Any, y: Any) -> Any:
        return te.truncmod(x, y) + te.where(_below_floor(x, y), y, te.const(0, dtype))

    return elementwise("remainder", floor_mod, [a, b], dtype)


def _below_floor(x: Any, y: Any) -> Any:
    """Where the floor quotient of integers is one below the truncated one: a nonzero
    truncated remainder (the dividend's sign) of the divisor's opposite sign."""
    r = te.truncmod(x, y)
    return te.where(r < 0, y > 0, (r > 0) & (y < 0))


def fmod(a: Operand, b: Operand) -> Tensor:
    """``torch.fmod`` of integers: the truncated remainder (the dividend's sign),
    ``te.truncmod``; :func:`dtype_reason` refuses floats."""
    return elementwise("fmod", te.truncmod, [a, b], _promoted(a, b))


def compare(op: str) -> Callable[[Operand, Operand], Tensor]:
    """``aten.eq/ne/lt/le/gt/ge``: compared in the promoted dtype, a bool result."""
    fn = {
        "eq": te.equal,
        "ne": te.not_equal,
        "lt": lambda x, y: x < y,
        "le": lambda x, y: x <= y,
        "gt": lambda x, y: x > y,
        "ge": lambda x, y: x >= y,
    }[op]

    def lower(a: Operand, b: Operand) -> Tensor:
        return elementwise(op, fn, [a, b], _promoted(a, b), exact=True)

    return lower


def where(cond: Tensor, a: Operand, b: Operand) -> Tensor:
    """``aten.where.self``: the branches in their promoted dtype, the condition as bool."""
    dtype = _promoted(a, b)
    c = cond if cond.dtype == "bool" else as_dtype(cond, "bool")
    read = _typed(dtype, a, b)
    tensors = [t for t in (c, a, b) if isinstance(t, Tensor)]
    shape = broadcast_shape("where", "where", [(t.shape, t.name) for t in tensors])
    return te.compute(
        shape,
        lambda *idx: te.where(c[bcast(c.shape, idx)], *read(idx)),
        name=op_name("where", None),
        tag="where",
    )


def logical(op: str) -> Callable[..., Tensor]:
    """``aten.logical_*`` (any dtype, tested ``!= 0``) and ``aten.bitwise_*`` of bools."""
    fn = {
        "and": lambda x, y: x & y,
        "or": lambda x, y: x | y,
        "xor": te.not_equal,
        "not": lambda x: te.equal(x, te.const(False, "bool")),
    }[op]

    def lower(*xs: Operand) -> Tensor:
        return elementwise(f"logical_{op}", fn, list(xs), "bool")

    return lower


def bitwise(op: str) -> Callable[..., Tensor]:
    """``aten.bitwise_*``: of integers, bitwise in the promoted dtype (two's complement, as
    torch); of bools, logical."""
    fn = {"and": te.bitwise_and, "or": te.bitwise_or, "xor": te.bitwise_xor}.get(op)

    def lower(*xs: Operand) -> Tensor:
        dtype = _promoted(*xs)
        if dtype == "bool":
            return logical(op)(*xs)
        if fn is None:
            return elementwise("bitwise_not", te.bitwise_not, list(xs), dtype)
        return elementwise(f"bitwise_{op}", fn, list(xs), dtype)

    return lower


def shift(direction: str) -> Callable[..., Tensor]:
    """``aten.bitwise_left_shift`` / ``bitwise_right_shift`` (``<<``, ``>>``) of integers in
    the promoted dtype: a left shift wraps, a right shift is arithmetic (torch's ints are
    signed); a shift outside ``[0, width)`` gives 0 (right: the sign), as torch."""
    fn = te.shift_left if direction == "left" else te.shift_right_arithmetic

    def lower(a: Operand, b: Operand) -> Tensor:
        return elementwise(f"shift_{direction}", fn, [a, b], _promoted(a, b))

    return lower


def relu(x: Tensor) -> Tensor:
    return elementwise("relu", lambda v, z: te.maximum(v, z), [x, 0], x.dtype)


def clamp(x: Tensor, lo: Any = None, hi: Any = None) -> Tensor:
    """``min(max(x, lo), hi)`` in the promoted dtype of ``x``, ``lo`` and ``hi``."""
    dtype = _promoted(x, lo, hi)
    bounds = [b for b in (lo, hi) if b is not None]

    def body(v: Any, *b: Any) -> Any:
        it = iter(b)
        if lo is not None:
            v = te.maximum(v, next(it))
        if hi is not None:
            v = te.minimum(v, next(it))
        return v

    return elementwise("clamp", body, [x, *bounds], dtype)


def hardtanh(x: Tensor, lo: Any = -1.0, hi: Any = 1.0) -> Tensor:
    """``aten.hardtanh``: a clamp in ``x``'s own dtype (torch converts the bounds to it,
    truncating a float bound for integers; unlike ``clamp``, nothing promotes)."""
    if not dt.is_float(x.dtype):
        lo, hi = int(lo), int(hi)
    return elementwise(
        "hardtanh", lambda v, a, b: te.minimum(te.maximum(v, a), b), [x, lo, hi], x.dtype
    )


def float_math(fn: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    """A float function (``exp``, ``tanh``, …): an integer or bool input is converted to the
    default float first, as torch does."""

    def lower(x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        return fn(x if dt.is_float(x.dtype) else as_dtype(x, dt.DEFAULT_FLOAT), *args, **kwargs)

    return lower


def scalar_tensor(value: Any, *, dtype: torch.dtype | None = None, **_: Any) -> Tensor:
    """``aten.scalar_tensor``: a 0-d constant (``masked_fill``'s fill value)."""
    d = te_dtype(dtype) if dtype is not None else dt.DEFAULT_FLOAT
    return te.compute((), lambda: _number(value, d, exact=True), name=op_name("scalar", None))


def _fill_dtype(value: Any, dtype: torch.dtype | None) -> str:
    """``dtype``, or torch's dtype for a fill of ``value`` alone (bool, int64, float32)."""
    if dtype is not None:
        return te_dtype(dtype)
    if isinstance(value, bool):
        return "bool"
    return "int64" if isinstance(value, int) else dt.DEFAULT_FLOAT


def full(size: Sequence[int], value: Any, *, dtype: torch.dtype | None = None, **_: Any) -> Tensor:
    """``aten.full``: a constant tensor of ``size``."""
    d = _fill_dtype(value, dtype)
    fill = _number(value, d, exact=True)
    return te.compute(tuple(size), lambda *i: fill, name=op_name("full", None))


def full_like(x: Tensor, value: Any, *, dtype: torch.dtype | None = None, **_: Any) -> Tensor:
    """``aten.full_like``: a constant tensor of ``x``'s shape (and dtype unless given)."""
    d = te_dtype(dtype) if dtype is not None else x.dtype
    return te.compute(x.shape, lambda *i: _number(value, d, exact=True), name=op_name("full", None))


def arange(
    start: Any, end: Any = None, step: Any = 1, *, dtype: torch.dtype | None = None, **_: Any
) -> Tensor:
    """``aten.arange`` (``arange(end)``, ``arange(start, end[, step])``): ``start + i * step``,
    integers exactly, floats computed in float64 and rounded once (as torch's kernel)."""
    if end is None:
        start, end = 0, start
    ints = all(isinstance(v, int) for v in (start, end, step))
    d = te_dtype(dtype) if dtype is not None else ("int64" if ints else dt.DEFAULT_FLOAT)
    n = len(range(start, end, step)) if ints else max(0, math.ceil((end - start) / step))
    if dt.is_float(d):
        return te.compute(
            (n,),
            lambda i: te.cast(te.const(float(start), "float64") + te.cast(i, "float64") * step, d),
            name=op_name("arange", None),
        )
    return te.compute(
        (n,), lambda i: te.const(start, d) + te.cast(i, d) * step, name=op_name("arange", None)
    )


def cat(xs: Sequence[Tensor], dim: int = 0) -> Tensor:
    """``torch.cat``: the inputs converted to their promoted dtype first."""
    from polyfuse import ops

    dtype = _promoted(*xs)
    return ops.concat([as_dtype(x, dtype) for x in xs], axis=dim % len(xs[0].shape))


# --------------------------------------------------------------------------------------------
# Refusals
# --------------------------------------------------------------------------------------------


def _val(a: Any) -> Any:
    return a.meta.get("val") if isinstance(a, torch.fx.Node) else a


def _is_tensor(a: Any) -> bool:
    return isinstance(_val(a), torch.Tensor)


_INT_DIVISION = {
    aten.div.Tensor_mode,
    aten.div.Scalar_mode,
    aten.floor_divide.default,
    aten.floor_divide.Scalar,
    aten.remainder.Tensor,
    aten.remainder.Scalar,
    aten.fmod.Tensor,
    aten.fmod.Scalar,
}
#: Lowerings written for float results (their ops use float constants: a mean's 1/n, a
#: pool's -inf padding, a convolution's 0.0 padding, normalisation): an integer result
#: (torch's integer avg_pool2d truncates) stays in PyTorch.
_FLOAT_ONLY = {
    aten.convolution.default,
    aten.max_pool2d_with_indices.default,
    aten.avg_pool2d.default,
    aten.native_layer_norm.default,
    aten._native_batch_norm_legit_no_training.default,
    aten._native_batch_norm_legit.no_stats,
    aten._adaptive_avg_pool2d.default,
    aten.native_group_norm.default,
    aten._softmax.default,
    aten._log_softmax.default,
    aten._safe_softmax.default,
    aten.gelu.default,
    aten.mean.dim,
    aten.mean.default,
}


def dtype_reason(node: torch.fx.Node) -> str | None:
    """Why a node of a stored dtype cannot be computed exactly in it, else None. Reasons
    start with ``dtype <name>:`` so that the backend counts and logs them as dtype
    fallbacks."""
    target, args, kwargs = node.target, node.args, node.kwargs
    if target in _INT_DIVISION:
        mode = kwargs.get("rounding_mode", "floor")
        if target in (aten.remainder.Tensor, aten.remainder.Scalar):
            mode = "remainder"
        if target in (aten.fmod.Tensor, aten.fmod.Scalar):
            mode = "fmod"
        if mode is None:
            return None
        d = result_dtype(*args[:2])
        name = str(d).removeprefix("torch.")
        what = mode if mode in ("remainder", "fmod") else f"{mode} division"
        if d.is_floating_point:
            how = {
                "remainder": "torch's is fmod-based, polyfuse's a - b * floor(a / b)",
                "fmod": "te has no float fmod",
            }.get(mode, "torch corrects the rounding of a / b; polyfuse floors it")
            return f"dtype {name}: {what} of floats ({how})"
        b = args[1]
        if not _is_tensor(b) and int(b) == 0:
            return f"dtype {name}: integer division by zero (torch raises)"
        return None
    if target in _FLOAT_ONLY:
        v = _val(node)
        d = (v[0] if isinstance(v, (list, tuple)) else v).dtype
        if not d.is_floating_point:
            name = str(d).removeprefix("torch.")
            return f"dtype {name}: {target} of integers (polyfuse lowers it for floats)"
    if target is aten.index.Tensor:
        idx = [t for t in args[1] if t is not None]
        if not idx or any(
            not isinstance(t, torch.fx.Node) or _val(t).dtype not in (torch.int32, torch.int64)
            for t in idx
        ):
            return "index by a bool mask (a data-dependent shape)"
    return None
