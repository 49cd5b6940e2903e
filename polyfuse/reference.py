"""``polyfuse.reference``: a numpy interpreter of tensor-expression graphs.

:func:`evaluate` is the oracle that tells what a graph *means*, independently of the compiler:
tests and users compare compiled results against it.

How a compute is evaluated
    Each loop variable becomes a broadcast ``np.arange`` grid (data axes first, then the
    reduction axes of the body as extra trailing dims); reads are numpy fancy indexing with the
    evaluated subscripts; a reduction reduces the trailing dims. ``te.where`` evaluates each
    branch under the mask of the points that select it (and ``c & e`` evaluates ``e`` under the
    mask where ``c`` holds, ``c | e`` where it does not): a read whose subscript is out of range
    only where the branch is not selected (a padded read) is clipped and its value discarded,
    while an out-of-range read at a point that does use it raises
    :class:`~polyfuse.errors.ExpressionError` (the graph is wrong).

Precision (``precision="storage"``, the default)
    Every dtype of :mod:`polyfuse.graph.dtypes` is computed faithfully to its storage. Arithmetic
    inside one compute body is done in float64 (float values) or int64 (integer values), at least as
    precise as any kernel, except that int32, int16, int8 and uint8 arithmetic wraps at every
    operation (two's complement, as numpy's integers and the kernels: ``a * b // 3`` of int32 ``a``,
    ``b`` divides the wrapped product); every tensor (inputs and each compute's result) is rounded
    to its dtype before the next compute reads it, so a float16 compute loses what float16 storage
    loses (``ml_dtypes`` gives bfloat16), an int32 one wraps. An explicit ``te.cast`` rounds the
    same way. A reduction accumulates in its accumulator's dtype (``Reduce.accumulate_dtype``): a
    float32 or float64 accumulator is computed in float64, a half-precision one
    (``accumulate="float16"``) adds the values one by one in the reduction order, rounding the
    running sum to float16 after each step, as a serial loop would. A float constant is its value in
    its dtype (a float32 ``1e39`` is inf, ``1e-50`` is 0), as in the kernel. Results are numpy
    arrays of each output's dtype (float32 arrays for float32 tensors). Integer expressions (loop
    variables, subscripts, ``te.cast(..., "int32")``) follow Python: ``/`` is true division (a float
    even for ints),
    ``//`` and ``%`` are floor division and its remainder (isl's ``floor`` and ``mod`` for a
    positive divisor); a cast to int truncates. ``te.maximum``/``te.minimum`` propagate NaN
    like numpy.

Precision ``"operation"``: the kernels' own arithmetic
    As ``"storage"``, and every float operation (unary, binary) of a float16, bfloat16 or
    float32 node is rounded to float32, the precision kernels compute those dtypes in (numpy's
    ``float32_array * c``). Where one rounding matters — a float32 product that underflows to
    a subnormal and is then divided by a tiny constant in a float64 compute (fuzz seed 740066)
    — a kernel legitimately lands here rather than on the storage reference; comparisons use
    it as a second reference (:func:`polyfuse.testing.run.compare`).

Precision ``"float64"``: the oracle
    Inputs are still the values of their dtype (a float16 input holds float16 values), but
    every float tensor, cast and accumulator after them is kept in float64: the exact answer
    the graph approximates, which results of any precision are compared with under
    :func:`polyfuse.graph.dtypes.tolerance`. Float results come back as float64 arrays;
    integer and bool results are the same as in storage mode.

Memory
    A compute whose iteration space (data axes times reduction axes) exceeds
    :data:`CHUNK_ELEMENTS` points is evaluated in blocks over its outer axes; blocks that split a
    reduction axis are combined with the reduction's own operator. Intermediate tensors are
    freed once their last consumer has run.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from polyfuse.errors import CallError, ExpressionError
from polyfuse.graph import dtypes as dt
from polyfuse.graph import expr as ex
from polyfuse.graph.dtypes import tolerance

__all__ = ["CHUNK_ELEMENTS", "PRECISIONS", "evaluate", "tolerance"]

#: ``evaluate(precision=...)``: round to each dtype, the float64 oracle, or also each operation.
PRECISIONS = ("storage", "float64", "operation")
#: node dtypes whose operations ``precision="operation"`` rounds to float32
_FLOAT32_ARITHMETIC = frozenset({"float16", "bfloat16", "float32"})

#: Largest number of iteration points (data x reduction) evaluated in one vectorised block.
CHUNK_ELEMENTS = 1 << 22

_erf = np.frompyfunc(math.erf, 1, 1)


def evaluate(
    outputs: Sequence[ex.Tensor] | ex.Tensor,
    feeds: Mapping[ex.Tensor | str, Any],
    *,
    precision: str = "storage",
) -> list[np.ndarray]:
    """Evaluate ``outputs`` of a te graph with numpy.

    ``feeds`` maps every placeholder the outputs depend on (as the :class:`Tensor` or by its
    name) to an array of exactly its shape; values are converted to the placeholder's dtype
    (an integer or bool input takes integer or bool arrays only). Extra feeds are ignored.
    Returns one array per output, in order (a single Tensor gives a list of one), of the
    output's dtype, or float64 for float outputs with ``precision="float64"`` (see the module
    docstring). Raises :class:`~polyfuse.errors.CallError` for a missing, mis-shaped or
    non-numeric feed, naming the tensor.
    """
    if precision not in PRECISIONS:
        raise CallError(f"evaluate: precision '{precision}'; use one of {', '.join(PRECISIONS)}")
    outs = [outputs] if isinstance(outputs, ex.Tensor) else list(outputs)
    for t in outs:
        if not isinstance(t, ex.Tensor):
            raise CallError(f"evaluate: output {t!r} is not a Tensor")
    order = _topo_order(outs)
    values: dict[int, np.ndarray] = {}
    placeholders = [t for t in order if t.op is None]
    _bind_feeds(placeholders, feeds, values)

    keep = {t.uid for t in outs}
    uses: dict[int, int] = {}
    for t in order:
        if t.op is not None:
            for s in t.op.inputs():
                uses[s.uid] = uses.get(s.uid, 0) + 1
    with np.errstate(all="ignore"):
        for t in order:
            if t.op is None:
                continue
            values[t.uid] = _eval_compute(t, values, precision)
            for s in t.op.inputs():
                uses[s.uid] -= 1
                if uses[s.uid] == 0 and s.uid not in keep:
                    del values[s.uid]
    return [_result(values[t.uid], t.dtype, precision) for t in outs]


# --------------------------------------------------------------------------- dtypes


def _store(x: Any, dtype: str, precision: str) -> np.ndarray:
    """``x`` as a value of ``dtype`` in the evaluator's working form: float values rounded to
    ``dtype`` (to float64 only, in the oracle) and held as float64, integers wrapped to
    ``dtype`` and held as int64 (truncated toward zero from a float), bools as bool."""
    a = np.asarray(x)
    info = dt.DTYPES[dtype]
    if info.kind == "b":
        return a != 0 if a.dtype.kind != "b" else a
    if info.kind == "i":
        if a.dtype.kind not in "biu":  # as CUDA's cvt.rzi: toward zero, saturated, NaN is 0
            lim = np.iinfo(info.numpy)
            a = np.clip(np.nan_to_num(np.trunc(a.astype(np.float64)), nan=0.0), lim.min, lim.max)
            with np.errstate(invalid="ignore"):
                return np.where(a >= 2.0**63, np.int64(lim.max), a.astype(np.int64))
        return a.astype(info.numpy).astype(np.int64)
    if precision == "float64":
        return a.astype(np.float64)
    return a.astype(info.numpy).astype(np.float64)


def _result(a: np.ndarray, dtype: str, precision: str) -> np.ndarray:
    """A stored value as the array :func:`evaluate` returns."""
    if precision == "float64" and dt.is_float(dtype):
        return a.astype(np.float64)
    return a.astype(dt.numpy_dtype(dtype))


def _feedable(a: np.ndarray, dtype: str) -> bool:
    """Whether an array of ``a``'s dtype may feed an input of ``dtype``: numbers for a float
    input (bfloat16 arrays included), integers or bools for an integer or bool one."""
    kinds = "biuf" if dt.is_float(dtype) else "biu"
    return a.dtype.kind in kinds or a.dtype == dt.numpy_dtype("bfloat16") and kinds == "biuf"


# --------------------------------------------------------------------------- graph


def _topo_order(outs: Sequence[ex.Tensor]) -> list[ex.Tensor]:
    """Producers before consumers, each tensor once."""
    order: list[ex.Tensor] = []
    done: set[int] = set()
    for root in outs:
        stack: list[tuple[ex.Tensor, bool]] = [(root, False)]
        while stack:
            t, expanded = stack.pop()
            if t.uid in done:
                continue
            if expanded or t.op is None:
                done.add(t.uid)
                order.append(t)
                continue
            stack.append((t, True))
            stack.extend((s, False) for s in reversed(t.op.inputs()) if s.uid not in done)
    return order


def _bind_feeds(
    placeholders: Sequence[ex.Tensor], feeds: Mapping[ex.Tensor | str, Any], values: dict[int, Any]
) -> None:
    by_uid: dict[int, Any] = {}
    by_name: dict[str, Any] = {}
    for k, v in feeds.items():
        if isinstance(k, ex.Tensor):
            if k.op is not None:
                raise CallError(
                    f"evaluate: '{k.name}' is a compute tensor, not an input; feed placeholders"
                )
            by_uid[k.uid] = v
        elif isinstance(k, str):
            by_name[k] = v
        else:
            raise CallError(f"evaluate: feed key {k!r} must be a Tensor or a tensor name")
    names: dict[str, int] = {}
    for p in placeholders:
        names[p.name] = names.get(p.name, 0) + 1
    for p in placeholders:
        if p.uid in by_uid:
            v = by_uid[p.uid]
        elif p.name in by_name:
            if names[p.name] > 1:
                raise CallError(
                    f"evaluate: {names[p.name]} inputs are named '{p.name}'; "
                    "feed them by Tensor, not by name"
                )
            v = by_name[p.name]
        else:
            raise CallError(
                f"evaluate: no value fed for input '{p.name}' (shape {p.shape}, {p.dtype})"
            )
        arr = np.asarray(v)
        if not _feedable(arr, p.dtype):
            what = "numbers" if dt.is_float(p.dtype) else "integers or bools"
            raise CallError(
                f"evaluate: input '{p.name}' got a {arr.dtype} array; expected {what} ({p.dtype})"
            )
        if arr.shape != p.shape:
            raise CallError(f"evaluate: input '{p.name}' expects shape {p.shape}, got {arr.shape}")
        values[p.uid] = _store(arr, p.dtype, "storage")  # the input holds values of its dtype


# --------------------------------------------------------------------------- computes


def _blocks(ext: Sequence[int], limit: int) -> Iterator[list[tuple[int, int]]]:
    """Split the iteration box ``ext`` into blocks of at most ``limit`` points, outer axes first."""
    if math.prod(ext) <= limit:
        yield [(0, e) for e in ext]
        return
    p, rest = len(ext) - 1, 1
    while p >= 0 and rest * ext[p] <= limit:
        rest *= ext[p]
        p -= 1
    chunk = max(1, limit // rest)
    for prefix in itertools.product(*(range(e) for e in ext[:p])):
        for s in range(0, ext[p], chunk):
            yield (
                [(i, i + 1) for i in prefix]
                + [(s, min(s + chunk, ext[p]))]
                + [(0, e) for e in ext[p + 1 :]]
            )


_REDUCERS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def _work_dtype(dtype: str) -> np.dtype:
    """The numpy dtype values of ``dtype`` are held in while a body is evaluated."""
    return np.dtype({"f": np.float64, "i": np.int64, "b": np.bool_}[dt.DTYPES[dtype].kind])


def _identity(op: str, work: np.dtype) -> Any:
    """The start value of reduction ``op`` over values held in ``work``."""
    if op in ("sum", "prod"):
        return work.type(op == "prod")
    if work.kind == "b":
        return op == "min"
    big = np.inf if work.kind == "f" else np.iinfo(work).max
    return -big if op == "max" else big


def _serial(precision: str, red: ex.Reduce) -> bool:
    """Whether reduction ``red`` must add one value at a time: its accumulator is a float
    narrower than float32 (whose rounding of the running sum is the point of the dtype)."""
    acc = dt.DTYPES[red.accumulate_dtype]
    return precision != "float64" and acc.kind == "f" and acc.itemsize < 4


def _eval_compute(t: ex.Tensor, values: Mapping[int, np.ndarray], precision: str) -> np.ndarray:
    op = t.op
    assert op is not None
    red = op.reduce
    axes: list[ex.IterVar] = [*op.axes, *(red.axes if red is not None else ())]
    nd = len(op.axes)
    ext = [a.extent for a in axes]
    work = _work_dtype(op.body.dtype)
    out = np.empty(t.shape, dtype=work)
    if red is not None:
        combine = _REDUCERS[red.op]
        out[...] = _identity(red.op, work)
        serial = _serial(precision, red)
    for block in _blocks(ext, CHUNK_ELEMENTS):
        grids: dict[int, np.ndarray] = {}
        for pos, (a, (s, e)) in enumerate(zip(axes, block, strict=True)):
            shape = [1] * len(axes)
            shape[pos] = e - s
            grids[a.uid] = np.arange(a.lo + s, a.lo + e, dtype=np.int64).reshape(shape)
        bshape = tuple(e - s for s, e in block)
        where = tuple(slice(s, e) for s, e in block[:nd])
        ev = _Body(t.name, grids, values, precision)
        if red is not None:
            v = np.broadcast_to(np.asarray(ev.eval(red.body, None), work), bshape)
            if serial:
                out[where] = _fold(combine, out[where], v, nd, red.accumulate_dtype)
            else:
                part = combine.reduce(v, axis=tuple(range(nd, len(axes))))
                out[where] = combine(out[where], part)
        else:
            out[where] = np.broadcast_to(np.asarray(ev.eval(op.body, None), work), bshape)
    return _store(out, t.dtype, precision)


def _fold(combine: np.ufunc, acc: np.ndarray, v: np.ndarray, nd: int, dtype: str) -> np.ndarray:
    """``acc`` combined with the values of ``v`` one at a time, in the row-major order of its
    trailing (reduction) dims, the running result rounded to ``dtype`` after each step."""
    flat = v.reshape(v.shape[:nd] + (-1,))
    rnd = dt.numpy_dtype(dtype)
    acc = acc.astype(rnd)
    for k in range(flat.shape[-1]):
        acc = combine(acc.astype(np.float64), flat[..., k]).astype(rnd)
    return acc.astype(np.float64)


class _Body(ex.ExprVisitor[Any]):
    """Evaluates one block of one compute body; ``mask`` marks the points a value is used at."""

    def __init__(
        self,
        name: str,
        grids: Mapping[int, np.ndarray],
        values: Mapping[int, np.ndarray],
        precision: str = "storage",
    ) -> None:
        self.name = name
        self.grids = grids
        self.values = values
        self.precision = precision
        self.memo: dict[tuple[int, int], Any] = {}
        self.masks: list[Any] = []  # keeps masks alive so their ids stay unique

    def eval(self, e: ex.Expr, mask: Any) -> Any:
        key = (id(e), id(mask))
        if key not in self.memo:
            self.memo[key] = self.visit(e, mask)
        return self.memo[key]

    def _narrow(self, mask: Any, cond: Any) -> Any:
        m = cond if mask is None else np.logical_and(mask, cond)
        self.masks.append(m)
        return m

    def visit_IterVar(self, e: ex.IterVar, mask: Any) -> Any:
        if e.uid not in self.grids:
            raise ExpressionError(
                f"reference: compute '{self.name}' uses loop variable '{e.name}' "
                "that is not one of its axes"
            )
        return self.grids[e.uid]

    def visit_Const(self, e: ex.Const, mask: Any) -> Any:
        if e.dtype == "float32":
            return ex.float32_value(e.value)
        if dt.is_float(e.dtype):  # a constant is its value in its dtype, in both precisions
            with np.errstate(over="ignore"):
                return _store(ex.float64_value(e.value), e.dtype, "storage")[()]
        return e.value

    def visit_Read(self, e: ex.Read, mask: Any) -> Any:
        return self._read(e, mask)

    def visit_Unary(self, e: ex.Unary, mask: Any) -> Any:
        return self._operation(_wrap(_unary(e.op, self.eval(e.a, mask)), e.dtype), e.dtype)

    def visit_Binary(self, e: ex.Binary, mask: Any) -> Any:
        value = _binary(e.op, self.eval(e.a, mask), self.eval(e.b, mask), e.dtype)
        return self._operation(_wrap(value, e.dtype), e.dtype)

    def _operation(self, value: Any, dtype: str) -> Any:
        """``value`` rounded to float32 where ``precision="operation"`` and ``dtype`` is
        computed in float32 by the kernels; else unchanged."""
        if self.precision != "operation" or dtype not in _FLOAT32_ARITHMETIC:
            return value
        with np.errstate(over="ignore"):
            return _store(value, "float32", "storage")

    def visit_Compare(self, e: ex.Compare, mask: Any) -> Any:
        return _COMPARE[e.op](self.eval(e.a, mask), self.eval(e.b, mask))

    def visit_Logical(self, e: ex.Logical, mask: Any) -> Any:
        # like C's && and ||, the right side is used only where the left does not decide
        a = np.asarray(self.eval(e.a, mask), dtype=bool)
        if a.ndim == 0:
            decided = not a if e.op == "and" else bool(a)
            return a if decided else np.asarray(self.eval(e.b, mask), dtype=bool)
        rest = self._narrow(mask, a if e.op == "and" else ~a)
        fn = np.logical_and if e.op == "and" else np.logical_or
        return fn(a, self.eval(e.b, rest))

    def visit_Select(self, e: ex.Select, mask: Any) -> Any:
        c = np.asarray(self.eval(e.cond, mask), dtype=bool)
        if c.ndim == 0:
            return self.eval(e.a if c else e.b, mask)
        a = self.eval(e.a, self._narrow(mask, c))
        b = self.eval(e.b, self._narrow(mask, ~c))
        return np.where(c, a, b)

    def visit_Cast(self, e: ex.Cast, mask: Any) -> Any:
        return _store(self.eval(e.a, mask), e.dtype, self.precision)

    def visit_DataIndex(self, e: ex.DataIndex, mask: Any) -> Any:
        return np.asarray(self.eval(e.a, mask)).astype(np.int64)

    def visit_Reduce(self, e: ex.Reduce, mask: Any) -> Any:
        raise ExpressionError(
            f"reference: compute '{self.name}' has a reduction that is not the outermost node"
        )

    def visit_default(self, e: ex.Expr, *args: Any) -> Any:
        raise ExpressionError(f"reference: unknown expression node {type(e).__name__}")

    def _read(self, e: ex.Read, mask: Any) -> Any:
        t = e.tensor
        arr = self.values.get(t.uid)
        if arr is None:
            raise ExpressionError(f"reference: tensor '{t.name}' was read before it was computed")
        if t.ndim == 0:
            return arr[()]
        idx = []
        for d, (sub, n) in enumerate(zip(e.indices, t.shape, strict=True)):
            i = np.asarray(self.eval(sub, mask))
            if i.dtype.kind not in "iu":
                raise ExpressionError(
                    f"reference: compute '{self.name}': subscript {d} of '{t.name}' "
                    "is not an integer"
                )
            bad = (i < 0) | (i >= n)
            if bad.any():
                hit = bad if mask is None else np.logical_and(bad, mask)
                if hit.any():
                    first = int(np.broadcast_to(i, hit.shape)[hit][0])
                    raise ExpressionError(
                        f"reference: compute '{self.name}' reads '{t.name}' out of bounds: "
                        f"subscript {d} is {first}, extent {n}"
                    )
                i = np.clip(i, 0, n - 1)
            idx.append(i)
        return arr[tuple(idx)]


# --------------------------------------------------------------------------- scalar semantics


def _sigmoid(x: Any) -> Any:
    x = np.asarray(x, np.float64)
    return 1.0 / (1.0 + np.exp(-x))


#: te's trigonometric, hyperbolic and base-2/10 functions, as numpy computes them (float64).
_NUMPY_MATH = {
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos,
    "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh,
    "acosh": np.arccosh, "atanh": np.arctanh, "exp2": np.exp2, "log2": np.log2,
    "log10": np.log10,
}  # fmt: skip


def _unary(op: str, a: Any) -> Any:
    if op == "neg":
        return np.negative(a)
    if op == "abs":
        return np.abs(a)
    if op == "not":
        return np.logical_not(a)
    if op == "bitnot":  # integers held as int64: ~ of the int64 is the same bits
        return np.invert(np.asarray(a))
    x = np.asarray(a, np.float64)
    if op == "exp":
        return np.exp(x)
    if op == "log":
        return np.log(x)
    if op == "log1p":
        return np.log1p(x)
    if op == "expm1":
        return np.expm1(x)
    if op == "sqrt":
        return np.sqrt(x)
    if op == "rsqrt":
        return 1.0 / np.sqrt(x)
    if op == "tanh":
        return np.tanh(x)
    if op == "erf":
        return np.asarray(_erf(x), dtype=np.float64)
    if op == "sigmoid":
        return _sigmoid(x)
    if op == "round":  # halves to even, as rintf
        return np.rint(x)
    if op == "floor":
        return np.floor(x)
    if op == "ceil":
        return np.ceil(x)
    if op in _NUMPY_MATH:
        return _NUMPY_MATH[op](x)
    raise ExpressionError(f"reference: unknown unary op '{op}'")


def _wrap(v: Any, dtype: str) -> Any:
    """An int32, int16, int8 or uint8 operation's result wrapped to its width (two's
    complement, as numpy's and torch's integers and the kernels), held in int64 like every
    integer value here."""
    if dtype not in _WRAPPED or not _is_int(v):
        return v
    return np.asarray(v).astype(dt.numpy_dtype(dtype)).astype(np.int64)


#: integer dtypes narrower than the int64 integers are held in
_WRAPPED = ("int32", *dt.NARROW_INTS)


def _is_int(v: Any) -> bool:
    return np.asarray(v).dtype.kind in "iub"


#: Binary ops that are one numpy ufunc whatever the operand types (div and pow are not).
_BINARY_UFUNC = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "max": np.maximum,
    "min": np.minimum,
    "floordiv": np.floor_divide,
    "mod": np.mod,
    "bitand": np.bitwise_and,
    "bitor": np.bitwise_or,
    "bitxor": np.bitwise_xor,
}


def _trunc_divide(op: str, a: Any, b: Any) -> np.ndarray:
    """``te.truncdiv``/``truncmod`` of integers held as int64: the floor quotient moved one
    toward zero where the operands' signs differ and the division is inexact; 0 by a zero
    divisor; ``INT64_MIN // -1`` wraps (an int32 ``INT_MIN / -1`` wraps when stored)."""
    a, b = np.broadcast_arrays(np.asarray(a, np.int64), np.asarray(b, np.int64))
    zero = b == 0
    b1 = np.where(zero, 1, b)
    with np.errstate(over="ignore"):
        q = np.floor_divide(a, b1)
        r = a - q * b1
        q = q + ((r != 0) & ((a < 0) != (b1 < 0)))
        out = q if op == "tdiv" else a - q * b1
    return np.where(zero, 0, out)


def _shift(op: str, a: Any, b: Any, dtype: str) -> np.ndarray:
    """``te.shift_left``/``shift_right`` of integers held as int64: on the unsigned bits of
    ``dtype``'s width (a logical right shift), 0 for a shift outside ``[0, width)``; the
    result read back as ``dtype`` (two's complement)."""
    bits = 32 if dtype == "bool" else 8 * dt.DTYPES[dtype].itemsize
    mask = np.uint64((1 << bits) - 1)
    a, b = np.broadcast_arrays(np.asarray(a, np.int64), np.asarray(b, np.int64))
    u = a.astype(np.uint64) & mask
    ok = (b >= 0) & (b < bits)
    s = np.where(ok, b, 0).astype(np.uint64)
    r = ((u << s) if op == "shl" else (u >> s)) & mask
    r = np.where(ok, r, np.uint64(0))
    if dtype == "bool":
        return r.astype(np.uint32).view(np.int32).astype(np.int64)
    return r.astype(np.int64).astype(dt.numpy_dtype(dtype)).astype(np.int64)


def _binary(op: str, a: Any, b: Any, dtype: str) -> Any:
    if op in _BINARY_UFUNC:
        return _BINARY_UFUNC[op](a, b)
    if op == "div":  # true division, also of integers
        return np.true_divide(np.asarray(a, np.float64), b)
    if op == "atan2":
        return np.arctan2(np.asarray(a, np.float64), np.asarray(b, np.float64))
    if op in ("tdiv", "tmod"):
        return _trunc_divide(op, a, b)
    if op in ("shl", "shr"):
        return _shift(op, a, b, dtype)
    ints = not dt.is_float(dtype) and _is_int(a) and _is_int(b)
    if op == "pow":
        if ints:  # numpy refuses negative integer exponents: 1 / a**-b truncated, as kernels
            a, b = np.broadcast_arrays(np.asarray(a, np.int64), np.asarray(b, np.int64))
            neg = b < 0
            r = np.power(a, np.where(neg, 0, b))
            small = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 1, -1, 1), 0))
            return np.where(neg, small, r)
        return np.power(np.asarray(a, np.float64), np.asarray(b, np.float64))
    raise ExpressionError(f"reference: unknown binary op '{op}'")


_COMPARE = {
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "eq": np.equal,
    "ne": np.not_equal,
}
