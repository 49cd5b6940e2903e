"""Generator family "conv": 2-D convolutions of every shape the GEMM path tiles.

A convolution is the GEMM path's hardest client: its input reads are shifted windows behind
a padding select, its shared tiles are boxes of those windows (folded, merged, aligned), and
its update may drop the select where isl proves the tile's zeros make it redundant. Fuzz seed
4051 of ``polyfuse fuzz --torch`` found that proof vacuous on an input of one row; this family
draws such shapes on purpose: images of 1 to 13 rows and columns (1 included), 1 to 9
channels, kernels of 1 to 3 (non-square too), strides and dilations of 1 or 2, padding 0 to
2 per side, groups (depthwise too), an optional bias, ReLU and a second convolution.

Node kind ``conv2d`` (:class:`Node`): ``args`` = input (N, C, H, W), weight (O, C/groups,
KH, KW) and optionally a bias (O,); ``params`` = (stride_h, stride_w, pad_h, pad_w, dil_h,
dil_w, groups). The builder raises where the shrinker made a dim inconsistent with them.
"""

from __future__ import annotations

import random

from polyfuse import ops, te

from .generate import FAMILIES, ONE, Family, GraphSpec, Node, rename
from .stencil import Draft

__all__ = ["generate_conv"]

SPATIAL = (1, 1, 2, 3, 4, 5, 7, 8, 13)
CHANNELS = (1, 2, 3, 4, 6, 8, 9)


def _out(n: int, k: int, stride: int, pad: int, dil: int) -> int:
    return (n + 2 * pad - dil * (k - 1) - 1) // stride + 1


class _Convs(Draft):
    """The spec being drawn; a dim of size 1 is the broadcast dim ``ONE`` half the time."""

    def dim(self, size: int) -> str:
        if size == 1 and self.rng.random() < 0.5:
            return ONE
        return super().dim(size)

    def conv(self, src: Node) -> Node | None:
        """A convolution of ``src`` (N, C, H, W) with drawn parameters, or None where none
        fits ``max_elements``."""
        rng = self.rng
        n, c, h, w = (self.size(d) for d in src.shape)
        groups = rng.choice([g for g in (1, 1, 1, 2, 3, c) if c % g == 0])
        kh, kw = rng.choice((1, 2, 3)), rng.choice((1, 2, 3))
        sh, sw = rng.choice((1, 1, 2)), rng.choice((1, 1, 2))
        dh, dw = rng.choice((1, 1, 2)), rng.choice((1, 1, 2))
        ph, pw = rng.choice((0, 1, 1, 2)), rng.choice((0, 1, 1, 2))
        oh, ow = _out(h, kh, sh, ph, dh), _out(w, kw, sw, pw, dw)
        if oh < 1 or ow < 1:
            return None
        outs = [o for o in CHANNELS if o % groups == 0 and n * o * oh * ow <= self.max_elements]
        if not outs:
            return None
        o = self.dim(rng.choice(outs))
        wt = self.input((o, self.dim(c // groups), self.dim(kh), self.dim(kw)))
        args = [src.name, wt.name]
        if rng.random() < 0.5:
            args.append(self.input((o,)).name)
        shape = (src.shape[0], o, self.dim(oh), self.dim(ow))
        params = (sh, sw, ph, pw, dh, dw, groups)
        return self.add("v", "conv2d", shape, args=tuple(args), params=params)


def generate_conv(seed: int, *, max_elements: int = 4096, prefix: str = "") -> GraphSpec:
    """One or two convolutions (a ReLU maybe between and after): a pure function of ``seed``."""
    rng = random.Random(f"conv {seed}")
    g = _Convs(rng, max_elements)
    for _ in range(20):  # draw until one fits
        n, c = rng.choice((1, 1, 2)), rng.choice(CHANNELS)
        h, w = rng.choice(SPATIAL), rng.choice(SPATIAL)
        if n * c * h * w > max_elements:
            continue
        g.dims.clear()
        g.nodes.clear()
        src = g.input((g.dim(n), g.dim(c), g.dim(h), g.dim(w)))
        cur = g.conv(src)
        if cur is not None:
            break
    else:
        raise ValueError(f"conv family: no convolution fits {max_elements} elements")
    for _ in range(rng.choice((0, 1, 1))):
        if rng.random() < 0.6:
            cur = g.add("b", "binary", cur.shape, args=(cur.name,), op="maximum", const=0.0)
        nxt = g.conv(cur)
        if nxt is None:
            break
        cur = nxt
    spec = GraphSpec(g.dims, g.nodes, [cur.name], seed)
    return rename(spec, prefix) if prefix else spec


def _kwargs(spec: GraphSpec, n: Node) -> dict:
    """``ops.conv2d``'s keyword arguments for node ``n``, checked against the shapes."""
    sh, sw, ph, pw, dh, dw, groups = n.params
    (_, c, h, w), (o, cg, kh, kw) = (spec.size(spec.node(a).shape) for a in n.args[:2])
    out = spec.size(n.shape)
    want = (out[0], o, _out(h, kh, sh, ph, dh), _out(w, kw, sw, pw, dw))
    if cg * groups != c or o % groups or want[2] < 1 or want[3] < 1 or tuple(out) != want:
        raise ValueError(f"conv2d {n.name}: shape {out} does not follow from its operands")
    return {"stride": (sh, sw), "padding": (ph, pw), "dilation": (dh, dw), "groups": groups,
            "name": n.name}  # fmt: skip


def _build(spec: GraphSpec, n: Node, ts: dict[str, te.Tensor]) -> te.Tensor:
    return ops.conv2d(*(ts[a] for a in n.args), **_kwargs(spec, n))


def _source(spec: GraphSpec, n: Node) -> list[str]:
    kw = ", ".join(f"{k}={v!r}" for k, v in _kwargs(spec, n).items())
    return [f"{n.name} = ops.conv2d({', '.join(n.args)}, {kw})"]


FAMILIES["conv"] = Family(1.0, generate_conv, {"conv2d": _build}, {"conv2d": _source})
