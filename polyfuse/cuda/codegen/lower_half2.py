"""Lowering pass: native 16-bit pair arithmetic (``__half2``/``__nv_bfloat162``) in the
vector groups of memory-bound elementwise kernels, where it is bit-identical to float32.

16-bit tensors compute in float32 registers (:mod:`polyfuse.cuda.codegen.lower_dtypes`): a
vector group (:class:`KVector`, 4 or 8 lanes of float16/bfloat16 per 64/128-bit word) widens
every lane to float, computes, and rounds each stored lane back with ``__floats2half2_rn``.
Where a stored value is one operation on 16-bit values, the group can instead keep the loaded
words as pairs and compute with ``__hadd2_rn``/``__hsub2_rn``/``__hmul2_rn``/``__hneg2``:
no widening, no rounding conversion, one instruction per two lanes.

Legality (why the result is the same bits):

1. *Double rounding is innocuous.* For ``a op b`` with ``op`` one of + - * of two p-bit
   values, rounding the exact result to float32 (24 bits) and then to p bits equals rounding
   it once to p bits, because 24 >= 2p + 2 (p = 11 for float16, 8 for bfloat16; Figueroa,
   "When is double rounding innocuous?", 1995). float16's whole range is normal in float32;
   bfloat16's subnormal products were checked exhaustively (every significand pair at every
   scale, ``tests/test_lower_half2.py``) and its subnormal sums are exact.
2. *So an operation may go native only where both operands are 16-bit values*: a lane
   loaded from a tensor of the stored dtype, a constant exactly representable in it, the
   negation of one, or a value the float32 path itself rounds to the dtype (``te.cast``, a
   register copy) or an element every lane reads (a broadcast, in both halves of the pair):
   then the float32 path rounds that operation exactly once, as the native
   instruction does. An operand that is a float32 intermediate (``(x + y) * z``: the sum is
   not rounded before the product) makes the group stay in float32 — rounding the sum to 16
   bits would change the product. The value must be stored to a tensor of the same 16-bit
   dtype as its operands (the rounding the native instruction does).
3. *No fused multiply-add.* ``hfma2`` rounds ``a * b + c`` once where float32 rounds the sum
   to float32 first: not always the same bits, so it is never used, and the ``_rn``
   intrinsics keep ptxas from contracting a product and a sum (both rounded in float32)
   into one.
4. Max/min (NaN rules differ: ``__hmax2`` drops a NaN that ``pf_fmaxf`` keeps), division,
   square root and the transcendental functions stay in float32.

Each statement of a group goes native on its own (a statement that stays in float32 keeps
the widened lanes and its loop; a lane array such a statement reads stays in float32 too);
the scalar tail of a partial group stays in float32, bit-identical by the same argument. Each
group's decision, made or refused, is a typed record with its reason; the kernel notes show
them. bfloat16 pairs need sm_80 for native instructions; on older targets the CUDA headers
compute the same intrinsics through float, which is the float32 path.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace

import numpy as np

from polyfuse.base.decision import Decided, DecisionKind
from polyfuse.cuda.codegen.kernel_access import (
    BufferScope,
    KBinary,
    KCall,
    KCast,
    KConst,
    KLoad,
    KPairConst,
    KPairLane,
    KPairOp,
    KPairSplat,
    KPairStore,
    KUnary,
    KVal,
)
from polyfuse.cuda.codegen.kernel_ast import KernelIR, KMutator, KNode, KStmt, KVar, KVector
from polyfuse.cuda.codegen.lower_dtypes import FLOAT_TO_HALF, HALF_TO_FLOAT
from polyfuse.graph.dtypes import numpy_dtype

#: operations whose single float32 rounding followed by one to 16 bits is a single rounding
PAIR_OPS = frozenset({"add", "sub", "mul"})
_KIND = (DecisionKind.ELEMENTS_PER_THREAD,)


class _NotPaired(Exception):
    """Why a value has no bit-identical native pair form (the message)."""


def _exact(value: float, dtype: str) -> bool:
    """Whether float32 constant ``value`` is exactly a ``dtype`` value."""
    f = np.float32(value)
    return bool(np.isnan(f)) or float(f.astype(numpy_dtype(dtype))) == float(f)


def _mentions(v: object, var: str) -> bool:
    """Whether value or index tree ``v`` reads loop variable ``var``."""
    if isinstance(v, KVar):
        return v.name == var
    if isinstance(v, tuple):
        return any(_mentions(x, var) for x in v)
    if is_dataclass(v):
        return any(_mentions(getattr(v, f.name), var) for f in fields(v))
    return False


class _Pairs:
    """Builds the pair form of one group's stored values (``lanes``: lane buffer name → the
    16-bit dtype of the tensor loaded into it; ``var``: the lane variable)."""

    def __init__(self, lanes: dict[str, str], dtype: str, var: str):
        self.lanes, self.dtype, self.var = lanes, dtype, var
        self.ops = 0  # native add/sub/mul built

    def value(self, e: KVal) -> KVal:
        """``e`` as a pair that holds exactly a ``dtype`` value in the float32 path."""
        d = self.dtype
        if isinstance(e, KLoad):
            if self.lanes.get(e.buffer.name) == d:
                return KPairLane(e.buffer.name, d)
            raise _NotPaired(f"operand {e} is not a {d} lane of the group")
        if isinstance(e, KConst) and isinstance(e.value, float | int) and e.dtype != "bool":
            if _exact(float(e.value), d):
                return KPairConst(float(np.float32(e.value)), d)
            raise _NotPaired(f"constant {e.value!r} is not a {d} value")
        if isinstance(e, KUnary) and e.op == "neg":  # exact: a sign flip
            return KPairOp("neg", (self.value(e.a),), d)
        if (
            isinstance(e, KCall)
            and e.fn == HALF_TO_FLOAT.get(d)
            and isinstance(e.args[0], KLoad)
            and e.args[0].buffer.scope is BufferScope.GLOBAL
            and e.args[0].dtype == d
        ):  # a widened 16-bit element: a pair of it where every lane reads the same one
            if _mentions(e.args[0].index, self.var):
                raise _NotPaired(f"operand {e} is a scalar access per lane")
            return KPairSplat(e.args[0], d)
        if isinstance(e, KCast) and e.dtype == d:  # the float32 path rounds to d here
            return self.rounded(e.a)
        if (
            isinstance(e, KCall)
            and e.fn == HALF_TO_FLOAT.get(d)
            and isinstance(e.args[0], KCall)
            and e.args[0].fn == FLOAT_TO_HALF[d]
        ):  # a register copy of a d tensor: rounded and widened
            return self.rounded(e.args[0].args[0])
        if isinstance(e, KBinary) and e.op in PAIR_OPS:
            raise _NotPaired(
                f"operand {e} is a float32 intermediate (not rounded to {d} before its use)"
            )
        raise _NotPaired(f"{e} has no exact native {d} pair form")

    def rounded(self, e: KVal) -> KVal:
        """``e`` rounded once to ``dtype``, as pairs (an operation on two ``dtype`` values, the
        negation of one, or a ``dtype`` value)."""
        d = self.dtype
        if isinstance(e, KBinary) and e.op in PAIR_OPS:
            a, b = self.value(e.a), self.value(e.b)
            self.ops += 1
            return KPairOp(e.op, (a, b), d)
        if isinstance(e, KUnary) and e.op == "neg":
            return KPairOp("neg", (self.rounded(e.a),), d)
        return self.value(e)


def _pair_stores(n: KVector) -> tuple[tuple[KPairStore, ...], list[str]] | str:
    """The group's stored lane arrays that go native, as pair trees, with why each other
    statement stays in float32; or why none does."""
    if n.width % 2:
        return f"{n.width} lanes do not make pairs"
    if n.local:
        return "the group reads lanes it stores"
    if {x.lanes.name for x in n.lane_stores} & {x.lanes.name for x in n.lane_loads}:
        return "the group stores loaded lanes to a staged input's shared tile"
    if not all(isinstance(s, KStmt) and s.guard is None for s in n.body):
        return "its body is not plain statements"
    stored = {x.lanes.name: x.target.buffer.dtype for x in n.lane_stores}
    lanes = {x.lanes.name: x.target.buffer.dtype for x in n.lane_loads}
    native: dict[str, tuple[str, KPairStore]] = {}  # lanes -> (statement, its pairs)
    why: dict[str, str] = {}  # statement -> why it stays in float32
    for s in n.body:
        assert isinstance(s, KStmt)
        if len(s.stores) != 1 or s.stores[0].buffer.name not in stored:
            why[s.stmt] = "it stores outside the group's lanes"
            continue
        (st,) = s.stores
        dtype = stored[st.buffer.name]
        if dtype not in FLOAT_TO_HALF or st.guard is not None:
            why[s.stmt] = "it stores 32-bit lanes" if st.guard is None else "a guarded store"
            continue
        pairs = _Pairs(lanes, dtype, n.var)
        try:
            tree = pairs.rounded(st.value)
        except _NotPaired as e:
            why[s.stmt] = str(e)
            continue
        if not pairs.ops:
            why[s.stmt] = "no arithmetic to pair (copies only)"
        elif st.buffer.name in native:
            why[s.stmt] = f"lanes {st.buffer.name} are stored twice"
        else:
            native[st.buffer.name] = (s.stmt, KPairStore(st.buffer.name, tree))
    # a lane array a float32 statement reads stays float32 too (it reads the float lanes)
    changed = True
    while changed:
        changed = False
        for s in n.body:
            assert isinstance(s, KStmt)
            if s.stmt not in why:
                continue
            for name in [k for k in native if _reads(s, k)]:
                why[native.pop(name)[0]] = f"statement {s.stmt} reads its lanes in float32"
                changed = True
    reasons = [f"statement {k}: {v}" for k, v in why.items()]
    if not native:
        return "; ".join(reasons) or "it stores no lanes"
    return tuple(p for _, p in native.values()), reasons


def _reads(s: KStmt, lanes: str) -> bool:
    """Whether statement ``s`` reads lane array ``lanes``."""
    return any(_mentions_buffer(st.value, lanes) for st in s.stores)


def _mentions_buffer(v: object, name: str) -> bool:
    if isinstance(v, KLoad):
        return v.buffer.name == name or _mentions_buffer(v.index, name)
    if isinstance(v, tuple):
        return any(_mentions_buffer(x, name) for x in v)
    if is_dataclass(v):
        return any(_mentions_buffer(getattr(v, f.name), name) for f in fields(v))
    return False


def lower_half2(ir: KernelIR) -> tuple[KernelIR, list[Decided]]:
    """A new IR whose vector groups of 16-bit lanes compute in native pairs where that is
    bit-identical to the float32 path (see the module doc), and one decision per group of
    16-bit lanes considered (made, or refused with its reason)."""
    decisions: list[Decided] = []

    class Walk(KMutator):
        def visit_KVector(self, n: KVector) -> list[KNode]:
            held = {x.target.buffer.dtype for x in (*n.lane_loads, *n.lane_stores)}
            if not held & set(FLOAT_TO_HALF):
                return [n]
            tensors = tuple(sorted({x.target.buffer.name for x in n.lane_stores}))
            got = _pair_stores(n)
            if isinstance(got, str):
                decisions.append(
                    Decided(_KIND, f"native 16-bit pairs: no, {got}", subject=tensors, made=False)
                )
                return [n]
            native, reasons = got
            stored = _dt(n)
            dtypes = "/".join(sorted({stored[p.lanes] for p in native}))
            ops = sorted({o for p in native for o in _ops(p.value)})
            some = f" {len(native)} of {len(n.lane_stores)} stored arrays," if reasons else ""
            rest = f"; float32: {'; '.join(reasons)}" if reasons else ""
            decisions.append(
                Decided(
                    _KIND,
                    f"native 16-bit pairs:{some} {dtypes} {', '.join(ops)} on {n.width // 2} "
                    "pairs (each operation rounds once in the float32 path too: bit-identical)"
                    + rest,
                    subject=tensors,
                )
            )
            return [replace(n, native=native)]

    body = tuple(Walk().body(ir.body))
    return ir.with_(body=body), decisions


def _dt(n: KVector) -> dict[str, str]:
    """Stored lane array -> its tensor's dtype."""
    return {x.lanes.name: x.target.buffer.dtype for x in n.lane_stores}


def _ops(v: KVal) -> set[str]:
    """The pair operations of tree ``v``."""
    if isinstance(v, KPairOp):
        return {v.op}.union(*(_ops(a) for a in v.args))
    return set()
