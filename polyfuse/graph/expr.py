"""Tensor-expression IR: the language primitive ops are written in.

A :class:`Tensor` is either a placeholder (a graph input) or the result of a compute: a body
expression evaluated at every point of its iteration domain. Bodies are trees of :class:`Expr`
nodes; reads of other tensors are :class:`Read` nodes whose subscripts must be affine in the
iteration variables (this is what lets isl model them). A reduction (:class:`Reduce`) is only
ever the outermost node of a body: ``polyfuse.te.compute`` splits nested reductions into
compute tensors of their own, so every primitive is one loop nest.

Every node has a dtype, given by the typing rules of :mod:`polyfuse.graph.dtypes` (promotion,
weak Python numbers, true division, reductions and their accumulators).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polyfuse.base.errors import DtypeError, ExpressionError
from polyfuse.base.visitor import R, Visitor
from polyfuse.graph import dtypes as dt
from polyfuse.graph.dtypes import check_dtype

#: Every dtype a tensor or expression may have (code generation: see cuda/codegen/lower_dtypes.py).
KNOWN_DTYPES = tuple(dt.DTYPES)

__all__ = ["KNOWN_DTYPES", "check_dtype"]  # re-exported for polyfuse.te

_ids = itertools.count()


def _operator(node: str, op: str, reflected: bool = False) -> Callable[[Expr, Any], Expr]:
    """The method behind a Python operator: ``node(op, self, other)``, operands swapped for the
    reflected form (``2 * x``). The node class is looked up when called (defined below)."""

    def method(self: Expr, o: Any) -> Expr:
        a, b = (as_expr(o), self) if reflected else (self, as_expr(o))
        return globals()[node](op, a, b)

    return method


class Expr:
    """Base of expression nodes; Python operators build bigger expressions."""

    dtype: str = "float32"

    __add__ = _operator("Binary", "add")
    __radd__ = _operator("Binary", "add", reflected=True)
    __sub__ = _operator("Binary", "sub")
    __rsub__ = _operator("Binary", "sub", reflected=True)
    __mul__ = _operator("Binary", "mul")
    __rmul__ = _operator("Binary", "mul", reflected=True)
    __truediv__ = _operator("Binary", "div")
    __rtruediv__ = _operator("Binary", "div", reflected=True)
    __floordiv__ = _operator("Binary", "floordiv")
    __mod__ = _operator("Binary", "mod")
    __pow__ = _operator("Binary", "pow")
    __lt__ = _operator("Compare", "lt")
    __le__ = _operator("Compare", "le")
    __gt__ = _operator("Compare", "gt")
    __ge__ = _operator("Compare", "ge")
    __and__ = _operator("Logical", "and")
    __or__ = _operator("Logical", "or")

    def __neg__(self) -> Expr:
        if self.dtype == "bool":  # numpy and torch refuse it; C would give the int -1
            raise DtypeError(f"-x of a bool expression {self!r}: use te.where or a cast")
        return Unary("neg", self)

    def __bool__(self) -> bool:
        raise ExpressionError(
            "a tensor expression has no truth value; use te.where(cond, a, b) instead of if/and/or"
        )

    __hash__ = object.__hash__

    def children(self) -> tuple[Expr, ...]:
        return ()


@dataclass(eq=False, repr=False)
class IterVar(Expr):
    """A loop variable: a data axis of a compute, or a reduction axis (``te.reduce_axis``)."""

    name: str
    lo: int
    hi: int  # exclusive
    kind: str = "data"  # "data" | "reduce"
    uid: int = field(default_factory=lambda: next(_ids))

    dtype = "int32"

    @property
    def extent(self) -> int:
        return self.hi - self.lo

    def __repr__(self) -> str:
        return self.name


INT32_RANGE = (-(2**31), 2**31 - 1)
INT64_RANGE = (-(2**63), 2**63 - 1)


def float32_value(v: float | int) -> float:
    """``v`` rounded to float32 (the value a float32 constant holds): overflow gives ±inf,
    underflow 0 or a denormal, NaN stays NaN."""
    try:
        d = float(v)
    except OverflowError:  # an int beyond the double range
        d = math.inf if v > 0 else -math.inf
    with np.errstate(over="ignore", under="ignore"):
        return float(np.float32(d))


def float64_value(v: float | int | bool) -> float:
    """``v`` as a double (an int beyond the double range is ±inf)."""
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


def int_dtype(v: int) -> str:
    """The integer dtype of a Python int: int32 when it fits, else int64 (a value beyond int64
    also says int64; ``te.compute`` rejects it unless a float operand made it a float)."""
    return "int32" if INT32_RANGE[0] <= v <= INT32_RANGE[1] else "int64"


@dataclass(eq=False, repr=False)
class Const(Expr):
    """A constant in its dtype: a float32 constant means its float32 value (``1e39`` is inf,
    ``1e-50`` is 0), an integer constant an int32 or int64.

    ``weak``: a Python number (``x * 2.5``), which takes the dtype of the value beside it
    (:func:`polyfuse.graph.dtypes.promote_weak`); ``te.const(v, dtype)`` is not weak."""

    value: float | int | bool
    dtype: str = "float32"
    weak: bool = True

    def __repr__(self) -> str:
        return repr(self.value)


@dataclass(eq=False, repr=False)
class Read(Expr):
    """``tensor[indices]``: a read access with affine subscripts."""

    tensor: Tensor
    indices: tuple[Expr, ...]

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.tensor.dtype

    def children(self) -> tuple[Expr, ...]:
        return self.indices

    def __repr__(self) -> str:
        return f"{self.tensor.name}[{', '.join(map(repr, self.indices))}]"


_BIN_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%"}


@dataclass(eq=False, repr=False)
class Unary(Expr):
    op: str
    a: Expr

    @property
    def dtype(self) -> str:  # type: ignore[override]
        """``not`` gives bool, ``-x``, ``abs`` and ``bitnot`` keep the dtype, math keeps a
        float dtype and gives float32 for an integer or bool operand."""
        if self.op == "not":
            return "bool"
        if self.op in ("neg", "abs", "bitnot") or dt.is_float(self.a.dtype):
            return self.a.dtype
        return dt.DEFAULT_FLOAT

    def children(self) -> tuple[Expr, ...]:
        return (self.a,)

    def __repr__(self) -> str:
        return f"-({self.a!r})" if self.op == "neg" else f"{self.op}({self.a!r})"


def _is_weak(e: Expr) -> bool:
    return isinstance(e, Const) and e.weak


def _join_dtype(a: Expr, b: Expr) -> str:
    """The promoted dtype of two operands (:mod:`polyfuse.graph.dtypes`), a Python number
    taking the other operand's dtype where its category allows."""
    if _is_weak(a) != _is_weak(b):
        strong, weak = (b, a) if _is_weak(a) else (a, b)
        return dt.promote_weak(strong.dtype, weak.dtype)
    return dt.promote(a.dtype, b.dtype)


def _weak(c: Expr, other: Expr) -> Expr:
    """A Python number beside a float operand, retyped where its own dtype would lose what the
    other computes in: an int that does not fit int32 takes the float's dtype (``x * 10**20``
    is ``x * 1e20f``, as numpy computes ``float32 array * 10**20``; beside integers it stays
    int64), and a number beside float64 is a float64 constant (``x_f64 * 0.1`` multiplies by
    the double 0.1). Beside float16/bfloat16 a float stays float32, the precision the product
    is computed in (as torch's ``opmath``)."""
    if not _is_weak(c) or not dt.is_float(other.dtype):
        return c
    if other.dtype == "float64" and not _is_weak(other) and c.dtype != "float64":
        return Const(float64_value(c.value), "float64")
    if c.dtype == "int64":
        return Const(float32_value(c.value), "float32")
    return c


@dataclass(eq=False, repr=False)
class Binary(Expr):
    """``a op b``. ``div`` is true division (float32 for integer operands, as torch);
    ``floordiv`` and ``mod`` are Python's floor division and modulo."""

    op: str
    a: Expr
    b: Expr

    def __post_init__(self) -> None:
        self.a, self.b = _weak(self.a, self.b), _weak(self.b, self.a)

    @property
    def dtype(self) -> str:  # type: ignore[override]
        joined = _join_dtype(self.a, self.b)
        if self.op in ("div", "atan2"):  # float32 for integers (as true_divide_dtype)
            return joined if dt.is_float(joined) else dt.DEFAULT_FLOAT
        return joined

    def children(self) -> tuple[Expr, ...]:
        return (self.a, self.b)

    def __repr__(self) -> str:
        if self.op in _BIN_SYMBOL:
            return f"({self.a!r} {_BIN_SYMBOL[self.op]} {self.b!r})"
        return f"{self.op}({self.a!r}, {self.b!r})"


@dataclass(eq=False, repr=False)
class Compare(Expr):
    op: str  # lt le gt ge eq ne
    a: Expr
    b: Expr
    dtype = "bool"

    def __post_init__(self) -> None:
        self.a, self.b = _weak(self.a, self.b), _weak(self.b, self.a)

    def children(self) -> tuple[Expr, ...]:
        return (self.a, self.b)

    def __repr__(self) -> str:
        sym = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}[self.op]
        return f"({self.a!r} {sym} {self.b!r})"


@dataclass(eq=False, repr=False)
class Logical(Expr):
    op: str  # and or
    a: Expr
    b: Expr
    dtype = "bool"

    def children(self) -> tuple[Expr, ...]:
        return (self.a, self.b)

    def __repr__(self) -> str:
        return f"({self.a!r} {'&' if self.op == 'and' else '|'} {self.b!r})"


@dataclass(eq=False, repr=False)
class Select(Expr):
    """``where(cond, a, b)``; only the chosen branch is evaluated (guards padded reads)."""

    cond: Expr
    a: Expr
    b: Expr

    def __post_init__(self) -> None:
        self.a, self.b = _weak(self.a, self.b), _weak(self.b, self.a)

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return _join_dtype(self.a, self.b)

    def children(self) -> tuple[Expr, ...]:
        return (self.cond, self.a, self.b)

    def __repr__(self) -> str:
        return f"where({self.cond!r}, {self.a!r}, {self.b!r})"


@dataclass(eq=False, repr=False)
class Cast(Expr):
    a: Expr
    dtype: str = "float32"

    def children(self) -> tuple[Expr, ...]:
        return (self.a,)

    def __repr__(self) -> str:
        return f"{self.dtype}({self.a!r})"


#: the byte dtypes an integer GEMM widens to int32 (``m16n8k32`` tensor cores)
BYTE_DTYPES = ("int8", "uint8")


def widened_byte_read(e: Expr) -> Read | None:
    """The byte read of ``int32(x[...])`` with ``x`` int8 or uint8 (a factor of an integer
    GEMM: its products summed exactly in int32), else None."""
    if isinstance(e, Cast) and e.dtype == "int32" and isinstance(e.a, Read):
        return e.a if e.a.tensor.dtype in BYTE_DTYPES else None
    return None


def zero_padded_read(e: Expr) -> Read | None:
    """The read of a GEMM factor: ``x[..]``, a widened byte read (:func:`widened_byte_read`),
    or either under a padding select ``where(c, ., 0)`` (a convolution's zero padding); else
    None."""
    if isinstance(e, Select):
        if not (isinstance(e.b, Const) and float(e.b.value) == 0.0):
            return None
        e = e.a
    return e if isinstance(e, Read) else widened_byte_read(e)


@dataclass(eq=False, repr=False)
class DataIndex(Expr):
    """A subscript read from data at run time (a gather): ``x[te.data_index(idx[i]), j]``.

    isl cannot see which element it selects, so the access is modelled as touching the whole
    extent of that dimension (an opaque, general access).
    """

    a: Expr
    dtype = "int32"

    def children(self) -> tuple[Expr, ...]:
        return (self.a,)

    def __repr__(self) -> str:
        return f"data_index({self.a!r})"


@dataclass(eq=False, repr=False)
class Reduce(Expr):
    """A reduction of ``body`` over ``axes``; only valid as the outermost node of a body.

    ``accumulate``: the dtype partial results are kept in, None for the default
    (:func:`polyfuse.graph.dtypes.accumulate_dtype`: float32 for half-precision bodies); the
    result is rounded to :attr:`dtype` once at the end."""

    op: str
    body: Expr
    axes: tuple[IterVar, ...]
    accumulate: str | None = None

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return dt.reduce_dtype(self.op, self.body.dtype)

    @property
    def accumulate_dtype(self) -> str:
        """The accumulator's dtype: ``accumulate`` or the default for the body's dtype."""
        return self.accumulate or dt.accumulate_dtype(self.op, self.body.dtype)

    def children(self) -> tuple[Expr, ...]:
        return (self.body,)

    def __repr__(self) -> str:
        return f"{self.op}({self.body!r}, axis=[{', '.join(a.name for a in self.axes)}])"


def as_expr(v: Any) -> Expr:
    """Turn a Python number (or an Expr) into an Expr."""
    if isinstance(v, Expr):
        return v
    if isinstance(v, bool | np.bool_):
        return Const(bool(v), "bool")
    if isinstance(v, int):
        return Const(v, int_dtype(v))
    if isinstance(v, float):
        return Const(v, "float32")
    if hasattr(v, "dtype") and hasattr(v, "item"):  # numpy scalar
        return as_expr(v.item())
    raise ExpressionError(f"cannot use {type(v).__name__} value {v!r} in a tensor expression")


# ---- visitors --------------------------------------------------------------------------
#: Every expression node class, in the order visitors document them.
NODE_CLASSES: tuple[type[Expr], ...] = (
    IterVar,
    Const,
    Read,
    Unary,
    Binary,
    Compare,
    Logical,
    Select,
    Cast,
    DataIndex,
    Reduce,
)


class ExprVisitor(Visitor[R]):
    """Base of every walker of expressions: ``visit(e, *args)`` calls ``visit_<Node>(e, *args)``
    (:class:`polyfuse.base.visitor.Visitor` over :data:`NODE_CLASSES`). Walkers (printers,
    evaluators, checks) override only the nodes they handle."""

    node_classes = NODE_CLASSES


#: Node class → constructor from (old node, new children).
_REBUILD: dict[type, Callable[[Any, tuple[Expr, ...]], Expr]] = {
    Read: lambda e, k: Read(e.tensor, k),
    Unary: lambda e, k: Unary(e.op, k[0]),
    Binary: lambda e, k: Binary(e.op, *k),
    Compare: lambda e, k: Compare(e.op, *k),
    Logical: lambda e, k: Logical(e.op, *k),
    Select: lambda e, k: Select(*k),
    Cast: lambda e, k: Cast(k[0], e.dtype),
    DataIndex: lambda e, k: DataIndex(k[0]),
    Reduce: lambda e, k: Reduce(e.op, k[0], e.axes, e.accumulate),
}


class ExprMutator(ExprVisitor[Expr]):
    """A visitor that rebuilds: by default each node is rebuilt from its visited children,
    and a node whose children are all unchanged is returned as is (subtrees stay shared).
    Subclasses override ``visit_<Node>`` for the nodes they replace."""

    def visit_default(self, e: Expr, *args: Any) -> Expr:
        return self.rebuild(e, tuple(self.visit(c, *args) for c in e.children()))

    @staticmethod
    def rebuild(e: Expr, kids: tuple[Expr, ...]) -> Expr:
        """``e`` with children ``kids`` (``e`` itself when they are the same objects)."""
        if not kids or all(a is b for a, b in zip(kids, e.children(), strict=True)):
            return e
        return _REBUILD[type(e)](e, kids)


class _Rewrite(ExprMutator):
    """Bottom-up rebuild where ``fn(node, new_children)`` may replace a node."""

    def __init__(self, fn: Callable[[Expr, tuple[Expr, ...]], Expr | None]) -> None:
        self.fn = fn

    def visit(self, e: Expr, *args: Any) -> Expr:
        kids = tuple(self.visit(c) for c in e.children())
        new = self.fn(e, kids)
        return new if new is not None else self.rebuild(e, kids)


class _Substitute(ExprMutator):
    def __init__(self, env: dict[int, Expr]) -> None:
        self.env = env

    def visit_IterVar(self, e: IterVar) -> Expr:
        return self.env.get(e.uid, e)


def walk(e: Expr):
    """Pre-order walk over an expression tree."""
    yield e
    for c in e.children():
        yield from walk(c)


def rewrite(e: Expr, fn: Callable[[Expr, tuple[Expr, ...]], Expr | None]) -> Expr:
    """Rebuild ``e`` bottom-up; ``fn(node, new_children)`` may return a replacement or None."""
    return _Rewrite(fn).visit(e)


def substitute(e: Expr, env: dict[int, Expr]) -> Expr:
    """Replace IterVars (by uid) in ``e``."""
    return _Substitute(env).visit(e)


@dataclass(eq=False)
class ComputeOp:
    """The loop nest that defines a compute tensor."""

    axes: tuple[IterVar, ...]
    body: Expr
    tag: str = ""  # the composite op this primitive came from (softmax, layer_norm, ...)

    @property
    def reduce(self) -> Reduce | None:
        return self.body if isinstance(self.body, Reduce) else None

    @property
    def reduce_axes(self) -> tuple[IterVar, ...]:
        r = self.reduce
        return r.axes if r is not None else ()

    def inputs(self) -> list[Tensor]:
        seen: dict[int, Tensor] = {}
        for n in walk(self.body):
            if isinstance(n, Read):
                seen.setdefault(id(n.tensor), n.tensor)
        return list(seen.values())

    def reads(self) -> list[Read]:
        return [n for n in walk(self.body) if isinstance(n, Read)]


@dataclass(eq=False)
class Tensor:
    """A tensor: a graph input (``op is None``) or the output of one compute."""

    shape: tuple[int, ...]
    dtype: str
    name: str
    op: ComputeOp | None = None
    uid: int = field(default_factory=lambda: next(_ids))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def is_placeholder(self) -> bool:
        return self.op is None

    def __getitem__(self, idx: Any) -> Read:
        if not isinstance(idx, tuple):
            idx = (idx,)
        if len(idx) != self.ndim:
            raise ExpressionError(
                f"tensor '{self.name}' has {self.ndim} dimensions {self.shape} "
                f"but was indexed with {len(idx)} subscripts"
            )
        subs = []
        for i in idx:
            if isinstance(i, slice):
                raise ExpressionError(
                    f"tensor '{self.name}': slices are not subscripts; use ops.slice or index "
                    "with loop variables"
                )
            subs.append(as_expr(i))
        return Read(self, tuple(subs))

    def __repr__(self) -> str:
        kind = "placeholder" if self.op is None else "compute"
        return f"Tensor({self.name}, {self.shape}, {self.dtype}, {kind})"

    __hash__ = object.__hash__
