"""Generator families for the classes of silent wrong results issue 19 found.

Each family draws graphs of one class the compiler once got wrong without a word:

- ``names``: a random graph whose tensors carry adversarial names — C/CUDA keywords and
  built-ins, the compiler's generated prefixes (``v_x``, ``q_x0``, ``s_x``, ``r_x``, ``c0``),
  duplicates and names that sanitise to each other (``spec.meta["names"]``: node → te name);
- ``constants``: a random graph finished by elementwise ops with extreme constants (±1e39,
  1e-50, 3.4028236e38, denormals, integers beyond 2³¹ and 2⁶³ beside float tensors);
- ``shifts``: reads shifted along a dimension (``x[i, j + c]``): inside the tensor (the shape
  shrinks), guarded by an affine ``te.where``, or out of bounds — which must be refused when the
  graph is built (``spec.meta["expect_error"]``), never compiled;
- ``branches``: several independent branches (float4 row softmaxes of long rows, small GEMMs)
  that Layer 3 packs near the shared-memory limit;
- ``factor_gemm``: GEMMs with a 1-D factor indexed by i, j or k (``a[i,k]·b[k,j]·s[k]``).

Node kinds added here (``Node.params``): ``shift`` (``axes[0]`` the dim, ``params[0]`` the
offset, ``op`` "" or "guard": zero where the read would leave the tensor) and ``fmatmul``
(``args`` a, b, s; ``op`` the index of s: "i", "j" or "k").
"""

from __future__ import annotations

import random
from typing import Any

from polyfuse import te

from .generate import FAMILIES, FILLS, ONE, Family, GraphSpec, Node, generate, rename

__all__ = ["EXTREME_CONSTANTS", "NAME_POOL", "generate_branches", "generate_names"]

#: Names a user may give tensors that met generated identifiers or C words before the namer.
NAME_POOL = (
    "x", "x", "y", "x_1", "v_x", "q_x0", "s_x", "r_x", "x_acc", "r_x_frag", "u_x", "u_x_u",
    "double", "while", "int", "float", "return", "float4", "expf", "make_float4",
    "INFINITY", "threadIdx", "blockIdx", "min", "c0", "kt0", "kk0", "p0r", "p1d0", "pos",
    "pf_scratch", "pfT0", "pfKERNEL", "_b", "v.x", "1x", "a-b", "x y", "ä", "QKV",
)  # fmt: skip
#: Constants that are not float32 literals as Python writes them.
EXTREME_CONSTANTS = (
    1e39, -1e39, 3.4028236e38, -3.4028235e38, 1e-50, 1e-45, 1.4e-45, 1e-40,
    2**31, -(2**31) - 1, 10**20, 2**63 + 5, 0.1, 1.0 / 3.0,
)  # fmt: skip
ROWS = (1, 2, 3, 5, 8)
LONG = (1024, 1031, 2048, 4096)
GEMM_DIMS = (16, 33, 48, 64, 65, 96, 127, 128)


def _rng(kind: str, seed: int) -> random.Random:
    return random.Random(f"{kind} {seed}")


# --------------------------------------------------------------------------- names


def generate_names(seed: int, *, max_elements: int = 4096, prefix: str = "") -> GraphSpec:
    """A random graph (:func:`generate`) whose tensors carry names from :data:`NAME_POOL`."""
    spec = generate(seed, max_elements=max_elements, prefix=prefix)
    rng = _rng("names", seed)
    spec.meta["names"] = {n.name: rng.choice(NAME_POOL) for n in spec.nodes}
    return spec


# --------------------------------------------------------------------------- constants


def generate_constants(seed: int, *, max_elements: int = 4096, prefix: str = "") -> GraphSpec:
    """A random graph whose sinks go through one to three ops with extreme constants."""
    spec = generate(seed, max_elements=max_elements, n_computes=_rng("c", seed).randint(1, 4))
    rng = _rng("constants", seed)
    nodes, outputs = list(spec.nodes), []
    for out in spec.outputs:
        cur = spec.node(out)
        for j in range(rng.randint(1, 3)):
            op = rng.choice(("mul", "add", "sub", "div", "maximum", "minimum"))
            const = rng.choice(EXTREME_CONSTANTS)
            if op == "div" and const in (0, 0.0):
                op = "mul"
            cur = Node(f"e{len(nodes)}_{j}", "binary", cur.shape, (cur.name,), op, const=const)
            nodes.append(cur)
        outputs.append(cur.name)
    new = spec.copy(nodes=nodes, outputs=outputs)
    return rename(new, prefix) if prefix else new


# --------------------------------------------------------------------------- shifts


def generate_shifts(seed: int, *, max_elements: int = 4096, prefix: str = "") -> GraphSpec:
    """A 2-D input read shifted along one dim: inside, guarded, or out of bounds (refused)."""
    rng = _rng("shifts", seed)
    rows, cols = rng.choice((1, 3, 8, 17, 33)), rng.choice((4, 7, 32, 65, 128))
    dims = {"a": rows, "b": cols}
    x = Node("x", "input", ("a", "b"), fill=rng.choice(FILLS), seed=rng.randrange(1 << 31))
    nodes, outputs, meta = [x], [], {}
    axis = rng.choice((0, 1))
    size = dims["ab"[axis]]
    c = rng.choice([v for v in (-3, -1, 1, 2, 5) if abs(v) < size] or [0])
    mode = rng.choices(("inside", "guard", "outside"), weights=(3, 3, 2))[0]
    if c == 0:
        mode = "inside"
    shape = list(x.shape)
    if mode == "inside":  # read ahead by |c|: the shape loses |c| along the axis
        c = abs(c)
        dims["s"] = size - c
        shape[axis] = "s"
    elif mode == "outside":
        meta["expect_error"] = "ExpressionError"
    node = Node(
        "h", "shift", tuple(shape), ("x",), "guard" if mode == "guard" else "", axes=(axis,),
        params=(c,),
    )  # fmt: skip
    nodes.append(node)
    tail = Node("t", "unary", node.shape, ("h",), rng.choice(("abs", "tanh", "neg")))
    nodes.append(tail)
    outputs.append("t")
    spec = GraphSpec(dims, nodes, outputs, seed, meta)
    return rename(spec, prefix) if prefix else spec


def _shift_read(spec: GraphSpec, n: Node, ts: dict[str, te.Tensor]) -> te.Tensor:
    """``x[..., i + c, ...]`` along ``axes[0]``; under "guard", zero where that leaves x."""
    src = ts[n.args[0]]
    (axis,), (c,) = n.axes, n.params

    def f(*i: Any) -> Any:
        at = i[axis] + c
        read = src[tuple(at if d == axis else v for d, v in enumerate(i))]
        if n.op != "guard":
            return read
        return te.where((at >= 0) & (at < src.shape[axis]), read, 0.0)

    return te.compute(spec.size(n.shape), f, name=_te_name(spec, n))


def _shift_source(spec: GraphSpec, n: Node) -> list[str]:
    src = spec.size(spec.node(n.args[0]).shape)
    (axis,), (c,) = n.axes, n.params
    idx = [f"i{d}" for d in range(len(src))]
    at = f"({idx[axis]} + {c})"
    read = f"{n.args[0]}[{', '.join(at if d == axis else v for d, v in enumerate(idx))}]"
    if n.op == "guard":
        read = f"te.where(({at} >= 0) & ({at} < {src[axis]}), {read}, 0.0)"
    lam = f"lambda {', '.join(idx)}: {read}"
    shape = spec.size(n.shape)
    return [f"{n.name} = te.compute({shape!r}, {lam}, name={_te_name(spec, n)!r})"]


# --------------------------------------------------------------------------- GEMM factors


def generate_factor_gemm(seed: int, *, max_elements: int = 4096, prefix: str = "") -> GraphSpec:
    """``a @ b`` with a 1-D factor indexed by i, j or k, and now and then a bias epilogue."""
    rng = _rng("factor", seed)
    m, k, n = (rng.choice(GEMM_DIMS) for _ in range(3))
    dims = {"m": m, "k": k, "n": n}
    on = rng.choice("ijk")
    s_dim = {"i": "m", "j": "n", "k": "k"}[on]

    def inp(name: str, shape: tuple[str, ...]) -> Node:
        return Node(name, "input", shape, fill=rng.choice(FILLS[:2]), seed=rng.randrange(1 << 31))

    nodes = [inp("a", ("m", "k")), inp("b", ("k", "n")), inp("s", (s_dim,))]
    nodes.append(Node("g", "fmatmul", ("m", "n"), ("a", "b", "s"), on))
    out = "g"
    if rng.random() < 0.5:
        nodes.append(inp("bias", ("n",)))
        nodes.append(Node("y", "binary", ("m", "n"), ("g", "bias"), "add"))
        out = "y"
    spec = GraphSpec(dims, nodes, [out], seed)
    return rename(spec, prefix) if prefix else spec


def _fmatmul(spec: GraphSpec, n: Node, ts: dict[str, te.Tensor]) -> te.Tensor:
    a, b, s = (ts[x] for x in n.args)
    k = te.reduce_axis(a.shape[1], name=f"{n.name}_k")

    def f(i: Any, j: Any) -> Any:
        factor = s[{"i": i, "j": j, "k": k}[n.op]]
        return te.sum(a[i, k] * b[k, j] * factor, axis=k)

    return te.compute(spec.size(n.shape), f, name=_te_name(spec, n))


def _fmatmul_source(spec: GraphSpec, n: Node) -> list[str]:
    a, b, s = n.args
    kk = spec.size(spec.node(a).shape)[1]
    sub = {"i": "i0", "j": "i1", "k": f"{n.name}_k"}[n.op]
    return [
        f'{n.name}_k = te.reduce_axis({kk}, name="{n.name}_k")',
        f"{n.name} = te.compute({spec.size(n.shape)!r}, lambda i0, i1: te.sum({a}[i0, "
        f"{n.name}_k] * {b}[{n.name}_k, i1] * {s}[{sub}], axis={n.name}_k), "
        f"name={_te_name(spec, n)!r})",
    ]


# --------------------------------------------------------------------------- branches


def generate_branches(seed: int, *, max_elements: int = 4096, prefix: str = "") -> GraphSpec:
    """Three to seven independent branches: row softmaxes of long rows (float4 row tiles in
    shared memory) and small GEMMs with a bias — what Layer 3 packs side by side."""
    rng = _rng("branches", seed)
    dims: dict[str, int] = {}
    nodes: list[Node] = []
    outputs: list[str] = []

    def dim(size: int) -> str:
        name = f"d{len(dims)}"
        dims[name] = size
        return name

    def inp(shape: tuple[str, ...]) -> Node:
        node = Node(f"x{len(nodes)}", "input", shape, fill="normal", seed=rng.randrange(1 << 31))
        nodes.append(node)
        return node

    def add(kind: str, shape: tuple[str, ...], args: tuple[str, ...], op: str, **kw: Any) -> Node:
        node = Node(f"{kind[0]}{len(nodes)}", kind, shape, args, op, **kw)
        nodes.append(node)
        return node

    for _ in range(rng.randint(3, 7)):
        if rng.random() < 0.6:  # softmax over long rows
            r, c = dim(rng.choice(ROWS)), dim(rng.choice(LONG))
            x = inp((r, c))
            mx = add("reduce", (r, ONE), (x.name,), "max", axes=(1,))
            d = add("binary", (r, c), (x.name, mx.name), "sub")
            e = add("unary", (r, c), (d.name,), "exp")
            s = add("reduce", (r, ONE), (e.name,), "sum", axes=(1,))
            outputs.append(add("binary", (r, c), (e.name, s.name), "div").name)
        else:  # a small GEMM + bias
            m, k, n = (dim(rng.choice((32, 48, 64))) for _ in range(3))
            a, b, bias = inp((m, k)), inp((k, n)), inp((n,))
            g = add("matmul", (m, n), (a.name, b.name), "")
            outputs.append(add("binary", (m, n), (g.name, bias.name), "add").name)
    spec = GraphSpec(dims, nodes, outputs, seed)
    return rename(spec, prefix) if prefix else spec


# --------------------------------------------------------------------------- names in te


def _te_name(spec: GraphSpec, n: Node) -> str:
    return spec.meta.get("names", {}).get(n.name, n.name)


FAMILIES["names"] = Family(1.0, generate_names, {}, {})
FAMILIES["constants"] = Family(0.7, generate_constants, {}, {})
FAMILIES["shifts"] = Family(0.6, generate_shifts, {"shift": _shift_read}, {"shift": _shift_source})
FAMILIES["factor_gemm"] = Family(
    0.6, generate_factor_gemm, {"fmatmul": _fmatmul}, {"fmatmul": _fmatmul_source}
)
FAMILIES["branches"] = Family(0.3, generate_branches, {}, {})
