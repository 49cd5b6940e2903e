"""Generator family "stencil": layer norm → pad → roll/concat chains, conv1d → pool chains.

The graphs of issue 19 items 9 and 10 (swin_t's LayerNorm → Pad → roll, torchaudio's M5:
Conv1d → ReLU → MaxPool1d) ran the isl scheduler for minutes; this family draws their kind:
shifted and wrapped-around reads (pad, slices, concats), strided windows and window reductions
over long rows. Nodes are built with :mod:`polyfuse.ops` as the ONNX importer builds them, so
one node may be several primitives (a layer norm is five, a roll three).

Node kinds (``Node.params`` holds their integers):

- ``layer_norm``: over the last dim of ``args[0]``, with ``args[1]``/``args[2]`` as gamma and
  beta when given;
- ``pad``: zeros around ``args[0]``; ``params`` = the padding before, per dim (the padding
  after is what the node's own dim adds beyond it);
- ``roll``: ``args[0]`` rolled by ``-params[0]`` along ``axes[0]`` (``torch.roll`` with a
  negative shift), as torch.onnx exports it: two slices and a concat;
- ``concat``: ``args`` joined along ``axes[0]``;
- ``conv1d``: ``args[0]`` (N, C, L) with weight ``args[1]`` (O, C, K) (and bias ``args[2]``),
  stride ``params[0]``;
- ``pool1d``: ``op`` "max" or "avg" over windows of ``params[0]`` along the last dim.

Each node is described once as the :mod:`polyfuse.ops` calls that make it (:func:`_calls`),
which the te builder runs and the script printer prints. A dim the shrinker made too small for
a node's integers makes the builder raise (the shrinker then drops that edit).
"""

from __future__ import annotations

import random
from typing import Any

from polyfuse import ops, te

from .generate import FAMILIES, FILLS, ONE, Family, GraphSpec, Node, rename

__all__ = ["KINDS", "Draft", "generate_stencil"]

KINDS = ("layer_norm", "pad", "roll", "concat", "conv1d", "pool1d")
SPATIAL = (2, 3, 4, 5, 7, 8, 9, 13, 16)  # rows and columns of the normalised maps
CHANNELS = (1, 2, 3, 5, 8, 13, 32, 33, 96)
LENGTHS = (17, 64, 100, 255, 256, 511, 800, 1031)  # conv1d signal lengths
KERNELS = (1, 2, 3, 5, 8, 16)
STRIDES = (1, 1, 2, 4, 16)


class Draft:
    """A spec being drawn by a family: its dims, its nodes, and the helpers that add them
    (the stencil chains below and :mod:`.conv` draw with it)."""

    def __init__(self, rng: random.Random, max_elements: int) -> None:
        self.rng = rng
        self.max_elements = max_elements
        self.dims: dict[str, int] = {}
        self.nodes: list[Node] = []

    def dim(self, size: int) -> str:
        name = f"s{len(self.dims)}"
        self.dims[name] = size
        return name

    def size(self, d: str) -> int:
        return 1 if d == ONE else self.dims[d]

    def add(self, prefix: str, kind: str, shape: tuple[str, ...], **kw: Any) -> Node:
        node = Node(f"{prefix}{len(self.nodes)}", kind, shape, **kw)
        self.nodes.append(node)
        return node

    def input(self, shape: tuple[str, ...]) -> Node:
        fill = self.rng.choices(FILLS, weights=(6, 2, 1))[0]
        return self.add("x", "input", shape, fill=fill, seed=self.rng.randrange(1 << 31))



class _Chain(Draft):
    """The stencil family's two chains."""

    # ---- layer norm -> pad -> roll / concat
    def norm_chain(self) -> list[str]:
        rng = self.rng
        h, w = rng.choice(SPATIAL), rng.choice(SPATIAL)
        fits = [c for c in CHANNELS if 4 * (h + 5) * (w + 5) * c <= 4 * self.max_elements]
        c = rng.choice(fits or [1])
        lead = (ONE,) if rng.random() < 0.5 else ()  # swin's batch of one
        shape = (*lead, self.dim(h), self.dim(w), self.dim(c))
        src = self.input(shape)
        if rng.random() < 0.4:  # a residual add before the norm
            other = self.input(shape)
            src = self.add("b", "binary", shape, args=(src.name, other.name), op="add")
        args = [src.name]
        if rng.random() < 0.5:
            args += [self.input(shape[-1:]).name, self.input(shape[-1:]).name]
        ln = self.add("n", "layer_norm", shape, args=tuple(args))
        spatial = [len(shape) - 3, len(shape) - 2]
        before, out = [], []
        for d, name in enumerate(shape):
            lo = hi = 0
            if d in spatial and rng.random() < 0.8:
                lo, hi = rng.choice((0, 0, 1, 2)), rng.choice((0, 1, 2, 3, 5))
            before.append(lo)
            out.append(self.dim(self.size(name) + lo + hi) if lo + hi else name)
        if out == list(shape):  # pad something
            out[spatial[1]] = self.dim(self.size(shape[spatial[1]]) + 1)
        cur = pad = self.add("p", "pad", tuple(out), args=(ln.name,), params=tuple(before))
        for axis in rng.sample(spatial, rng.choice((1, 2))):
            n = self.size(cur.shape[axis])
            shift = rng.randint(1, max(1, n - 1))
            cur = self.add("r", "roll", cur.shape, args=(cur.name,), axes=(axis,), params=(shift,))
        outputs = [cur.name]
        if rng.random() < 0.3:  # the rolled map beside the padded one, along the channels
            last = len(shape) - 1
            joined = (*cur.shape[:-1], self.dim(2 * self.size(cur.shape[-1])))
            cat = self.add("c", "concat", joined, args=(cur.name, pad.name), axes=(last,))
            outputs = [cat.name]
        if rng.random() < 0.2:
            outputs.append(ln.name)
        return outputs

    # ---- conv1d -> relu -> pool, once or twice
    def conv_chain(self) -> list[str]:
        rng = self.rng
        cin = rng.choice((1, 1, 2, 3))
        length = rng.choice([n for n in LENGTHS if n * cin <= self.max_elements] or [17])
        c_dim, l_dim = self.dim(cin), self.dim(length)
        cur = self.input((ONE, c_dim, l_dim))
        for _ in range(rng.choice((1, 1, 2))):
            n = self.size(cur.shape[2])
            k = rng.choice([k for k in KERNELS if k <= n])
            stride = rng.choice(STRIDES)
            lo = (n - k) // stride + 1
            o = rng.choice([o for o in (1, 2, 4, 8, 16, 32) if o * lo <= self.max_elements] or [1])
            o_dim = self.dim(o)
            wt = self.input((o_dim, cur.shape[1], self.dim(k)))
            args = [cur.name, wt.name]
            if rng.random() < 0.6:
                args.append(self.input((o_dim,)).name)
            shape = (ONE, o_dim, self.dim(lo))
            cur = self.add("v", "conv1d", shape, args=tuple(args), params=(stride,))
            if rng.random() < 0.7:
                cur = self.add("b", "binary", shape, args=(cur.name,), op="maximum", const=0.0)
            if lo >= 2:
                kp = rng.choice([k for k in (2, 3, 4) if k <= lo])
                op = "max" if rng.random() < 0.7 else "avg"
                shape = (ONE, o_dim, self.dim(lo // kp))
                cur = self.add("q", "pool1d", shape, args=(cur.name,), op=op, params=(kp,))
        return [cur.name]


def generate_stencil(seed: int, *, max_elements: int = 4096, prefix: str = "") -> GraphSpec:
    """A norm → pad → roll/concat chain or a conv1d → pool chain: a pure function of ``seed``."""
    rng = random.Random(f"stencil {seed}")
    chain = _Chain(rng, max_elements)
    outputs = chain.norm_chain() if rng.random() < 0.5 else chain.conv_chain()
    spec = GraphSpec(chain.dims, chain.nodes, outputs, seed)
    return rename(spec, prefix) if prefix else spec


# --------------------------------------------------------------------------- node -> ops calls

#: One ops call: (result name, ops function, tensor arguments by name, keyword arguments).
Call = tuple[str, str, tuple[str, ...], dict[str, Any]]


def _calls(spec: GraphSpec, n: Node) -> list[Call]:
    """The :mod:`polyfuse.ops` calls that build node ``n`` (the last one's result is ``n``)."""
    sizes = [spec.size(spec.node(a).shape) for a in n.args]
    out = spec.size(n.shape)
    if n.kind == "layer_norm":
        return [(n.name, "layer_norm", n.args, {"name": n.name})]
    if n.kind == "pad":
        pads = [(b, o - i - b) for b, o, i in zip(n.params, out, sizes[0], strict=True)]
        if any(a < 0 for _, a in pads):
            raise ValueError(f"pad {n.name}: dims {out} smaller than {sizes[0]} + {n.params}")
        return [(n.name, "pad", n.args, {"pads": pads, "name": n.name})]
    if n.kind == "roll":
        (axis,), size = n.axes, sizes[0][n.axes[0]]
        shift = n.params[0] % size if size > 1 else 0
        if shift == 0:
            return [(n.name, "concat", n.args, {"axis": axis, "name": n.name})]
        hi, lo = f"{n.name}_hi", f"{n.name}_lo"
        return [
            (hi, "slice", n.args, {"starts": [shift], "ends": [size], "axes": [axis], "name": hi}),
            (lo, "slice", n.args, {"starts": [0], "ends": [shift], "axes": [axis], "name": lo}),
            (n.name, "concat", (hi, lo), {"axis": axis, "name": n.name}),
        ]
    if n.kind == "concat":
        return [(n.name, "concat", n.args, {"axis": n.axes[0], "name": n.name})]
    if n.kind == "conv1d":
        want = (sizes[0][2] - sizes[1][2]) // n.params[0] + 1
        if want != out[2]:
            raise ValueError(f"conv1d {n.name}: output length {out[2]}, the window gives {want}")
        return [(n.name, "conv", n.args, {"stride": n.params[0], "name": n.name})]
    if n.kind == "pool1d":
        k = n.params[0]
        if sizes[0][2] // k != out[2]:
            raise ValueError(f"pool1d {n.name}: output length {out[2]}, windows of {k} give less")
        fn = "max_pool2d" if n.op == "max" else "avg_pool2d"
        return [(n.name, fn, n.args, {"kernel": (1, k), "name": n.name})]
    raise ValueError(f"unknown node kind {n.kind}")


def _build(spec: GraphSpec, n: Node, ts: dict[str, te.Tensor]) -> te.Tensor:
    local = dict(ts)
    for res, fn, args, kw in _calls(spec, n):
        tensors = [local[a] for a in args]
        if fn == "concat":
            local[res] = ops.concat(tensors, **kw)
        else:
            local[res] = getattr(ops, fn)(*tensors, **kw)
    got = local[n.name]
    if got.shape != spec.size(n.shape):
        raise ValueError(f"{n.kind} {n.name}: shape {got.shape}, the spec says {n.shape}")
    return got


def _source(spec: GraphSpec, n: Node) -> list[str]:
    lines = []
    for res, fn, args, kw in _calls(spec, n):
        first = f"[{', '.join(args)}]" if fn == "concat" else ", ".join(args)
        rest = ", ".join(f"{k}={v!r}" for k, v in kw.items())
        lines.append(f"{res} = ops.{fn}({first}, {rest})")
    return lines


FAMILIES["stencil"] = Family(
    1.0, generate_stencil, dict.fromkeys(KINDS, _build), dict.fromkeys(KINDS, _source)
)
