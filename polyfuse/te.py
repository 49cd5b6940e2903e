"""``polyfuse.te``: write tensor expressions.

Example::

    x = te.placeholder((M, N), name="x")
    k = te.reduce_axis(N, name="k")
    m = te.compute((M,), lambda i: te.max(x[i, k], axis=k), name="row_max")
    y = te.compute((M, N), lambda i, j: te.exp(x[i, j] - m[i]), name="y")

Every ``te.compute`` is one primitive op: a loop nest over its shape whose body reads other
tensors with affine subscripts. A reduction must be the outermost expression of a body; a
reduction nested inside a bigger expression is split into a compute of its own, so that every
primitive is a single loop nest isl can model.

Dtypes: placeholders, computes and constants take any of float16, bfloat16, float32, float64,
int32, int64 and bool; the typing rules (promotion, Python numbers, division, reductions and
their float32 accumulators for half precision) are those of :mod:`polyfuse.graph.dtypes`.
Code generation and ``polyfuse.reference.evaluate`` run every one of them.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from polyfuse.errors import ExpressionError
from polyfuse.graph import dtypes as dt
from polyfuse.graph.bounds import check_bounds
from polyfuse.graph.expr import (
    INT64_RANGE,
    Binary,
    Cast,
    Compare,
    ComputeOp,
    Const,
    DataIndex,
    Expr,
    ExprMutator,
    ExprVisitor,
    IterVar,
    Read,
    Reduce,
    Select,
    Tensor,
    Unary,
    as_expr,
    check_dtype,
    substitute,
    walk,
)

__all__ = [
    "Expr",
    "IterVar",
    "Tensor",
    "abs",
    "acos",
    "acosh",
    "asin",
    "asinh",
    "atan",
    "atan2",
    "atanh",
    "bitwise_and",
    "bitwise_not",
    "bitwise_or",
    "bitwise_xor",
    "cast",
    "ceil",
    "compute",
    "const",
    "cos",
    "cosh",
    "data_index",
    "equal",
    "erf",
    "exp",
    "exp2",
    "expm1",
    "floor",
    "isinf",
    "isnan",
    "log",
    "log10",
    "log1p",
    "log2",
    "max",
    "maximum",
    "min",
    "minimum",
    "not_equal",
    "placeholder",
    "prod",
    "reduce_axis",
    "round",
    "rsqrt",
    "sigmoid",
    "sin",
    "sinh",
    "sqrt",
    "sum",
    "tan",
    "tanh",
    "truncdiv",
    "truncmod",
    "where",
]

_names = itertools.count()


def _shape(shape: Any, what: str) -> tuple[int, ...]:
    if isinstance(shape, int):
        shape = (shape,)
    try:
        dims = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise ExpressionError(f"{what}: shape {shape!r} must be a tuple of ints") from None
    if any(d <= 0 for d in dims) or any(int(s) != s for s in shape):
        raise ExpressionError(f"{what}: shape {shape!r} must hold positive integers")
    return dims


def placeholder(
    shape: Sequence[int] | int, dtype: str = "float32", name: str | None = None
) -> Tensor:
    """A graph input of the given static shape and dtype (any of
    :data:`polyfuse.graph.dtypes.DTYPES`)."""
    name = name or f"placeholder{next(_names)}"
    return Tensor(
        _shape(shape, f"placeholder '{name}'"), check_dtype(dtype, f"placeholder '{name}'"), name
    )


def reduce_axis(dom: int | tuple[int, int], name: str | None = None) -> IterVar:
    """A reduction axis over ``range(dom)`` or ``range(lo, hi)``."""
    lo, hi = (0, dom) if isinstance(dom, int) else (int(dom[0]), int(dom[1]))
    name = name or f"k{next(_names)}"
    if hi <= lo:
        raise ExpressionError(f"reduce axis '{name}': empty range [{lo}, {hi})")
    return IterVar(name, lo, hi, "reduce")


#: What to write instead of a reduction called with a value where its axis goes.
_ELEMENTWISE = {
    "sum": "a + b",
    "prod": "a * b",
    "max": "te.maximum(a, b)",
    "min": "te.minimum(a, b)",
}


def _accumulator(op: str, body: Expr, accumulate: str | None) -> str | None:
    """``accumulate=`` checked: a dtype of the result's category (a float sum accumulates in
    a float, an integer or bool sum in an integer)."""
    if accumulate is None:
        return None
    acc = check_dtype(accumulate, f"te.{op}(accumulate=)")
    result = dt.reduce_dtype(op, body.dtype)
    if dt.DTYPES[acc].kind != dt.DTYPES[result].kind:
        raise ExpressionError(
            f"te.{op}: accumulate='{acc}' for {result} values; accumulate in a dtype of the "
            "same kind (a float for floats, an integer for integers)"
        )
    return acc


def _reduce(
    op: str, expr: Any, axis: IterVar | Sequence[IterVar], accumulate: str | None = None
) -> Reduce:
    axes = (axis,) if isinstance(axis, Expr) or not isinstance(axis, Iterable) else tuple(axis)
    if not axes:
        raise ExpressionError(f"te.{op}: give at least one reduce axis")
    for a in axes:
        if not isinstance(a, IterVar) or a.kind != "reduce":
            raise ExpressionError(
                f"te.{op}(expr, axis): {a!r} is not a te.reduce_axis; te.{op} reduces over "
                f"reduce axes, for the elementwise {op} of two values write {_ELEMENTWISE[op]}"
            )
    if len({a.uid for a in axes}) != len(axes):
        raise ExpressionError(f"te.{op}: reduce axis used twice in axis={list(axes)}")
    body = as_expr(expr)
    return Reduce(op, body, axes, _accumulator(op, body, accumulate))


def sum(  # noqa: A001
    expr: Any, axis: IterVar | Sequence[IterVar], accumulate: str | None = None
) -> Reduce:
    """Sum of ``expr`` over the reduce axes, in the dtype of ``expr`` (int32 for bools).

    Partial sums are kept in ``accumulate``; by default float32 for float16 and bfloat16
    values (a float16 running sum stops growing at 2048 when adding ones), else the result's
    dtype."""
    return _reduce("sum", expr, axis, accumulate)


def prod(
    expr: Any, axis: IterVar | Sequence[IterVar], accumulate: str | None = None
) -> Reduce:
    """Product of ``expr`` over the reduce axes, in its dtype (integers wrap, as numpy's;
    of bools, their and); ``accumulate`` as for :func:`sum` (float32 for 16-bit floats)."""
    return _reduce("prod", expr, axis, accumulate)


def max(  # noqa: A001
    expr: Any, axis: IterVar | Sequence[IterVar], accumulate: str | None = None
) -> Reduce:
    """Maximum of ``expr`` over the reduce axes (``accumulate`` as for :func:`sum`)."""
    return _reduce("max", expr, axis, accumulate)


def min(  # noqa: A001
    expr: Any, axis: IterVar | Sequence[IterVar], accumulate: str | None = None
) -> Reduce:
    """Minimum of ``expr`` over the reduce axes (``accumulate`` as for :func:`sum`)."""
    return _reduce("min", expr, axis, accumulate)


#: te's bitwise binary ops and the functions that make them
BITWISE = {
    "bitand": "bitwise_and",
    "bitor": "bitwise_or",
    "bitxor": "bitwise_xor",
    "shl": "shift_left",
    "shr": "shift_right",
}


def _unary(op: str, doc: str | None = None) -> Callable[[Any], Expr]:
    def f(x: Any) -> Expr:
        return Unary(op, as_expr(x))

    f.__name__ = op
    f.__doc__ = doc or f"Elementwise ``{op}``."
    return f


exp = _unary("exp")
log = _unary("log")
sqrt = _unary("sqrt")
rsqrt = _unary("rsqrt")
tanh = _unary("tanh")
erf = _unary("erf")
log1p = _unary("log1p", "Elementwise ``log(1 + x)``, accurate where ``1 + x`` rounds.")
expm1 = _unary("expm1", "Elementwise ``exp(x) - 1``, accurate where ``- 1`` cancels.")
sigmoid = _unary("sigmoid")
abs = _unary("abs")  # noqa: A001
sin = _unary("sin")
cos = _unary("cos")
tan = _unary("tan")
asin = _unary("asin", "Elementwise arcsine (NaN outside [-1, 1]).")
acos = _unary("acos", "Elementwise arccosine (NaN outside [-1, 1]).")
atan = _unary("atan")
sinh = _unary("sinh")
cosh = _unary("cosh")
asinh = _unary("asinh")
acosh = _unary("acosh", "Elementwise inverse hyperbolic cosine (NaN below 1).")
atanh = _unary("atanh", "Elementwise inverse hyperbolic tangent (NaN outside [-1, 1]).")
exp2 = _unary("exp2", "Elementwise ``2 ** x``.")
log2 = _unary("log2")
log10 = _unary("log10")


def floor(x: Any) -> Expr:
    """The largest integer not above ``x`` (C ``floor``), in ``x``'s float dtype; an integer
    ``x`` is its own floor. NaN and infinities pass through."""
    e = as_expr(x)
    return e if not e.dtype.startswith(("float", "bfloat")) else Unary("floor", e)


def ceil(x: Any) -> Expr:
    """The smallest integer not below ``x`` (C ``ceil``), in ``x``'s float dtype; an integer
    ``x`` is its own ceiling. NaN and infinities pass through."""
    e = as_expr(x)
    return e if not e.dtype.startswith(("float", "bfloat")) else Unary("ceil", e)


def round(x: Any) -> Expr:  # noqa: A001
    """Round to the nearest integer, halves to the even one (IEEE ``rint``: numpy ``rint``,
    ONNX ``Round``, CUDA ``rintf``): ``round(2.5) == 2``, ``round(-0.5) == -0``."""
    return Unary("round", as_expr(x))


def isnan(x: Any) -> Expr:
    """``x`` is NaN, as a boolean expression (``x != x``: only NaN differs from itself)."""
    e = as_expr(x)
    return Compare("ne", e, e)


def isinf(x: Any, positive: bool = True, negative: bool = True) -> Expr:
    """``x`` is +inf (``positive``) or -inf (``negative``), as a boolean expression."""
    e = as_expr(x)
    if positive and negative:
        return Compare("eq", Unary("abs", e), as_expr(float("inf")))
    if positive or negative:
        return Compare("eq", e, as_expr(float("inf") if positive else float("-inf")))
    return Compare("ne", as_expr(0.0), as_expr(0.0))  # neither flag: always false


def atan2(y: Any, x: Any) -> Expr:
    """The angle of the point ``(x, y)``, in ``[-pi, pi]`` (C ``atan2``; float32 for
    integers)."""
    return Binary("atan2", as_expr(y), as_expr(x))


def maximum(a: Any, b: Any) -> Expr:
    """Elementwise maximum."""
    return Binary("max", as_expr(a), as_expr(b))


def minimum(a: Any, b: Any) -> Expr:
    """Elementwise minimum."""
    return Binary("min", as_expr(a), as_expr(b))


def truncdiv(a: Any, b: Any) -> Expr:
    """Integer division rounding toward zero (C's ``a / b``; ``truncdiv(-7, 2) == -3``) by
    any integer divisor, a tensor value too (``//`` takes constants only). Defined for every
    pair of operands, as numpy's integer ``//`` is: a zero divisor gives 0, and ``INT_MIN``
    divided by -1 wraps to ``INT_MIN`` (C leaves both undefined; the emulator would trap)."""
    return Binary("tdiv", as_expr(a), as_expr(b))


def truncmod(a: Any, b: Any) -> Expr:
    """The remainder of :func:`truncdiv`, ``a - b * truncdiv(a, b)`` (C's ``a % b``: the
    dividend's sign; ``truncmod(-7, 2) == -1``); 0 for a zero divisor (numpy's integer ``%``)
    and for a divisor of -1."""
    return Binary("tmod", as_expr(a), as_expr(b))


def bitwise_and(a: Any, b: Any) -> Expr:
    """Bitwise ``a & b`` of integers (two's complement; of bools, their and). ``&`` on
    expressions is the logical and of conditions."""
    return Binary("bitand", as_expr(a), as_expr(b))


def bitwise_or(a: Any, b: Any) -> Expr:
    """Bitwise ``a | b`` of integers (of bools, their or)."""
    return Binary("bitor", as_expr(a), as_expr(b))


def bitwise_xor(a: Any, b: Any) -> Expr:
    """Bitwise ``a ^ b`` of integers (of bools, whether they differ)."""
    return Binary("bitxor", as_expr(a), as_expr(b))


def shift_left(a: Any, b: Any) -> Expr:
    """``a << b`` of integers: the bits of ``a`` moved ``b`` places up, zeros in, wrapping at
    the dtype's width; 0 for a shift outside ``[0, width)`` (C leaves it undefined)."""
    return Binary("shl", as_expr(a), as_expr(b))


def shift_right(a: Any, b: Any) -> Expr:
    """``a >> b`` of integers, logical: the bits of ``a`` (read as unsigned, so an int64
    holding a uint64 shifts right) moved ``b`` places down, zeros in; 0 for a shift outside
    ``[0, width)``."""
    return Binary("shr", as_expr(a), as_expr(b))


def shift_right_arithmetic(a: Any, b: Any) -> Expr:
    """``a >> b`` of signed integers: the sign fills in from the top (``~(~a >> b)`` for a
    negative ``a``, logical shifts both); a shift outside ``[0, width)`` gives the sign,
    -1 or 0."""
    a, b = as_expr(a), as_expr(b)
    return where(a < 0, bitwise_not(shift_right(bitwise_not(a), b)), shift_right(a, b))


def bitwise_not(x: Any) -> Expr:
    """Bitwise ``~x`` of an integer (``-x - 1``); of a bool, its negation."""
    return Unary("bitnot", as_expr(x))


def where(cond: Any, a: Any, b: Any) -> Expr:
    """``a`` where ``cond`` holds, else ``b``; only the chosen side is evaluated."""
    if isinstance(cond, bool):
        raise ExpressionError(
            "te.where: the condition is a Python bool (did you write `i == 0`? use te.equal(i, 0))"
        )
    return Select(as_expr(cond), as_expr(a), as_expr(b))


def equal(a: Any, b: Any) -> Expr:
    """``a == b`` as a boolean expression (``==`` itself stays Python identity)."""
    return Compare("eq", as_expr(a), as_expr(b))


def not_equal(a: Any, b: Any) -> Expr:
    """``a != b`` as a boolean expression."""
    return Compare("ne", as_expr(a), as_expr(b))


def data_index(x: Any) -> Expr:
    """A subscript computed from tensor data at run time (gather), e.g.
    ``te.compute((n, d), lambda i, j: table[te.data_index(ids[i]), j])``.

    Every other subscript must be affine; a data index makes the read opaque to isl (it may
    touch any element along that dimension). Values outside the dimension are undefined.
    """
    return DataIndex(Cast(as_expr(x), "int32"))


def cast(x: Any, dtype: str) -> Expr:
    """Convert to ``dtype``: to an integer truncates toward zero, to bool tests ``!= 0``, to a
    float rounds to nearest even."""
    return Cast(as_expr(x), check_dtype(dtype, "te.cast"))


def const(value: float | int | bool, dtype: str) -> Expr:
    """A constant of ``dtype`` (``te.const(0.1, "float16")`` is float16's 0.1). Unlike a
    Python number, which takes the dtype of the operand beside it, it promotes like a tensor
    value of its dtype."""
    dtype = check_dtype(dtype, "te.const")
    if isinstance(value, Expr) or not isinstance(value, int | float | bool):
        raise ExpressionError(f"te.const: {value!r} is not a Python number")
    if dtype == "bool":
        return Const(bool(value), dtype, weak=False)
    if dt.is_int(dtype):
        lim = np.iinfo(dt.numpy_dtype(dtype))
        if isinstance(value, float) and not value.is_integer():
            raise ExpressionError(f"te.const: {value!r} is not an integer ({dtype})")
        if not lim.min <= int(value) <= lim.max:
            raise ExpressionError(f"te.const: {value!r} does not fit {dtype}")
        return Const(int(value), dtype, weak=False)
    return Const(float(value), dtype, weak=False)


# --------------------------------------------------------------------------- compute


def _axis_names(fcompute: Callable[..., Any], n: int, name: str) -> list[str]:
    """Names of the ``n`` loop variables, bound to the lambda's positional parameters the way
    Python binds ``fcompute(*axes)``: parameters with defaults (``lambda i, j, c=c: ...``, the
    usual closure capture), ``*args`` and ``**kwargs`` take what is left or keep defaults."""
    try:
        params = list(inspect.signature(fcompute).parameters.values())
    except (TypeError, ValueError):
        return [f"i{d}" for d in range(n)]
    P = inspect.Parameter
    positional = [p for p in params if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is P.empty]
    star = any(p.kind == P.VAR_POSITIONAL for p in params)
    kw_required = [p.name for p in params if p.kind == P.KEYWORD_ONLY and p.default is P.empty]
    if kw_required:
        raise ExpressionError(
            f"compute '{name}': the lambda's keyword-only parameter '{kw_required[0]}' has no "
            "default; loop variables are passed by position"
        )
    if len(required) <= n and (n <= len(positional) or star):
        return [p.name for p in positional[:n]] + [f"i{d}" for d in range(len(positional), n)]
    takes = str(len(required))
    if len(positional) > len(required):
        takes = f"{len(required)} to {len(positional)}"
    raise ExpressionError(
        f"compute '{name}': shape has {n} dimensions but the lambda takes {takes} loop variables"
    )


def is_affine(e: Expr, allowed: set[int]) -> bool:
    """True when ``e`` is an affine function of the IterVars in ``allowed`` (by uid)."""
    return _Affine(allowed).visit(e)


def _is_int_const(e: Expr) -> bool:
    return isinstance(e, Const) and isinstance(e.value, int) and not isinstance(e.value, bool)


class _Affine(ExprVisitor[bool]):
    """Is an expression affine in the allowed IterVars (the subset isl can model)?"""

    def __init__(self, allowed: set[int]) -> None:
        self.allowed = allowed

    def visit_IterVar(self, e: IterVar) -> bool:
        return e.uid in self.allowed

    def visit_Const(self, e: Const) -> bool:
        return _is_int_const(e)

    def visit_Unary(self, e: Unary) -> bool:
        return e.op == "neg" and self.visit(e.a)

    def visit_Binary(self, e: Binary) -> bool:
        if e.op in ("add", "sub"):
            return self.visit(e.a) and self.visit(e.b)
        if e.op == "mul":
            return (self.visit(e.a) and _is_int_const(e.b)) or (
                _is_int_const(e.a) and self.visit(e.b)
            )
        if e.op in ("floordiv", "mod"):
            return self.visit(e.a) and _is_int_const(e.b) and e.b.value > 0  # type: ignore[attr-defined]
        return False

    def visit_default(self, e: Expr, *args: object) -> bool:
        return False


class _BodyCheck(ExprVisitor[None]):
    """Checks one node of a compute body (loop variables, subscripts, constants)."""

    def __init__(self, name: str, allowed: set[int]) -> None:
        self.name = name
        self.allowed = allowed

    def visit_Reduce(self, e: Reduce) -> None:
        raise ExpressionError(f"compute '{self.name}': reduction nested inside a reduction")

    def visit_IterVar(self, e: IterVar) -> None:
        if e.uid in self.allowed:
            return
        if e.kind == "reduce":
            raise ExpressionError(
                f"compute '{self.name}': reduce axis '{e.name}' is used outside a te.sum/max/min "
                "over it"
            )
        raise ExpressionError(
            f"compute '{self.name}': loop variable '{e.name}' belongs to another compute"
        )

    def visit_Read(self, e: Read) -> None:
        for d, sub in enumerate(e.indices):
            if not isinstance(sub, DataIndex) and not is_affine(sub, self.allowed):
                raise ExpressionError(
                    f"compute '{self.name}': subscript {d} of tensor '{e.tensor.name}' ({sub!r}) "
                    "is not affine in the loop variables; use +, -, * or // and % by constants"
                )

    def visit_Const(self, e: Const) -> None:
        if e.dtype == "int64" and not INT64_RANGE[0] <= e.value <= INT64_RANGE[1]:
            raise ExpressionError(
                f"compute '{self.name}': integer constant {e.value} does not fit int64; "
                "write it as a float (or combine it with a float operand)"
            )

    def visit_Unary(self, e: Unary) -> None:
        if e.op == "bitnot" and dt.is_float(e.a.dtype):
            raise ExpressionError(
                f"compute '{self.name}': te.bitwise_not takes an integer or bool operand, got "
                f"{e.a.dtype}"
            )

    def _narrow_literal(self, e: Binary | Compare | Select) -> None:
        """A Python int beside a uint8/int8/int16 value takes its dtype: it must fit it."""
        for c, other in ((e.a, e.b), (e.b, e.a)):
            if not (isinstance(c, Const) and c.weak and dt.is_int(c.dtype)):
                continue
            if other.dtype in dt.NARROW_INTS:
                lim = np.iinfo(dt.numpy_dtype(other.dtype))
                if not lim.min <= c.value <= lim.max:
                    raise ExpressionError(
                        f"compute '{self.name}': {c.value} does not fit {other.dtype} (beside "
                        f"{other!r}); cast that operand to a wider dtype first"
                    )

    def visit_Compare(self, e: Compare) -> None:
        self._narrow_literal(e)

    def visit_Select(self, e: Select) -> None:
        self._narrow_literal(e)

    def visit_Binary(self, e: Binary) -> None:
        self._narrow_literal(e)
        if e.op in BITWISE and dt.is_float(e.dtype):
            raise ExpressionError(
                f"compute '{self.name}': te.{BITWISE[e.op]} takes integer or bool operands, "
                f"got {e.a.dtype} and {e.b.dtype}"
            )
        if e.op in ("tdiv", "tmod") and not dt.is_int(e.dtype):
            fn = "truncdiv" if e.op == "tdiv" else "truncmod"
            raise ExpressionError(
                f"compute '{self.name}': te.{fn} takes integer operands, got {e.a.dtype} and "
                f"{e.b.dtype}; cast them with te.cast(x, 'int32') or divide floats with /"
            )
        if e.op not in ("floordiv", "mod") or dt.is_float(e.dtype):
            return
        sym = "//" if e.op == "floordiv" else "%"
        if not _is_int_const(e.b) or e.b.value == 0:  # type: ignore[attr-defined]
            raise ExpressionError(
                f"compute '{self.name}': integer {e!r} needs a nonzero constant divisor; "
                f"for a run-time divisor use te.{'truncdiv' if sym == '//' else 'truncmod'} "
                "(rounds toward zero, 0 by zero) or cast to float32"
            )

    def visit_default(self, e: Expr, *args: object) -> None:
        return None


def _check_body(name: str, axes: tuple[IterVar, ...], body: Expr) -> None:
    red = body if isinstance(body, Reduce) else None
    data_ids = {a.uid for a in axes}
    red_ids = {a.uid for a in red.axes} if red is not None else set()
    check = _BodyCheck(name, data_ids | red_ids)
    nodes = list(walk(red.body if red is not None else body))
    nodes.sort(key=lambda n: not isinstance(n, IterVar))  # name stray variables first
    for n in nodes:
        check.visit(n)


class _LiftReductions(ExprMutator):
    """Gives every reduction that is not the outermost node a compute tensor of its own."""

    def __init__(self, name: str, shape: tuple[int, ...], axes: tuple[IterVar, ...], tag: str):
        self.name, self.shape, self.axes, self.tag = name, shape, axes, tag
        self.counter = itertools.count()

    def visit_Reduce(self, node: Reduce) -> Expr:
        body = self.visit(node.body)
        used = {n.uid for n in walk(node) if isinstance(n, IterVar)}
        keep = [a for a in self.axes if a.uid in used]
        fresh = [IterVar(a.name, a.lo, a.hi, "data") for a in keep]
        inner = substitute(
            Reduce(node.op, body, node.axes, node.accumulate),
            {a.uid: f for a, f in zip(keep, fresh, strict=True)},
        )
        hidden = Tensor(
            tuple(self.shape[self.axes.index(a)] for a in keep),
            inner.dtype,
            f"{self.name}_{node.op}{next(self.counter)}",
        )
        _check_body(hidden.name, tuple(fresh), inner)
        hidden.op = ComputeOp(tuple(fresh), inner, self.tag)
        check_bounds(hidden)
        return Read(hidden, tuple(keep)) if keep else Read(hidden, ())


def _split_nested_reductions(
    name: str, shape: tuple[int, ...], axes: tuple[IterVar, ...], body: Expr, tag: str
) -> Expr:
    """Give every reduction that is not the outermost node a compute tensor of its own."""
    if isinstance(body, Reduce):
        return body
    return _LiftReductions(name, shape, axes, tag).visit(body)


def compute(
    shape: Sequence[int] | int,
    fcompute: Callable[..., Any],
    name: str | None = None,
    tag: str = "",
    dtype: str | None = None,
) -> Tensor:
    """A tensor whose element at each point of ``shape`` is ``fcompute(*loop_vars)``.

    Its dtype is the body's (``lambda i: x[i] > 0`` is a bool tensor, ``lambda i: i`` int32)
    unless ``dtype`` is given: the body is then converted as by ``te.cast`` (a reduction
    converts each value before reducing it, as torch's ``sum(x, dtype=...)``).
    ``tag`` names the composite op the primitive belongs to (``ops`` sets it).
    """
    name = name or f"compute{next(_names)}"
    want = check_dtype(dtype, f"compute '{name}'") if dtype is not None else None
    dims = _shape(shape, f"compute '{name}'")
    names = _axis_names(fcompute, len(dims), name)
    axes = tuple(IterVar(n, 0, d, "data") for n, d in zip(names, dims, strict=True))
    body = as_expr(fcompute(*axes))
    body = _split_nested_reductions(name, dims, axes, body, tag)
    _check_body(name, axes, body)
    if want is not None and body.dtype != want:
        if isinstance(body, Reduce):
            cast_body = Cast(body.body, want)
            acc = _accumulator(body.op, cast_body, body.accumulate)
            body = Reduce(body.op, cast_body, body.axes, acc)
        else:
            body = Cast(body, want)
    out = Tensor(dims, body.dtype, name)
    out.op = ComputeOp(axes, body, tag)
    check_bounds(out)
    return out
