"""Random te graphs for differential fuzzing, described as plain data.

A :class:`GraphSpec` is a list of :class:`Node` records (inputs and computes in topological
order) over *symbolic* dimensions: every shape is a tuple of dimension names, and
``GraphSpec.dims`` gives each name its size. Keeping the graph as data, not as te objects, is
what lets the shrinker edit it (drop a node, make a dimension 1) and the script printer write
it back as te code; :func:`build` turns a spec into te tensors.

What the generator covers (issue 9): elementwise chains of every te unary and binary op,
broadcasts (numpy rules: a shorter shape aligns right, a size-1 dimension repeats), row, column
and whole-tensor reductions (``sum``/``max``/``min`` and ``mean`` = ``te.sum(...) / n``, with
an elementwise function inside the reduction body), reductions of reductions, matmuls (plain
and with the right operand transposed), transposes, ``te.where`` on a comparison, several
outputs (every sink plus some intermediates), sizes 1, primes and non-multiples of every
tile/block size (warp 32, blocks of 64..256, 4 elements per thread, 8 x-rows), and inputs with
NaN and ±inf sprinkled in.

A rough value interval is tracked per node so that ops which would overflow float32 or divide
by numbers near zero are avoided: fuzzing wants mismatches that are bugs, not rounding.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from polyfuse import te

__all__ = [
    "BINARY",
    "DIM_SIZES",
    "FAMILIES",
    "Family",
    "GraphSpec",
    "Node",
    "REDUCE",
    "UNARY",
    "broadcast_shape",
    "draw",
    "generate",
    "te_name",
]

#: Elementwise ops of te (``Unary`` node ops; "neg" and "square" are spelled with operators).
UNARY = ("neg", "exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "abs", "square")
#: Binary ops (te operators and ``te.maximum``/``te.minimum``); "pow" takes a constant exponent.
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "pow")
#: Reductions: te's three, and the mean (``te.sum(...) / n``: a reduction nested in a body).
REDUCE = ("sum", "max", "min", "mean")
#: Unary ops a reduction may apply to its input inside its body
REDUCE_PRE = ("exp", "abs", "square", "tanh", "neg")
#: Unary ops a matmul may apply to its first operand inside the contraction's body (``square``
#: reads it twice per product; a 1x1 micro-tile then still keeps a register fragment)
MATMUL_PRE = ("abs", "square", "tanh", "neg")
COMPARE = ("gt", "lt", "ge", "le")
#: Sizes dimensions are drawn from: 1, primes, and values just around the tile sizes.
DIM_SIZES = (1, 2, 3, 5, 7, 8, 13, 17, 31, 32, 33, 37, 63, 64, 65, 97, 127, 129, 255, 257)
#: The one dimension name whose size is always 1 (a broadcast axis).
ONE = "_1"
#: Values of a input node's ``fill``.
FILLS = ("normal", "positive", "special")

_BIG = 1e6  # no op may make a value interval wider than this


@dataclass(frozen=True)
class Node:
    """One tensor of a spec.

    kind: "input" (``fill`` says how its values are drawn), "unary" (``op`` on ``args[0]``),
    "binary" (``op`` on ``args[0]`` and ``args[1]`` with numpy broadcasting, or on ``args[0]``
    and ``const`` when there is one argument), "reduce" (``op`` of ``pre(args[0])`` over the
    source ``axes``; ``pre`` is a unary op or ""), "matmul" (``pre(args[0]) @ args[1]``, or
    ``pre(args[0]) @ args[1].T`` when ``op`` is "nt"; ``pre`` inside the contraction's body,
    ``square`` reading the operand twice per product), "transpose" (2-D), or "where"
    (``where(args[0] <op> const, args[1], args[2])``, broadcast).
    """

    name: str
    kind: str
    shape: tuple[str, ...]
    args: tuple[str, ...] = ()
    op: str = ""
    const: float | None = None
    axes: tuple[int, ...] = ()
    pre: str = ""
    fill: str = ""
    seed: int = 0  # input: the seed its values are drawn from
    params: tuple[int, ...] = ()  # the integers of a family's node kinds (:data:`FAMILIES`)
    #: The tensor's dtype (a placeholder's, or a compute's ``dtype=``) and, per argument, a
    #: dtype its reads are ``te.cast`` to ("" for none): see :mod:`.dtypes`.
    dtype: str = "float32"
    casts: tuple[str, ...] = ()


@dataclass
class GraphSpec:
    """A random graph: dimension sizes, nodes in topological order, the output names, and the
    seed its input values are drawn from."""

    dims: dict[str, int]
    nodes: list[Node]
    outputs: list[str]
    seed: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def size(self, shape: tuple[str, ...]) -> tuple[int, ...]:
        return tuple(1 if d == ONE else self.dims[d] for d in shape)

    @property
    def inputs(self) -> list[Node]:
        return [n for n in self.nodes if n.kind == "input"]

    def copy(self, **changes: Any) -> GraphSpec:
        new = GraphSpec(dict(self.dims), list(self.nodes), list(self.outputs), self.seed)
        new.meta = dict(self.meta)
        for k, v in changes.items():
            setattr(new, k, v)
        return new

    def pruned(self) -> GraphSpec:
        """The spec without nodes no output depends on (and without unused dims)."""
        live: set[str] = set(self.outputs)
        for n in reversed(self.nodes):
            if n.name in live:
                live.update(n.args)
        nodes = [n for n in self.nodes if n.name in live]
        used = {d for n in nodes for d in n.shape if d != ONE}
        return self.copy(nodes=nodes, dims={d: v for d, v in self.dims.items() if d in used})

    def __str__(self) -> str:
        dims = ", ".join(f"{k}={v}" for k, v in self.dims.items())
        lines = [f"GraphSpec(seed={self.seed}; {dims}; outputs {', '.join(self.outputs)})"]
        lines += [f"  {n}" for n in self.nodes]
        return "\n".join(lines)


def broadcast_shape(*shapes: tuple[str, ...]) -> tuple[str, ...] | None:
    """numpy broadcasting on symbolic shapes (``ONE`` repeats); None when incompatible."""
    nd = max(len(s) for s in shapes)
    out: list[str] = []
    for d in range(nd):
        syms = {s[len(s) - nd + d] for s in shapes if len(s) - nd + d >= 0} - {ONE}
        if len(syms) > 1:
            return None
        out.append(syms.pop() if syms else ONE)
    return tuple(out)


# --------------------------------------------------------------------------- generation


@dataclass
class _Info:
    lo: float
    hi: float
    depth: int = 0


def interval_unary(op: str, lo: float, hi: float) -> tuple[float, float] | None:
    if op == "neg":
        return -hi, -lo
    if op == "abs":
        return (0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))), max(abs(lo), abs(hi))
    if op == "square":
        m = max(abs(lo), abs(hi))
        return 0.0, m * m
    if op == "exp":
        return (math.exp(lo), math.exp(hi)) if hi < 12 else None
    if op in ("log", "sqrt", "rsqrt"):
        if lo < 0.05:
            return None
        f = {"log": math.log, "sqrt": math.sqrt, "rsqrt": lambda v: 1 / math.sqrt(v)}[op]
        a, b = f(lo), f(hi)
        return min(a, b), max(a, b)
    if op == "tanh":
        return math.tanh(lo), math.tanh(hi)
    if op == "erf":
        return math.erf(lo), math.erf(hi)
    if op == "sigmoid":
        return 0.0, 1.0
    raise ValueError(op)


def interval_binary(
    op: str, a: tuple[float, float], b: tuple[float, float]
) -> tuple[float, float] | None:
    if op == "add":
        return a[0] + b[0], a[1] + b[1]
    if op == "sub":
        return a[0] - b[1], a[1] - b[0]
    if op in ("mul", "div", "pow"):
        if op == "div":
            if b[0] <= 0.25 and b[1] >= -0.25:
                return None  # the denominator may be (near) zero
            b = (1 / b[1], 1 / b[0])
        if op == "pow":
            if a[0] < 0.05:
                return None
            e = b[0]
            c = [a[0] ** e, a[1] ** e]
            return min(c), max(c)
        c = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
        return min(c), max(c)
    if op == "maximum":
        return max(a[0], b[0]), max(a[1], b[1])
    if op == "minimum":
        return min(a[0], b[0]), min(a[1], b[1])
    raise ValueError(op)


class _Generator:
    def __init__(self, rng: random.Random, max_elements: int, n_computes: int) -> None:
        self.rng = rng
        self.max_elements = max_elements
        self.n_computes = n_computes
        self.dims: dict[str, int] = {}
        self.nodes: list[Node] = []
        self.info: dict[str, _Info] = {}

    # ---- helpers
    def new_dim(self, limit: int | None = None) -> str:
        name = f"d{len(self.dims)}"
        pool = [s for s in DIM_SIZES if limit is None or s <= limit] or [1]
        size = self.rng.choice(pool)
        if self.rng.random() < 0.03:  # now and then a long axis: multi-pass reductions
            size = self.rng.choice((300, 513, 1031, 4099))
        self.dims[name] = size
        return name

    def elements(self, shape: tuple[str, ...]) -> int:
        return math.prod(1 if d == ONE else self.dims[d] for d in shape)

    def fresh_shape(self, rank: int) -> tuple[str, ...]:
        for _ in range(20):
            shape = tuple(self.new_dim() for _ in range(rank))
            if self.elements(shape) <= self.max_elements:
                return shape
            for d in shape:
                del self.dims[d]
        return tuple(self.new_dim(limit=8) for _ in range(rank))

    def add(self, node: Node, lo: float, hi: float, depth: int) -> Node:
        self.nodes.append(node)
        self.info[node.name] = _Info(lo, hi, depth)
        return node

    def name(self, prefix: str) -> str:
        return f"{prefix}{len(self.nodes)}"

    def add_input(self, shape: tuple[str, ...]) -> Node:
        fill = self.rng.choices(FILLS, weights=(5, 2, 2))[0]
        lo, hi = (0.5, 2.5) if fill == "positive" else (-4.0, 4.0)
        node = Node(self.name("x"), "input", shape, fill=fill, seed=self.rng.randrange(1 << 31))
        return self.add(node, lo, hi, 0)

    def pick(self, pred: Any = None) -> Node | None:
        cands = [n for n in self.nodes if pred is None or pred(n)]
        if not cands:
            return None
        # favour recent nodes: long chains rather than wide fans
        weights = [1.0 + i for i in range(len(cands))]
        return self.rng.choices(cands, weights=weights)[0]

    def ival(self, n: Node) -> tuple[float, float]:
        i = self.info[n.name]
        return i.lo, i.hi

    def depth(self, *ns: Node) -> int:
        return 1 + max(self.info[n.name].depth for n in ns)

    def ok(self, iv: tuple[float, float] | None) -> bool:
        return iv is not None and -_BIG < iv[0] <= iv[1] < _BIG

    # ---- op constructors (return None when the choice does not fit)
    def unary(self) -> Node | None:
        a = self.pick()
        op = self.rng.choice(UNARY)
        iv = interval_unary(op, *self.ival(a))
        if not self.ok(iv):
            return None
        assert iv is not None
        return self.add(Node(self.name("u"), "unary", a.shape, (a.name,), op), *iv, self.depth(a))

    def binary(self) -> Node | None:
        a = self.pick()
        op = self.rng.choice(BINARY)
        r = self.rng.random()
        if op == "pow":
            e = self.rng.choice((2.0, 3.0, 0.5))
            iv = interval_binary(op, self.ival(a), (e, e))
            if not self.ok(iv):
                return None
            assert iv is not None
            return self.add(
                Node(self.name("b"), "binary", a.shape, (a.name,), op, const=e), *iv, self.depth(a)
            )
        if r < 0.25:  # with a constant
            c = self.rng.choice((0.0, 0.5, -1.5, 2.0, 3.0))
            iv = interval_binary(op, self.ival(a), (c, c))
            if not self.ok(iv):
                return None
            assert iv is not None
            return self.add(
                Node(self.name("b"), "binary", a.shape, (a.name,), op, const=c), *iv, self.depth(a)
            )
        if r < 0.5:  # broadcast against a fresh input of a compatible smaller shape
            b = self.add_input(self.broadcast_partner(a.shape))
        else:
            b = self.pick(lambda n: broadcast_shape(a.shape, n.shape) is not None)
        if self.rng.random() < 0.5:
            a, b = b, a
        shape = broadcast_shape(a.shape, b.shape)
        assert shape is not None
        if self.elements(shape) > self.max_elements:
            return None
        iv = interval_binary(op, self.ival(a), self.ival(b))
        if not self.ok(iv):
            return None
        assert iv is not None
        return self.add(
            Node(self.name("b"), "binary", shape, (a.name, b.name), op), *iv, self.depth(a, b)
        )

    def broadcast_partner(self, shape: tuple[str, ...]) -> tuple[str, ...]:
        """A shape that broadcasts against ``shape``: a suffix, with some dims made 1."""
        k = self.rng.randint(0, len(shape))
        part = list(shape[len(shape) - k :])
        for i in range(len(part)):
            if self.rng.random() < 0.4:
                part[i] = ONE
        if not part:
            part = [ONE] if self.rng.random() < 0.5 else []
        return tuple(part)

    def pre(self, p: float, ops: tuple[str, ...], lo: float, hi: float) -> tuple[str, float, float]:
        """With probability ``p``, one of ``ops`` to apply to an operand of interval
        ``(lo, hi)`` ("" where none is drawn or the result's interval is out of bounds), with
        the interval after it."""
        if self.rng.random() >= p:
            return "", lo, hi
        pre = self.rng.choice(ops)
        iv = interval_unary(pre, lo, hi)
        if not self.ok(iv):
            return "", lo, hi
        assert iv is not None
        return pre, *iv

    def reduce(self) -> Node | None:
        a = self.pick(lambda n: len(n.shape) >= 1)
        if a is None:
            return None
        nd = len(a.shape)
        form = self.rng.random()
        if form < 0.4:
            axes = (nd - 1,)  # row
        elif form < 0.7:
            axes = (0,)  # column (for 1-D: the whole tensor)
        elif form < 0.85:
            axes = tuple(range(nd))  # everything
        else:
            axes = tuple(sorted(self.rng.sample(range(nd), self.rng.randint(1, nd))))
        op = self.rng.choice(REDUCE)
        pre, lo, hi = self.pre(0.3, REDUCE_PRE, *self.ival(a))
        n = math.prod(1 if a.shape[d] == ONE else self.dims[a.shape[d]] for d in axes)
        if op == "sum":
            lo, hi = min(lo * n, lo), max(hi * n, hi)
        if not self.ok((lo, hi)):
            return None
        shape = tuple(d for i, d in enumerate(a.shape) if i not in axes)
        if self.rng.random() < 0.5:  # keepdims: reduced axes stay as size-1 (broadcast) axes
            shape = tuple(ONE if i in axes else d for i, d in enumerate(a.shape))
        elif not shape and self.rng.random() < 0.5:
            shape = (ONE,)  # a total of shape (1,) instead of 0-d
        node = Node(self.name("r"), "reduce", shape, (a.name,), op, axes=axes, pre=pre)
        return self.add(node, lo, hi, self.depth(a))

    def matmul(self) -> Node | None:
        a = self.pick(lambda n: len(n.shape) == 2)
        if a is None:
            return None
        nt = self.rng.random() < 0.3
        kdim = a.shape[1]
        ndim = self.new_dim()
        if self.elements((a.shape[0], ndim)) > self.max_elements:
            del self.dims[ndim]
            return None
        bshape = (ndim, kdim) if nt else (kdim, ndim)
        cands = [n for n in self.nodes if n.shape == bshape]
        b = self.rng.choice(cands) if cands and self.rng.random() < 0.3 else self.add_input(bshape)
        k = 1 if kdim == ONE else self.dims[kdim]
        pre, la, ha = self.pre(0.25, MATMUL_PRE, *self.ival(a))  # inside the body
        lb, hb = self.ival(b)
        m = max(abs(la), abs(ha)) * max(abs(lb), abs(hb)) * k
        if m >= _BIG:
            return None
        node = Node(
            self.name("m"),
            "matmul",
            (a.shape[0], ndim),
            (a.name, b.name),
            "nt" if nt else "",
            pre=pre,
        )
        return self.add(node, -m, m, self.depth(a, b))

    def transpose(self) -> Node | None:
        a = self.pick(lambda n: len(n.shape) == 2)
        if a is None:
            return None
        node = Node(self.name("t"), "transpose", (a.shape[1], a.shape[0]), (a.name,))
        return self.add(node, *self.ival(a), self.depth(a))

    def where(self) -> Node | None:
        c = self.pick()
        a = self.pick(lambda n: broadcast_shape(c.shape, n.shape) is not None)
        b = self.pick(lambda n: broadcast_shape(c.shape, a.shape, n.shape) is not None)
        shape = broadcast_shape(c.shape, a.shape, b.shape)
        assert shape is not None
        if self.elements(shape) > self.max_elements:
            return None
        lo, hi = self.ival(c)
        const = round(self.rng.uniform(lo, hi), 2) if hi - lo < 100 else 0.0
        (la, ha), (lb, hb) = self.ival(a), self.ival(b)
        node = Node(
            self.name("w"),
            "where",
            shape,
            (c.name, a.name, b.name),
            self.rng.choice(COMPARE),
            const,
        )
        return self.add(node, min(la, lb), max(ha, hb), self.depth(c, a, b))

    # ---- the graph
    def run(self) -> tuple[dict[str, int], list[Node]]:
        rank = self.rng.choices((1, 2, 3), weights=(2, 6, 1))[0]
        self.add_input(self.fresh_shape(rank))
        kinds = ("unary", "binary", "reduce", "matmul", "transpose", "where")
        weights = (4, 5, 4, 1, 0.5, 1)
        made = 0
        for _ in range(self.n_computes * 10):
            if made >= self.n_computes:
                break
            kind = self.rng.choices(kinds, weights=weights)[0]
            has2d = any(len(n.shape) == 2 for n in self.nodes)
            if kind in ("matmul", "transpose") and not has2d:
                continue
            if getattr(self, kind)() is not None:
                made += 1
        return self.dims, self.nodes


def generate(
    seed: int, *, n_computes: int | None = None, max_elements: int = 4096, prefix: str = ""
) -> GraphSpec:
    """A random graph, a pure function of ``seed`` (and the size limits).

    ``n_computes``: compute nodes to generate (default: 1 to 8, drawn); ``max_elements``: the
    largest tensor; ``prefix`` is put before every node and dimension name (to merge specs).
    """
    rng = random.Random(seed)
    n = n_computes if n_computes is not None else rng.randint(1, 8)
    dims, nodes = _Generator(rng, max_elements, n).run()
    used = {a for nd in nodes for a in nd.args}
    sinks = [nd.name for nd in nodes if nd.kind != "input" and nd.name not in used]
    extra = [nd.name for nd in nodes if nd.kind != "input" and nd.name in used]
    outputs = sinks + [e for e in extra if rng.random() < 0.2]
    if not outputs:  # no compute was made: one unary op on the input
        x = nodes[0]
        nodes.append(Node("u1", "unary", x.shape, (x.name,), "abs"))
        outputs = ["u1"]
    spec = GraphSpec(dims, nodes, outputs, seed)
    return rename(spec, prefix) if prefix else spec


def rename(spec: GraphSpec, prefix: str) -> GraphSpec:
    """``spec`` with ``prefix`` before every node and dimension name."""

    def d(s: str) -> str:
        return s if s == ONE else prefix + s

    nodes = [
        replace(
            n,
            name=prefix + n.name,
            shape=tuple(map(d, n.shape)),
            args=tuple(prefix + a for a in n.args),
        )
        for n in spec.nodes
    ]
    new = spec.copy(
        dims={prefix + k: v for k, v in spec.dims.items()},
        nodes=nodes,
        outputs=[prefix + o for o in spec.outputs],
    )
    if "names" in spec.meta:
        new.meta["names"] = {prefix + k: v for k, v in spec.meta["names"].items()}
    return new


def merge(specs: list[GraphSpec]) -> GraphSpec:
    """One spec holding several (already disjointly named) specs side by side."""
    dims: dict[str, int] = {}
    nodes: list[Node] = []
    outputs: list[str] = []
    names: dict[str, str] = {}
    for s in specs:
        dims.update(s.dims)
        nodes += s.nodes
        outputs += s.outputs
        names.update(s.meta.get("names", {}))
    merged = GraphSpec(dims, nodes, outputs, specs[0].seed if specs else 0)
    if names:
        merged.meta["names"] = names
    return merged


def te_name(spec: GraphSpec, n: Node) -> str:
    """The te name of node ``n``: its spec name unless the spec gives it another
    (``meta["names"]``, the adversarial names of :mod:`.adversarial`)."""
    return spec.meta.get("names", {}).get(n.name, n.name)


# --------------------------------------------------------------------------- families


@dataclass(frozen=True)
class Family:
    """A generator family: how often the fuzzer draws it, its generator, and the node kinds it
    adds beyond :func:`generate`'s, each with its te builder and its script text."""

    weight: float
    generate: Callable[..., GraphSpec]  # (seed, *, max_elements, prefix) -> spec
    #: kind -> (spec, node, tensors so far by name) -> the node's tensor
    build: dict[str, Callable[[GraphSpec, Node, dict[str, te.Tensor]], te.Tensor]]
    #: kind -> (spec, node) -> lines of Python that build it (with ``ops`` and ``te``)
    source: dict[str, Callable[[GraphSpec, Node], list[str]]]


#: The families ``polyfuse fuzz`` draws from: :func:`generate`'s random graphs, and those
#: other modules add (:mod:`.stencil`).
FAMILIES: dict[str, Family] = {"random": Family(4.0, generate, {}, {})}


def draw(
    seed: int,
    *,
    max_elements: int = 4096,
    prefix: str = "",
    families: Sequence[str] | None = None,
) -> GraphSpec:
    """The graph of ``seed`` from a family drawn by ``seed`` (weighted): a pure function of
    the seed and the registered families (or ``families``). ``meta["family"]`` names it."""
    unknown = sorted(set(families or ()) - set(FAMILIES))
    if unknown:
        raise ValueError(f"unknown fuzz families {unknown}; known: {', '.join(sorted(FAMILIES))}")
    names = sorted(families or FAMILIES)
    pick = random.Random(f"family {seed}").choices(names, [FAMILIES[n].weight for n in names])
    spec = FAMILIES[pick[0]].generate(seed, max_elements=max_elements, prefix=prefix)
    spec.meta["family"] = pick[0]
    return spec


def family_kind(kind: str) -> Family | None:
    """The family that adds node kind ``kind`` (None for :func:`generate`'s own kinds)."""
    return next((f for f in FAMILIES.values() if kind in f.build), None)
