"""Dtypes of fuzzed graphs (issue 22 item 5): ``polyfuse fuzz --dtypes LIST|all``.

:func:`with_dtypes` gives every node of a drawn graph a dtype (``Node.dtype``: a placeholder's
dtype or a compute's ``dtype=``) and some reads a ``te.cast`` (``Node.casts``). Its choices
come from a random generator of their own (seeded by the graph's seed), so a graph keeps the
structure it has without ``--dtypes`` and only its dtypes change. A graph is either *uniform*
(every tensor of one dtype) or *mixed*: each tensor draws its dtype, so 16-bit storage meets
float32 computes, reductions of 16-bit values accumulate in float32 (the default accumulator),
and casts to float16/bfloat16 round inside fused bodies.

Value ranges: the value interval of each node (as the generator tracks it) decides where
float16 may store or round a value: only below :data:`HALF_MAX` (float16's largest is 65504),
so that no tensor overflows in the reference's rounding while a kernel, which computes the
value in a float32 register, does not.

float64 is one of the float dtypes drawn when named (uniform float64 graphs are compared with
float64's tolerance, and their inputs are perturbed by float64's roundoff, so a kernel that
computed in float would fail). int32, int64 and bool storage is drawn when named: some graphs
store an input in such a dtype, and maybe one compute exact on it (see
:func:`_store_one_integer`); integer results compare exactly. int32 and bool casts inside a
body are drawn too when named, where the op reading them is defined for integers (no ``log``
of a truncated value). :func:`refusal` names what code
generation must refuse (nothing the drawn dtypes give any more: every dtype is stored).
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from polyfuse.cuda.codegen.lower_dtypes import C_TYPES, STORAGE_DTYPES
from polyfuse.graph.dtypes import DTYPES, NARROW_INTS, numpy_dtype, promote

from .generate import GraphSpec, Node, family_kind, interval_binary, interval_unary

__all__ = [
    "FLOATS",
    "HALF_MAX",
    "parse_dtypes",
    "perturbation",
    "precision",
    "refusal",
    "with_dtypes",
]

#: The float dtypes kernels store.
FLOATS = ("float16", "bfloat16", "float32", "float64")
#: The integer and bool dtypes a drawn graph may store one tensor in.
INTEGERS = ("uint8", "int8", "int16", "int32", "int64", "bool")
#: Largest magnitude a float16 tensor or cast may hold in a drawn graph.
HALF_MAX = 3e4
#: Relative input perturbation (see :func:`polyfuse.testing.run.compare`) per dtype of a graph:
#: half a unit of roundoff of its coarsest float dtype, so that the comparison's slack measures
#: how much roundings of that size move the result. float32 keeps the fuzzer's 1e-5.
PERTURB = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 1e-5, "float64": 2.0**-52}
#: Largest magnitude an int32 cast may truncate (products of two stay far inside int32).
INT_MAX = 1000.0
#: Ops whose operand may be an integer (or bool) read: defined and well-conditioned for them.
_INT_OK_UNARY = ("neg", "abs", "square", "tanh", "erf", "sigmoid")
_INT_OK_BINARY = ("add", "sub", "mul", "maximum", "minimum")
_INF = (-math.inf, math.inf)


def parse_dtypes(text: str) -> tuple[str, ...]:
    """The dtypes of ``--dtypes``: a comma-separated list of dtype names, or "all"."""
    if text.strip() == "all":
        return tuple(DTYPES)
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    unknown = [n for n in names if n not in DTYPES]
    if not names or unknown:
        raise ValueError(f"unknown dtypes {unknown or text!r}; known: all, {', '.join(DTYPES)}")
    return names


def refusal(spec: GraphSpec) -> str:
    """Why code generation must refuse ``spec`` (a tensor stored in, or a cast to, a dtype
    kernels do not compute in), or "" when it must compile."""
    for n in spec.pruned().nodes:
        if n.dtype not in STORAGE_DTYPES:
            return f"{n.kind} '{n.name}' is {n.dtype}"
        for c in n.casts:
            if c and c not in C_TYPES:
                return f"'{n.name}' casts to {c}"
    return ""


def perturbation(spec: GraphSpec) -> dict[str, float]:
    """Per input of ``spec``, its relative perturbation: :data:`PERTURB` of the coarsest float
    dtype stored or cast to downstream of it (itself included), so that a float32 graph
    batched beside a bfloat16 one keeps float32's figure."""
    down: dict[str, set[str]] = {}
    for n in reversed(spec.nodes):
        used = {n.dtype, *(c for c in n.casts if c)}
        for m in spec.nodes:
            if n.name in m.args:
                used |= down.get(m.name, set())
        down[n.name] = used
    return {
        n.name: max([PERTURB[d] for d in down[n.name] if d in PERTURB] or [PERTURB["float32"]])
        for n in spec.inputs
    }


def precision(spec: GraphSpec, name: str) -> str:
    """The dtype whose tolerance output ``name`` of ``spec`` is compared with: the coarsest float
    dtype a compute upstream of it (itself included) stores or casts to, or computes in. A
    kernel computes a 16-bit tensor's body in float32 where the reference computes in float64,
    and the two may round it one unit apart, so a float32 result of a bfloat16 tensor is as
    close to the reference as bfloat16's rounding, not float32's (inputs hold the same values on
    both sides and do not count). A compute whose operands are not float64 computes in float32
    registers (te's dtype of ``tanh(x_bf16)`` is bfloat16), where the reference's body is
    float64: its float64 result is as close as float32's rounding."""
    seen: set[str] = set()
    stack, used = [name], set()
    while stack:
        n = spec.node(stack.pop())
        if n.name in seen or n.kind == "input":
            continue
        seen.add(n.name)
        used |= {n.dtype, *(c for c in n.casts if c)}
        if n.args and _arithmetic(spec, n) != "float64":
            used.add("float32")
        stack.extend(n.args)
    floats = [d for d in ("bfloat16", "float16", "float32", "float64") if d in used]
    own = spec.node(name).dtype
    return floats[0] if floats and own in FLOATS else own


def _arithmetic(spec: GraphSpec, n: Node) -> str:
    """The dtype compute ``n``'s body computes in: its operands' (cast) dtypes promoted."""
    ds = [
        (n.casts[k] if k < len(n.casts) and n.casts[k] else spec.node(a).dtype)
        for k, a in enumerate(n.args)
    ]
    return functools.reduce(promote, ds)


def _interval(spec: GraphSpec, n: Node, ivs: dict[str, tuple[float, float]]) -> tuple:
    """A rough value interval of node ``n`` (the generator's rules; unbounded when unknown)."""
    a = [ivs.get(x, _INF) for x in n.args]
    iv: tuple[float, float] | None
    if n.kind == "input":
        iv = (0.5, 2.5) if n.fill == "positive" else (-4.5, 4.5)
    elif n.kind == "unary":
        iv = interval_unary(n.op, *a[0]) if math.isfinite(a[0][0] + a[0][1]) else None
    elif n.kind == "binary":
        b = (n.const, n.const) if n.const is not None else a[1]
        finite = all(math.isfinite(v) for v in (*a[0], *b))
        iv = interval_binary(n.op, a[0], b) if finite else None
    elif n.kind in ("transpose",):
        iv = a[0]
    elif n.kind == "where":
        iv = (min(a[1][0], a[2][0]), max(a[1][1], a[2][1]))
    elif n.kind == "matmul":
        k = spec.size(spec.node(n.args[0]).shape)[1]
        ia = a[0]
        if n.pre and math.isfinite(ia[0] + ia[1]):
            ia = interval_unary(n.pre, *ia) or (-math.inf, math.inf)
        m = max(map(abs, ia)) * max(map(abs, a[1])) * k
        iv = (-m, m)
    elif n.kind == "reduce":
        iv = a[0]
        if n.pre and math.isfinite(iv[0] + iv[1]):
            iv = interval_unary(n.pre, *iv)
        if iv is not None and n.op == "sum":
            src = spec.size(spec.node(n.args[0]).shape)
            count = math.prod(src[d] for d in n.axes)
            iv = (min(iv[0] * count, iv[0]), max(iv[1] * count, iv[1]))
    else:
        iv = None
    if iv is None or not all(math.isfinite(v) for v in iv):
        return _INF
    return (float(iv[0]), float(iv[1]))


def _fits(dtype: str, iv: tuple[float, float]) -> bool:
    m = max(abs(iv[0]), abs(iv[1]))
    if dtype == "float16":
        return m <= HALF_MAX
    if dtype in NARROW_INTS:  # stored without wrapping: the values are the float's
        lim = np.iinfo(numpy_dtype(dtype))
        return lim.min <= iv[0] and iv[1] <= lim.max
    if dtype in ("int32", "int64", "bool"):
        return m <= INT_MAX
    return True


def _int_reader(n: Node, k: int, special: bool = False) -> bool:
    """Whether argument ``k`` of ``n`` may be read as an integer or bool; ``special``: the
    argument may hold an infinity, which an int32 cast makes ±2**31, so no integer arithmetic
    may follow it (int32 wraps in a kernel, not in the reference's int64 body)."""
    if isinstance(n.const, int):  # an int constant beside an int read must fit it: none then
        return False
    if special:
        if n.kind == "unary":
            return n.op in ("tanh", "erf", "sigmoid")
        return n.kind in ("binary", "where") or (n.kind == "reduce" and not n.pre)
    if n.kind == "unary":
        return n.op in _INT_OK_UNARY
    if n.kind == "binary":
        return n.op in _INT_OK_BINARY
    if n.kind == "reduce":  # a mean's te.sum is its own (int32) tensor: stored, refused
        return n.pre in ("", "neg", "abs", "square", "tanh") and n.op != "mean"
    return n.kind == "where" and k > 0


def _casts(
    rng: random.Random, n: Node, ivs: dict, dtypes: Sequence[str], special: set[str]
) -> tuple[str, ...]:
    """Per argument of ``n``, a dtype its reads are cast to, or "" (``special``: the nodes
    that may hold infinities)."""
    if n.kind not in ("unary", "binary", "reduce", "matmul", "transpose", "where"):
        return ()
    out: list[str] = []
    for k, a in enumerate(n.args):
        choice = ""
        if rng.random() < 0.2 and not (n.kind == "where" and k == 0):
            ok = [d for d in dtypes if d in FLOATS and _fits(d, ivs.get(a, _INF))]
            ints = [d for d in ("int32", "bool") if d in dtypes]
            if not _int_reader(n, k, a in special) or (a in special and "int32" in out):
                ints = []  # (beside an int32 read of an infinity, no second integer read)
            ints = [d for d in ints if a in special or _fits(d, ivs.get(a, _INF))]
            if "bool" in ints and ("bool" in out or n.kind not in ("binary", "where")):
                ints.remove("bool")  # one bool operand beside a float one: no bool arithmetic
            pool = ok + ints
            choice = rng.choice(pool) if pool else ""
        out.append(choice)
    return tuple(out) if any(out) else ()


def _store_one_integer(
    rng: random.Random,
    spec: GraphSpec,
    nodes: list[Node],
    ivs: dict[str, tuple[float, float]],
    special: set[str],
    dtype: str,
) -> None:
    """Store an input of ``nodes`` (in place) in integer or bool ``dtype`` and, for an
    integer, maybe one compute that is exact on it (a sum/max/min, ``abs``/``-``, a transpose
    or ``+ - * max min`` of it with itself). Only exact values are stored as integers: a
    float body truncated to an integer differs between the kernel's float32 registers and
    the reference's float64 at every integer boundary (``int64(sigmoid(90))`` is 1 in float32,
    0 in float64: fuzz seed 720018). A stored node is finite, within :data:`INT_MAX`, not
    beside a wide int constant, and every reader is defined for integers
    (:func:`_int_reader`); a bool one is read once, by a binary op or a where branch, beside
    no other bool (C's ``True + True`` is 2)."""
    readers = {
        n.name: [(m, k) for m in nodes for k, a in enumerate(m.args) if a == n.name] for n in nodes
    }
    wide = {a for m in nodes if isinstance(m.const, int) for a in m.args}

    def ok(n: Node) -> bool:
        if n.name in special or n.name in wide or not _fits(dtype, ivs.get(n.name, _INF)):
            return False
        rs = readers[n.name]
        if not all(_int_reader(m, k) for m, k in rs):
            return False
        if dtype == "bool":
            return all(
                m.kind in ("binary", "where")
                and m.args.count(n.name) == 1
                and "bool" not in m.casts
                for m, _ in rs
            )
        return True

    def exact(m: Node, src: str) -> bool:
        """Whether compute ``m`` is exact on integer argument ``src`` (and reads no other)."""
        if m.casts or set(m.args) != {src}:
            return False
        if m.kind == "reduce":
            return m.op in ("sum", "max", "min") and not m.pre
        if m.kind == "unary":
            return m.op in ("abs", "neg")
        if m.kind == "binary":
            return m.const is None and m.op in ("add", "sub", "mul", "maximum", "minimum")
        return m.kind == "transpose"

    cands = [i for i, n in enumerate(nodes) if n.kind == "input" and ok(n)]
    if not cands:
        return
    k = rng.choice(cands)
    src = nodes[k].name
    nodes[k] = replace(nodes[k], dtype=dtype)
    if dtype == "bool" or rng.random() < 0.5:
        return
    more = [i for i, m in enumerate(nodes) if exact(m, src) and ok(m)]
    if more:
        i = rng.choice(more)
        nodes[i] = replace(nodes[i], dtype=dtype)


def with_dtypes(spec: GraphSpec, dtypes: Sequence[str] | None) -> GraphSpec:
    """``spec`` with dtypes drawn from ``dtypes`` (see the module docstring); unchanged when
    ``dtypes`` is empty or the spec has a generator family's own node kinds (their builders
    choose their dtypes)."""
    if not dtypes or any(family_kind(n.kind) for n in spec.nodes):
        return spec
    rng = random.Random(f"dtypes {spec.seed}")
    floats = [d for d in FLOATS if d in dtypes] or ["float32"]
    ints = [d for d in INTEGERS if d in dtypes]
    uniform = len(floats) == 1 or rng.random() < 0.35
    base = rng.choice(floats)
    ivs: dict[str, tuple[float, float]] = {}
    nodes: list[Node] = []
    special: set[str] = set()  # nodes that may hold NaN or infinities (from special inputs)
    for n in spec.nodes:
        if n.fill == "special" or special.intersection(n.args):
            special.add(n.name)
        casts = () if uniform else _casts(rng, n, ivs, dtypes, special)
        iv = _interval(spec, n, ivs)
        if any(c == "int32" and a in special for a, c in zip(n.args, casts, strict=False)):
            iv = _INF  # an int32 cast of an infinity is ±2**31: no float16 after it
        ok = [d for d in floats if _fits(d, iv)]
        if uniform:
            dtype = base if base in ok else next((d for d in ok if d != "float16"), "float32")
        else:
            dtype = rng.choice(ok) if ok else "float32"
        nodes.append(replace(n, dtype=dtype, casts=casts))
        ivs[n.name] = iv
    if ints and rng.random() < 0.5:
        _store_one_integer(rng, spec, nodes, ivs, special, rng.choice(ints))
    new = spec.copy(nodes=nodes)
    new.meta["dtypes"] = "uniform" if uniform else "mixed"
    return new
