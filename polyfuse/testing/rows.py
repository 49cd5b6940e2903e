"""Generator family ``rows``: stitched reductions over rows as long as the graph may hold.

A few rows of the longest length ``--max-elements`` allows (not always a multiple of 4) run
through a normalisation whose parts read the input again: layer norm (mean, centred
variance, scale and shift), softmax, RMS norm, or a centring whose output multiplies the
input. Stitched into one kernel, the later parts re-read the input from the L1, or, where a
row no longer fits beside the shared tiles (``--max-elements 100000``: rows of 33000–50000
floats on the default A100), from a shared tile its first reader staged
(:mod:`polyfuse.poly.stage`) — with the scratch tensors it displaced recomputed.
"""

from __future__ import annotations

import random

from .generate import FAMILIES, ONE, Family, GraphSpec, Node, rename

__all__ = ["generate_rows"]

PATTERNS = ("layernorm", "softmax", "rms", "centre")


def generate_rows(seed: int, *, max_elements: int = 4096, prefix: str = "") -> GraphSpec:
    """A normalisation of ``pattern`` over 2 or 3 rows of up to ``max_elements`` in all."""
    rng = random.Random(f"rows {seed}")
    r = rng.choice((2, 3))
    c = max(8, max_elements // r - rng.choice((0, 0, 1, 3, 5)))
    dims = {"d0": r, "d1": c}
    nodes: list[Node] = []

    def inp(shape: tuple[str, ...]) -> Node:
        node = Node(f"x{len(nodes)}", "input", shape, fill="normal", seed=rng.randrange(1 << 31))
        nodes.append(node)
        return node

    def add(kind: str, shape: tuple[str, ...], args: tuple[str, ...], op: str, **kw) -> Node:
        node = Node(f"{kind[0]}{len(nodes)}", kind, shape, args, op, **kw)
        nodes.append(node)
        return node

    row, col = ("d0", "d1"), ("d0", ONE)
    x = inp(row)
    pattern = rng.choice(PATTERNS)
    if pattern == "softmax":
        mx = add("reduce", col, (x.name,), "max", axes=(1,))
        e = add("unary", row, (add("binary", row, (x.name, mx.name), "sub").name,), "exp")
        s = add("reduce", col, (e.name,), "sum", axes=(1,))
        out = add("binary", row, (e.name, s.name), "div")
    elif pattern == "rms":
        ms = add("reduce", col, (x.name,), "mean", axes=(1,), pre="square")
        eps = add("binary", col, (ms.name,), "add", const=1e-5)
        out = add("binary", row, (x.name, add("unary", col, (eps.name,), "rsqrt").name), "mul")
    else:
        mu = add("reduce", col, (x.name,), "mean", axes=(1,))
        d = add("binary", row, (x.name, mu.name), "sub")
        if pattern == "centre":
            out = add("binary", row, (d.name, x.name), "mul")
        else:
            var = add("reduce", col, (d.name,), "mean", axes=(1,), pre="square")
            eps = add("binary", col, (var.name,), "add", const=1e-5)
            xn = add("binary", row, (d.name, add("unary", col, (eps.name,), "rsqrt").name), "mul")
            g = inp(("d1",))
            out = add("binary", row, (xn.name, g.name), "mul")
    spec = GraphSpec(dims, nodes, [out.name], seed, meta={"pattern": pattern})
    return rename(spec, prefix) if prefix else spec


FAMILIES["rows"] = Family(0.4, generate_rows, {}, {})
