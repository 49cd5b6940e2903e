"""Random ONNX models for the importer (:mod:`polyfuse.onnx`): ``polyfuse fuzz --onnx``.

The te fuzzer (:mod:`.run`) checks the compiler; this one checks what the importer makes of
ONNX's operators and their attributes: axes (negative ones too), keepdims, pads, strides,
dilations, groups, ceil modes, coordinate transformations, slices with negative steps,
broadcasting, integer division and casts between the six ONNX dtypes the backend takes. The
ONNX conformance suite runs a few hand-picked attribute sets per operator; this draws them.

A model is drawn step by step against real values: each step is one node (or a short chain:
``Exp`` of a ``Clip``, a ``Conv`` of a ``Reshape``) with drawn attributes and constant inputs
(initializers), run with ONNX's own reference evaluator (``onnx.reference``) on the values so
far and kept only where the node is well typed (strict shape inference), runs, and gives a
finite, moderate result. The model outputs every step's value; :func:`check` runs it through
the ONNX backend (:mod:`polyfuse.onnx.backend`, the CPU emulator) and compares each output
with the reference evaluator's: same dtype and shape, integers and bools exactly, floats
within the tolerance of the coarsest float dtype the model holds
(:func:`polyfuse.graph.dtypes.tolerance`), relative to the output's magnitude. Each model is
Python source (``make_inputs()``, ``make_model()``), so a failure prints as a script.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .programs import SMALL_ELEMENTS, crash_detail, input_shape, pick_operands, run_programs

__all__ = [
    "OPSET",
    "STEPS",
    "OnnxOutcome",
    "OnnxProgram",
    "check",
    "draw",
    "fuzz_onnx",
    "reference_evaluator",
]

#: the opset drawn models import (Reduce* take axes as an input, Gelu exists)
OPSET = 20
#: dtypes a model draws its inputs from (of those named with ``--dtypes``)
INPUT_DTYPES = ("float32", "float16", "float64", "int32", "int64", "bool")
#: ... and the narrow integers, drawn on their own stream (so a seed drawn before they were
#: added draws the same model), each over its whole range
NARROW_INPUTS = {"uint8": (0, 256), "int8": (-128, 128), "int16": (-300, 300)}
#: largest magnitude a float value may have (float16 holds 65504; products of two stay finite)
LIMIT = 200.0


@dataclass
class N:
    """One node of a step: ``inputs`` name values, constants, or ``@k`` (the output of the
    step's k-th node); ``take`` is the output a multi-output node passes on."""

    op: str
    inputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    outputs: int = 1
    take: int = 0


class Draw:
    """What a step template draws with: operands ``a``, ``b`` (names), their values ``va``,
    ``vb``, the random source, and :meth:`const` for constant inputs."""

    def __init__(self, rng: random.Random, a: str, b: str, va: np.ndarray, vb: np.ndarray,
                 consts: dict[str, np.ndarray]) -> None:  # fmt: skip
        self.rng, self.a, self.b, self.va, self.vb = rng, a, b, va, vb
        self._consts = consts
        self.new: dict[str, np.ndarray] = {}

    @property
    def rank(self) -> int:
        return self.va.ndim

    def const(self, v: Any, dtype: Any = "int64") -> str:
        """A constant input (an initializer) holding ``v``."""
        name = f"c{len(self._consts) + len(self.new)}"
        self.new[name] = np.asarray(v, dtype=dtype)
        return name

    def like_a(self, v: Any) -> str:
        """A constant of ``a``'s dtype (of an unsigned one: at least 0, as numpy 2 refuses to
        wrap a negative value; seed 21262's Clip of a uint8 from -3)."""
        if self.va.dtype.kind == "u":
            v = np.maximum(v, 0)
        return self.const(v, self.va.dtype)

    def axis(self) -> int:
        """An axis of ``a``, negative half the time."""
        r = max(self.rank, 1)
        k = self.rng.randrange(r)
        return k - r if self.rng.random() < 0.5 else k

    def floats(self, shape: Sequence[int], dtype: Any = None) -> str:
        """A constant of random multiples of 0.25 in [-1.5, 1.5]."""
        v = np.array([self.rng.randint(-6, 6) / 4 for _ in range(int(np.prod(shape)))])
        return self.const(v.reshape(tuple(shape)), dtype or self.va.dtype)

    def choice(self, seq: Sequence[Any]) -> Any:
        return self.rng.choice(seq)


def _as_4d(s: Draw, channels: int = 1) -> list[N] | None:
    """A reshape of ``a`` to (1, channels, H, W), W its last dim (None where its elements
    do not divide so)."""
    last = s.va.shape[-1] if s.rank else 1
    if s.va.size % (channels * last):
        return None
    return [N("Reshape", [s.a, s.const([1, channels, -1, last])])]


def _unary(op: str, **attrs: Callable[[Draw], Any]) -> Callable[[Draw], list[N]]:
    return lambda s: [N(op, [s.a], {k: f(s) for k, f in attrs.items()})]


def _positive(op: str) -> Callable[[Draw], list[N]]:
    """``op(|a| + 1)``: a domain of positive values (Log, Sqrt, Reciprocal)."""
    return lambda s: [N("Abs", [s.a]), N("Add", ["@0", s.like_a(1)]), N(op, ["@1"])]


def _clipped(op: str, bound: float) -> Callable[[Draw], list[N]]:
    """``op(clip(a, -bound, bound))``: inside the domain (Asin), away from a pole (Tan) or
    from overflow (Sinh)."""
    return lambda s: [N("Clip", [s.a, s.like_a(-bound), s.like_a(bound)]), N(op, ["@0"])]


def _reduce(op: str) -> Callable[[Draw], list[N] | None]:
    def step(s: Draw) -> list[N] | None:
        if not s.rank:
            return None
        axes = sorted({s.axis() for _ in range(s.rng.randint(0, 2))})
        attrs = {"keepdims": s.choice((0, 1))}
        if not axes:
            attrs["noop_with_empty_axes"] = s.choice((0, 1))
        x = s.a
        pre: list[N] = []
        if op == "ReduceLogSum":  # positive operands
            pre = [N("Abs", [s.a]), N("Clip", ["@0", s.like_a(0.5), s.like_a(2)])]
            x = "@1"
        ins = [x, s.const(axes)] if axes else [x]
        return [*pre, N(op, ins, attrs)]

    return step


def _divisor(s: Draw) -> list[N]:
    """``|b| + 1``: a divisor that is never 0."""
    return [N("Abs", [s.b]), N("Add", ["@0", s.const(1, s.vb.dtype)])]


def _slice(s: Draw) -> list[N] | None:
    if not s.rank:
        return None
    axes = sorted({s.axis() % s.rank for _ in range(s.rng.randint(1, 2))})
    starts, ends, steps = [], [], []
    for ax in axes:
        n = s.va.shape[ax]
        step = s.choice((1, 1, 2, -1, -2))
        lo, hi = s.rng.randint(-n - 1, n + 1), s.rng.randint(-n - 1, n + 1)
        if step < 0:
            lo, hi = max(lo, hi), min(lo, hi)
        starts.append(lo if s.rng.random() < 0.8 else (-(2**62) if step < 0 else 0))
        ends.append(hi if s.rng.random() < 0.8 else (-(2**62) if step < 0 else 2**62))
        steps.append(step)
    ins = [s.a, s.const(starts), s.const(ends), s.const([a - s.rank if s.rng.random() < 0.3
                                                          else a for a in axes])]  # fmt: skip
    if steps != [1] * len(steps) or s.rng.random() < 0.5:
        ins.append(s.const(steps))
    return [N("Slice", ins)]


def _gather(s: Draw) -> list[N] | None:
    if not s.rank:
        return None
    ax = s.axis()
    n = s.va.shape[ax]
    shape = s.choice(((), (3,), (2, 2)))
    idx = np.array([s.rng.randint(-n, n - 1) for _ in range(int(np.prod(shape)))])
    return [N("Gather", [s.a, s.const(idx.reshape(shape), s.choice(("int64", "int32")))],
              {"axis": ax})]  # fmt: skip


def _gather_nd(s: Draw) -> list[N] | None:
    if not s.rank:
        return None
    m = s.rng.randint(1, s.rank)
    rows = [[s.rng.randint(-d, d - 1) for d in s.va.shape[:m]] for _ in range(s.rng.randint(1, 3))]
    return [N("GatherND", [s.a, s.const(rows)])]


def _scatter_elements(s: Draw) -> list[N] | None:
    """ScatterElements of a few updates (duplicates too) along an axis, with a reduction."""
    if not s.rank:
        return None
    ax = s.axis()
    n = s.va.shape[ax]
    shape = [s.rng.randint(1, 3) if d == ax % s.rank else min(v, s.rng.randint(1, 3))
             for d, v in enumerate(s.va.shape)]  # fmt: skip
    idx = np.array([s.rng.randint(-n, n - 1) for _ in range(int(np.prod(shape)))])
    red = s.choice(("none", "add", "mul", "max", "min"))
    return [N("ScatterElements", [s.a, s.const(idx.reshape(shape)), s.floats(shape)],
              {"axis": ax, "reduction": red})]  # fmt: skip


def _scatter_nd(s: Draw) -> list[N] | None:
    """ScatterND of one to three rows (duplicates too) of a small trailing block."""
    if not s.rank:
        return None
    m = s.rng.randint(1, s.rank)
    if int(np.prod(s.va.shape[m:])) > 64:
        return None
    rows = [[s.rng.randint(-d, d - 1) for d in s.va.shape[:m]] for _ in range(s.rng.randint(1, 3))]
    red = s.choice(("none", "add", "mul", "max", "min"))
    upd = s.floats((len(rows), *s.va.shape[m:]))
    return [N("ScatterND", [s.a, s.const(rows), upd], {"reduction": red})]


def _split(s: Draw) -> list[N] | None:
    if not s.rank:
        return None
    ax = s.axis()
    n = s.va.shape[ax]
    if n < 2:
        return None
    cut = s.rng.randint(1, n - 1)
    if s.rng.random() < 0.5:
        return [N("Split", [s.a, s.const([cut, n - cut])], {"axis": ax}, 2, s.rng.randint(0, 1))]
    k = s.rng.randint(2, min(n, 3))
    return [N("Split", [s.a], {"axis": ax, "num_outputs": k}, k, s.rng.randrange(k))]


def _pad(s: Draw) -> list[N] | None:
    if not s.rank:
        return None
    mode = s.choice(("constant", "constant", "reflect", "edge"))
    top = [(d - 1 if mode == "reflect" else 2) for d in s.va.shape]
    pads = [s.rng.randint(-1 if mode == "constant" else 0, max(t, 0)) for t in top]
    pads += [s.rng.randint(0, max(t, 0)) for t in top]
    ins = [s.a, s.const(pads)]
    if mode == "constant" and s.rng.random() < 0.5:
        ins.append(s.like_a(s.choice((0, 1, -2))))
    return [N("Pad", ins, {"mode": mode})]


def _reshape(s: Draw) -> list[N] | None:
    shape = list(s.va.shape)
    options = [[-1], [*shape[::-1]], [0, -1] if shape else [-1], [1, *shape, 1]]
    if len(shape) >= 2:
        options.append([shape[0] * shape[1], *shape[2:]])
    return [N("Reshape", [s.a, s.const(s.choice(options))])]


def _transpose(s: Draw) -> list[N] | None:
    perm = list(range(s.rank))
    s.rng.shuffle(perm)
    return [N("Transpose", [s.a], {"perm": perm} if s.rng.random() < 0.8 else {})]


def _unsqueeze(s: Draw) -> list[N]:
    r = s.rank + 1
    ax = s.rng.randrange(r)
    return [N("Unsqueeze", [s.a, s.const([ax - r if s.rng.random() < 0.5 else ax])])]


def _squeeze(s: Draw) -> list[N] | None:
    ones = [k for k, d in enumerate(s.va.shape) if d == 1]
    if not ones:
        return None
    if s.rng.random() < 0.3:
        return [N("Squeeze", [s.a])]
    return [N("Squeeze", [s.a, s.const([s.choice(ones)])])]


def _concat(s: Draw) -> list[N] | None:
    if not s.rank:
        return None
    other = s.b if s.vb.shape == s.va.shape and s.vb.dtype == s.va.dtype else s.a
    return [N("Concat", [s.a, other, s.a][: s.rng.randint(2, 3)], {"axis": s.axis()})]


def _expand(s: Draw) -> list[N]:
    shape = [2, *[d if s.rng.random() < 0.7 else 1 for d in s.va.shape]]
    if s.va.shape and s.va.shape[-1] == 1:
        shape[-1] = 3
    return [N("Expand", [s.a, s.const(shape)])]


def _tile(s: Draw) -> list[N] | None:
    if not s.rank:
        return None
    return [N("Tile", [s.a, s.const([s.choice((1, 2)) for _ in s.va.shape])])]


def _cumsum(s: Draw) -> list[N] | None:
    if not s.rank:
        return None
    attrs = {"exclusive": s.choice((0, 1)), "reverse": s.choice((0, 1))}
    return [N("CumSum", [s.a, s.const(s.axis(), s.choice(("int64", "int32")))], attrs)]


def _topk(s: Draw) -> list[N] | None:
    if not s.rank:
        return None
    ax = s.axis()
    k = s.rng.randint(1, s.va.shape[ax])
    attrs = {"axis": ax, "largest": s.choice((0, 1))}
    return [N("TopK", [s.a, s.const([k])], attrs, 2, s.choice((0, 1)))]


def _arg(op: str) -> Callable[[Draw], list[N] | None]:
    def step(s: Draw) -> list[N] | None:
        if not s.rank:
            return None
        attrs = {"axis": s.axis(), "keepdims": s.choice((0, 1)),
                 "select_last_index": s.choice((0, 1))}  # fmt: skip
        return [N(op, [s.a], attrs)]

    return step


def _layer_norm(s: Draw) -> list[N] | None:
    if not s.rank:
        return None
    ax = s.axis()
    shape = s.va.shape[ax:]
    ins = [s.a, s.floats(shape)]
    if s.rng.random() < 0.5:
        ins.append(s.floats(shape))
    return [N("LayerNormalization", ins, {"axis": ax, "epsilon": s.choice((1e-5, 0.1))})]


def _channel_params(s: Draw, c: int, k: int) -> list[str]:
    return [s.floats((c,)) for _ in range(k)]


def _batch_norm(s: Draw) -> list[N] | None:
    if s.rank < 2:
        return None
    c = s.va.shape[1]
    var = s.const(np.array([s.rng.randint(1, 8) / 4 for _ in range(c)]), s.va.dtype)
    return [N("BatchNormalization", [s.a, *_channel_params(s, c, 3), var],
              {"epsilon": s.choice((1e-5, 0.01))})]  # fmt: skip


def _instance_norm(s: Draw) -> list[N] | None:
    if s.rank < 3:
        return None
    return [N("InstanceNormalization", [s.a, *_channel_params(s, s.va.shape[1], 2)])]


def _matmul(s: Draw) -> list[N] | None:
    if s.rank == 0:
        return None
    if s.vb.dtype == s.va.dtype and s.rng.random() < 0.5:
        return [N("MatMul", [s.a, s.b])]  # kept where the shapes multiply
    perm = list(range(s.rank))
    if s.rank >= 2:
        perm[-1], perm[-2] = perm[-2], perm[-1]
    return [N("Transpose", [s.a], {"perm": perm}), N("MatMul", [s.a, "@0"])]


def _gemm(s: Draw) -> list[N] | None:
    if s.rank != 2:
        return None
    ta, tb = s.choice((0, 1)), s.choice((0, 1))
    m, k = s.va.shape[::-1] if ta else s.va.shape
    n = s.rng.randint(1, 6)
    ins = [s.a, s.floats((n, k) if tb else (k, n))]
    if s.rng.random() < 0.7:
        ins.append(s.floats(s.choice(((n,), (m, n), (1,), (m, 1)))))
    attrs: dict[str, Any] = {"transA": ta, "transB": tb}
    if s.rng.random() < 0.5:
        attrs |= {"alpha": s.choice((0.5, 2.0)), "beta": s.choice((0.0, 0.5, 1.5))}
    return [N("Gemm", ins, attrs)]


def _window(s: Draw, h: int, w: int) -> dict[str, Any]:
    """Kernel, strides, dilations and pads of a 2-D window over an (h, w) image."""
    kh, kw = s.rng.randint(1, min(3, h + 2)), s.rng.randint(1, min(3, w + 2))
    attrs: dict[str, Any] = {"strides": [s.choice((1, 2)), s.choice((1, 2))]}
    if s.rng.random() < 0.3:
        attrs["dilations"] = [s.choice((1, 2)), s.choice((1, 2))]
    if s.rng.random() < 0.2:
        attrs["auto_pad"] = s.choice(("SAME_UPPER", "SAME_LOWER", "VALID"))
    else:
        attrs["pads"] = [s.rng.randint(0, k - 1) for k in (kh, kw, kh, kw)]
    attrs["kernel_shape"] = [kh, kw]
    return attrs


def _conv(s: Draw) -> list[N] | None:
    four = s.rank == 4
    c = s.va.shape[1] if four else s.choice((1, 2))
    pre = [] if four else _as_4d(s, c)
    if pre is None:
        return None
    h, w = (s.va.shape[2:] if four else (s.va.size // (c * s.va.shape[-1]), s.va.shape[-1]))
    attrs = _window(s, h, w)
    groups = s.choice([g for g in (1, 2, c) if c % g == 0])
    m = groups * s.choice((1, 2))
    kh, kw = attrs["kernel_shape"]
    if s.rng.random() < 0.5:
        del attrs["kernel_shape"]  # inferred from the weights
    ins = [s.a if four else "@0", s.floats((m, c // groups, kh, kw))]
    if s.rng.random() < 0.5:
        ins.append(s.floats((m,)))
    return [*pre, N("Conv", ins, {**attrs, "group": groups})]


def _conv_transpose(s: Draw) -> list[N] | None:
    c = s.choice((1, 2))
    pre = _as_4d(s, c)
    if pre is None:
        return None
    kh, kw = s.rng.randint(1, 3), s.rng.randint(1, 3)
    st = [s.choice((1, 2)), s.choice((1, 2))]
    attrs: dict[str, Any] = {"strides": st, "pads": [s.rng.randint(0, k - 1) for k in
                                                     (kh, kw, kh, kw)]}  # fmt: skip
    if s.rng.random() < 0.3:
        attrs["output_padding"] = [s.rng.randint(0, x - 1) for x in st]
    if s.rng.random() < 0.3:
        attrs["dilations"] = [s.choice((1, 2)), s.choice((1, 2))]
    groups = s.choice((1, c))
    w = s.floats((c, s.choice((1, 2)), kh, kw))
    return [*pre, N("ConvTranspose", ["@0", w], {**attrs, "group": groups})]


def _pool(op: str) -> Callable[[Draw], list[N] | None]:
    def step(s: Draw) -> list[N] | None:
        four = s.rank == 4
        pre = [] if four else _as_4d(s)
        if pre is None:
            return None
        h, w = (s.va.shape[2:] if four else (s.va.size // s.va.shape[-1], s.va.shape[-1]))
        attrs = _window(s, h, w)
        if op == "AveragePool":
            attrs.pop("dilations", None)
            attrs["count_include_pad"] = s.choice((0, 1))
        if s.rng.random() < 0.3:
            attrs["ceil_mode"] = 1
        if any(_padding_window(n, axis, attrs) for axis, n in enumerate((h, w))):
            return None  # its value is not defined (the reference gives 0, polyfuse -inf)
        if any(_negative_same_pad(n, axis, attrs) for axis, n in enumerate((h, w))):
            return None  # the reference shifts such windows (onnx 1.23; fuzz seed 4164)
        return [*pre, N(op, [s.a if four else "@0"], attrs)]

    return step


def _negative_same_pad(n: int, axis: int, attrs: dict[str, Any]) -> bool:
    """Whether ``auto_pad`` SAME along ``axis`` pads by less than nothing (a stride beyond
    the kernel: ``(out - 1) * stride + span < n``). No padding is right; the reference
    evaluator pads by the negative amount and shifts the windows by one."""
    if not attrs.get("auto_pad", "NOTSET").startswith("SAME"):
        return False
    k, st = attrs["kernel_shape"][axis], attrs["strides"][axis]
    span = (k - 1) * attrs.get("dilations", [1, 1])[axis] + 1
    return (-(-n // st) - 1) * st + span < n


def _padding_window(n: int, axis: int, attrs: dict[str, Any]) -> bool:
    """Whether a pool window along ``axis`` (extent ``n``) lies wholly in the padding (or
    between the taps of a dilated kernel), by ONNX's output-size rules."""
    k, st = attrs["kernel_shape"][axis], attrs["strides"][axis]
    d = attrs.get("dilations", [1, 1])[axis]
    span = (k - 1) * d + 1
    auto = attrs.get("auto_pad", "NOTSET")
    if auto.startswith("SAME"):
        out = -(-n // st)
        total = max(0, (out - 1) * st + span - n)
        lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
    elif auto == "VALID":
        out, lo = -(-(n - span + 1) // st), 0
    else:
        lo, hi = attrs["pads"][axis], attrs["pads"][axis + 2]
        room = n + lo + hi - span
        out = (-(-room // st) if attrs.get("ceil_mode") else room // st) + 1
        if attrs.get("ceil_mode") and (out - 1) * st >= n + lo:
            out -= 1  # a last window starting in the right padding is dropped
    return any(all(not 0 <= o * st + j * d - lo < n for j in range(k)) for o in range(out))


def _global_pool(op: str) -> Callable[[Draw], list[N] | None]:
    return lambda s: [N(op, [s.a])] if s.rank >= 3 else None


def _resize(s: Draw) -> list[N] | None:
    four = s.rank == 4
    pre = [] if four else _as_4d(s)
    if pre is None:
        return None
    mode = s.choice(("nearest", "linear", "cubic"))
    ctm = s.choice(("half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
                    "half_pixel_symmetric"))  # fmt: skip
    attrs: dict[str, Any] = {"mode": mode, "coordinate_transformation_mode": ctm}
    if mode == "nearest":
        attrs["nearest_mode"] = s.choice(("round_prefer_floor", "round_prefer_ceil", "floor",
                                          "ceil"))  # fmt: skip
    x = s.a if four else "@0"
    if s.rng.random() < 0.5:
        scales = [1.0, 1.0, s.choice((0.5, 1.0, 1.5, 2.0)), s.choice((0.5, 2.0, 3.0))]
        return [*pre, N("Resize", [x, "", s.const(scales, "float32")], attrs)]
    h, w = s.va.shape[2:] if four else (s.va.size // s.va.shape[-1], s.va.shape[-1])
    sizes = [1 if not four else s.va.shape[0], 1 if not four else s.va.shape[1],
             s.rng.randint(1, 2 * h + 1), s.rng.randint(1, 2 * w + 1)]  # fmt: skip
    return [*pre, N("Resize", [x, "", "", s.const(sizes)], attrs)]


def _depth_to_space(s: Draw) -> list[N] | None:
    pre = _as_4d(s, 4)
    if pre is None:
        return None
    return [*pre, N("DepthToSpace", ["@0"], {"blocksize": 2, "mode": s.choice(("DCR", "CRD"))})]


def _space_to_depth(s: Draw) -> list[N] | None:
    if s.va.size % 4:
        return None
    return [N("Reshape", [s.a, s.const([1, -1, 2, 2])]),
            N("SpaceToDepth", ["@0"], {"blocksize": 2})]  # fmt: skip


def _einsum(s: Draw) -> list[N] | None:
    eq = {1: ("i->", "i,i->i", "i->i"), 2: ("ij->ji", "ij->i", "ij,ij->j", "ij,kj->ik"),
          3: ("bij->bji", "bij,bkj->bik", "bij->j")}.get(s.rank)  # fmt: skip
    if eq is None:
        return None
    e = s.choice(eq)
    return [N("Einsum", [s.a, s.a] if "," in e else [s.a], {"equation": e})]


def _one_hot(s: Draw) -> list[N]:
    depth = s.rng.randint(2, 25)
    vals = s.const([s.choice((0, -1)), s.choice((1, 3))], s.choice(("float32", "int64")))
    return [N("OneHot", [s.a, s.const(depth), vals], {"axis": s.rng.randint(-1, s.rank)})]


def _exponent(s: Draw) -> str:
    """A float exponent of ``a``'s dtype, or an int64 one (Pow's two type constraints)."""
    return s.like_a(1.5) if s.rng.random() < 0.5 else s.const(2)


def _where(s: Draw) -> list[N]:
    return [N("Greater", [s.a, s.like_a(0)]), N("Where", ["@0", s.a, s.b])]


def _cast(s: Draw) -> list[N]:
    from onnx import TensorProto

    to = s.choice(("FLOAT", "FLOAT16", "DOUBLE", "INT32", "INT64", "BOOL", "INT8", "UINT8"))
    return [N("Cast", [s.a], {"to": int(getattr(TensorProto, to))})]


def _clip(s: Draw) -> list[N]:
    lo, hi = s.choice((-3, -1, 0)), s.choice((1, 5))
    ins = [s.a, s.like_a(lo) if s.rng.random() < 0.8 else ""]
    if s.rng.random() < 0.8:
        ins.append(s.like_a(hi))
    return [N("Clip", ins)]


def _mod(s: Draw) -> list[N]:
    fmod = 1 if s.va.dtype.kind == "f" else s.choice((0, 1))
    return [*_divisor(s), N("Mod", [s.a, "@1"], {"fmod": fmod})]


def _quantize_dequantize(s: Draw) -> list[N] | None:
    """QuantizeLinear to uint8/int8/int16 (per tensor, or per axis) and back."""
    if s.va.dtype not in (np.float32, np.float16):
        return None
    to = s.choice(("uint8", "int8", "int16"))
    per_axis = s.rank and s.rng.random() < 0.5
    ax = s.axis() if per_axis else 1
    n = s.va.shape[ax] if per_axis else 1
    scale = np.array([s.choice((0.01, 0.05, 0.25, 1.0)) for _ in range(n)])
    zp = np.array([s.rng.randint(0, 9) for _ in range(n)])
    shape = (n,) if per_axis else ()
    sc, z = s.const(scale.reshape(shape), s.va.dtype), s.const(zp.reshape(shape), to)
    at = {"axis": ax} if per_axis else {}
    return [N("QuantizeLinear", [s.a, sc, z], at), N("DequantizeLinear", ["@0", sc, z], at)]


def _matmul_integer(s: Draw) -> list[N] | None:
    """QuantizeLinear of ``a`` to uint8 or int8, MatMulInteger with a constant byte weight of
    ``[K, N]`` (zero points per tensor or per column, or none), back to float32: the integer
    core of a quantized linear (tensor cores where it is large enough)."""
    from onnx import TensorProto

    if s.va.dtype != np.float32 or s.rank == 0:
        return None
    k, n = s.va.shape[-1], s.rng.randint(1, 40)
    quantize, ins = _byte_weight(s, (k, n), n)
    return [quantize, N("MatMulInteger", ins),
            N("Cast", ["@1"], {"to": int(TensorProto.FLOAT)})]  # fmt: skip


def _byte_weight(s: Draw, shape: tuple[int, ...], per: int) -> tuple[N, list[str]]:
    """The QuantizeLinear of ``a`` to uint8 or int8 and the integer product's inputs: the
    quantized ``a``, a constant byte weight of ``shape``, ``a``'s zero point, and the weight's
    zero point (per tensor, one per ``per`` indices, or none)."""
    to, wt = s.choice(("uint8", "int8")), s.choice(("uint8", "int8"))
    lo, hi = (0, 255) if wt == "uint8" else (-128, 127)
    w = np.array([s.rng.randint(lo, hi) for _ in range(int(np.prod(shape)))]).reshape(shape)
    scale = s.const(np.array(s.choice((0.02, 0.1, 0.5))), "float32")
    az = s.const(np.array(s.rng.randint(0, 9)), to)
    ins = ["@0", s.const(w, wt), az]
    if s.rng.random() < 0.7:
        per_index = s.rng.random() < 0.5
        zp = [s.rng.randint(0, 5) for _ in range(per if per_index else 1)]
        ins.append(s.const(np.array(zp if per_index else zp[0]), wt))
    return N("QuantizeLinear", [s.a, scale, az]), ins


def _conv_integer(s: Draw) -> list[N] | None:
    """QuantizeLinear of a 4-D ``a`` to uint8 or int8, ConvInteger with a constant byte weight
    (a drawn window and groups; the x zero point per tensor, the weight's per tensor, per
    output channel or none), back to float32: a quantized conv's integer core (tensor cores
    where it is large enough)."""
    from onnx import TensorProto

    if s.va.dtype != np.float32 or s.rank != 4:
        return None
    c, h, w = s.va.shape[1:]
    attrs = _window(s, h, w)
    groups = s.choice([g for g in (1, 2, c) if c % g == 0])
    m = groups * s.choice((1, 2, 8))
    kh, kw = attrs["kernel_shape"]
    quantize, ins = _byte_weight(s, (m, c // groups, kh, kw), m)
    return [quantize, N("ConvInteger", ins, {**attrs, "group": groups}),
            N("Cast", ["@1"], {"to": int(TensorProto.FLOAT)})]  # fmt: skip


def _cast_float8(s: Draw) -> list[N] | None:
    """A round trip through a float8 (saturating or not) or float4."""
    from onnx import TensorProto, helper

    if s.va.dtype.kind != "f":
        return None
    to = s.choice(("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "FLOAT4E2M1"))
    at = {"to": int(getattr(TensorProto, to))}
    if to != "FLOAT4E2M1":
        at["saturate"] = s.choice((0, 1))
    back = helper.np_dtype_to_tensor_dtype(s.va.dtype)
    return [N("Cast", [s.a], at), N("Cast", ["@0"], {"to": int(back)})]


def _loss(op: str) -> Callable[[Draw], list[N] | None]:
    """A loss over ``a`` as scores (N, C, ...) with drawn targets, weights and ignore_index."""

    def step(s: Draw) -> list[N] | None:
        if s.rank < 2 or s.va.dtype not in (np.float32, np.float16):
            return None
        c = s.va.shape[1]
        t = np.array([s.rng.randrange(c) for _ in range(s.va.size // c)])
        ins = [s.a, s.const(t.reshape((s.va.shape[0], *s.va.shape[2:])))]
        if s.rng.random() < 0.5:
            ins.append(s.const([s.choice((0.5, 1.0, 2.0)) for _ in range(c)], s.va.dtype))
        at: dict[str, Any] = {"reduction": s.choice(("none", "sum", "mean"))}
        if s.rng.random() < 0.5:
            at["ignore_index"] = s.rng.randrange(c)
        return [N(op, ins, at)]

    return step


def _grid_sample(s: Draw) -> list[N] | None:
    """``a`` as (1, 1, H, W) sampled at a drawn grid (multiples of 1/8 in [-1.25, 1.25])."""
    if s.va.dtype not in (np.float32, np.float16):
        return None
    pre = [] if s.rank == 4 else _as_4d(s)
    if pre is None:
        return None
    ho, wo = s.rng.randint(1, 5), s.rng.randint(1, 5)
    n = s.va.shape[0] if s.rank == 4 else 1
    g = np.array([s.rng.randint(-10, 10) / 8 for _ in range(n * ho * wo * 2)])
    at = {"mode": s.choice(("linear", "nearest", "cubic")),
          "padding_mode": s.choice(("zeros", "border", "reflection")),
          "align_corners": s.choice((0, 1))}  # fmt: skip
    grid = s.const(g.reshape(n, ho, wo, 2), s.va.dtype)
    return [*pre, N("GridSample", [s.a if s.rank == 4 else "@0", grid], at)]


def _lp_pool(s: Draw) -> list[N] | None:
    """An LpPool (p = 1, 2 or 3) of ``a`` as (1, 1, H, W), without ceil mode or auto_pad."""
    pre = [] if s.rank == 4 else _as_4d(s)
    if pre is None or s.va.dtype.kind != "f":
        return None
    h, w = s.va.shape[2:] if s.rank == 4 else (s.va.size // s.va.shape[-1], s.va.shape[-1])
    kh, kw = s.rng.randint(1, min(h, 3)), s.rng.randint(1, min(w, 3))
    at = {"kernel_shape": [kh, kw], "p": s.choice((1, 2, 3)),
          "strides": [s.rng.randint(1, 2), s.rng.randint(1, 2)]}  # fmt: skip
    return [*pre, N("LpPool", [s.a if s.rank == 4 else "@0"], at)]


def _dft(s: Draw) -> list[N] | None:
    """A DFT of ``a`` (as real samples along a drawn axis), forward or inverse, one-sided
    or not, at its length or another."""
    if s.rank < 1 or s.va.dtype not in (np.float32, np.float64) or s.va.size > 4096:
        return None
    ax = s.rng.randrange(s.rank)
    n = s.va.shape[ax]
    length = s.choice((n, n, max(1, n - 2), n + 3))
    inverse = s.choice((0, 1))
    onesided = 0 if inverse else s.choice((0, 1))
    pre = [N("Unsqueeze", [s.a, s.const([s.rank])])]
    return [*pre, N("DFT", ["@0", s.const(length), s.const(ax)],
                    {"inverse": inverse, "onesided": onesided})]  # fmt: skip


#: Step templates: (name, kinds of operands, template). Kinds: "f" float, "i" integer,
#: "b" bool, "n" float or integer, "x" any; a second letter is ``b``'s kind.
STEPS: tuple[tuple[str, str, Callable[[Draw], list[N] | None]], ...] = (
    ("Relu", "n", _unary("Relu")),
    ("Sigmoid", "f", _unary("Sigmoid")),
    ("Tanh", "f", _unary("Tanh")),
    ("Erf", "f", _unary("Erf")),
    ("Softsign", "f", _unary("Softsign")),
    ("Softplus", "f", _unary("Softplus")),
    ("Elu", "f", _unary("Elu", alpha=lambda s: s.choice((0.5, 1.0)))),
    ("Selu", "f", _unary("Selu", alpha=lambda s: s.choice((1.5, 1.67)),
                         gamma=lambda s: s.choice((1.0, 1.05)))),  # fmt: skip
    ("LeakyRelu", "f", _unary("LeakyRelu", alpha=lambda s: s.choice((0.01, 0.3)))),
    ("HardSigmoid", "f", _unary("HardSigmoid", alpha=lambda s: s.choice((0.2, 0.5)),
                                beta=lambda s: s.choice((0.5, 0.6)))),  # fmt: skip
    ("HardSwish", "f", _unary("HardSwish")),
    ("Gelu", "f", _unary("Gelu", approximate=lambda s: s.choice(("none", "tanh")))),
    ("Shrink", "f", _unary("Shrink", lambd=lambda s: s.choice((0.5, 1.0)),
                           bias=lambda s: s.choice((0.0, 0.5)))),  # fmt: skip
    ("Floor", "f", _unary("Floor")),
    ("Ceil", "f", _unary("Ceil")),
    ("Round", "f", _unary("Round")),
    ("Sign", "n", _unary("Sign")),
    ("Abs", "n", _unary("Abs")),
    ("Neg", "n", _unary("Neg")),
    ("IsNaN", "f", _unary("IsNaN")),
    ("IsInf", "f", _unary("IsInf", detect_negative=lambda s: s.choice((0, 1)))),
    ("Exp", "f", lambda s: [N("Clip", [s.a, s.like_a(-4), s.like_a(4)]), N("Exp", ["@0"])]),
    ("Log", "f", _positive("Log")),
    ("Sqrt", "f", _positive("Sqrt")),
    ("Reciprocal", "f", _positive("Reciprocal")),
    ("Pow", "f", lambda s: [N("Abs", [s.a]), N("Pow", ["@0", _exponent(s)])]),
    ("Clip", "n", _clip),
    ("Cast", "x", _cast),
    ("CastLike", "xx", lambda s: [N("CastLike", [s.a, s.b])]),
    ("Add", "nn", lambda s: [N("Add", [s.a, s.b])]),
    ("Sub", "nn", lambda s: [N("Sub", [s.a, s.b])]),
    ("Mul", "nn", lambda s: [N("Mul", [s.a, s.b])]),
    ("Div", "nn", lambda s: [*_divisor(s), N("Div", [s.a, "@1"])]),
    ("Mod", "nn", _mod),
    ("Max", "nn", lambda s: [N("Max", [s.a, s.b, s.a][: s.rng.randint(1, 3)])]),
    ("Min", "nn", lambda s: [N("Min", [s.a, s.b])]),
    ("Sum", "nn", lambda s: [N("Sum", [s.a, s.b, s.b])]),
    ("Mean", "ff", lambda s: [N("Mean", [s.a, s.b])]),
    ("PRelu", "f", lambda s: [N("PRelu", [s.a, s.floats(s.va.shape[-1:] if s.rank else ())])]),
    ("Equal", "xx", lambda s: [N("Equal", [s.a, s.b])]),
    ("Greater", "nn", lambda s: [N("Greater", [s.a, s.b])]),
    ("LessOrEqual", "nn", lambda s: [N("LessOrEqual", [s.a, s.b])]),
    ("And", "bb", lambda s: [N("And", [s.a, s.b])]),
    ("Xor", "bb", lambda s: [N("Xor", [s.a, s.b])]),
    ("Not", "b", lambda s: [N("Not", [s.a])]),
    ("Where", "xx", _where),
    ("ReduceSum", "n", _reduce("ReduceSum")),
    ("ReduceMean", "n", _reduce("ReduceMean")),
    ("ReduceMax", "n", _reduce("ReduceMax")),
    ("ReduceMin", "n", _reduce("ReduceMin")),
    ("ReduceL1", "n", _reduce("ReduceL1")),
    ("ReduceL2", "f", _reduce("ReduceL2")),
    ("ReduceSumSquare", "n", _reduce("ReduceSumSquare")),
    ("ReduceLogSum", "f", _reduce("ReduceLogSum")),
    ("ReduceLogSumExp", "f", _reduce("ReduceLogSumExp")),
    ("ArgMax", "n", _arg("ArgMax")),
    ("ArgMin", "n", _arg("ArgMin")),
    ("Softmax", "f", lambda s: [N("Softmax", [s.a], {"axis": s.axis()})]),
    ("LogSoftmax", "f", lambda s: [N("LogSoftmax", [s.a], {"axis": s.axis()})]),
    ("LayerNormalization", "f", _layer_norm),
    ("BatchNormalization", "f", _batch_norm),
    ("InstanceNormalization", "f", _instance_norm),
    ("CumSum", "n", _cumsum),
    ("TopK", "f", _topk),
    ("Transpose", "x", _transpose),
    ("Reshape", "x", _reshape),
    ("Flatten", "x", lambda s: [N("Flatten", [s.a], {"axis": s.rng.randint(-s.rank,
                                                                           s.rank)})]),  # fmt: skip
    ("Squeeze", "x", _squeeze),
    ("Unsqueeze", "x", _unsqueeze),
    ("Slice", "x", _slice),
    ("Gather", "x", _gather),
    ("GatherND", "x", _gather_nd),
    ("Concat", "x", _concat),
    ("Split", "x", _split),
    ("Pad", "n", _pad),
    ("Tile", "x", _tile),
    ("Expand", "x", _expand),
    ("DepthToSpace", "x", _depth_to_space),
    ("SpaceToDepth", "x", _space_to_depth),
    ("Einsum", "f", _einsum),
    ("OneHot", "i", _one_hot),
    ("MatMul", "f", _matmul),
    ("Gemm", "f", _gemm),
    ("Conv", "f", _conv),
    ("ConvTranspose", "f", _conv_transpose),
    ("MaxPool", "f", _pool("MaxPool")),
    ("AveragePool", "f", _pool("AveragePool")),
    ("GlobalAveragePool", "f", _global_pool("GlobalAveragePool")),
    ("GlobalMaxPool", "f", _global_pool("GlobalMaxPool")),
    ("Resize", "f", _resize),
    ("LRN", "f", lambda s: [N("LRN", [s.a], {"size": s.choice((1, 3, 5)),
                                              "alpha": 0.01})] if s.rank >= 3 else None),
    ("Sin", "f", _unary("Sin")),
    ("Cos", "f", _unary("Cos")),
    ("Atan", "f", _unary("Atan")),
    ("Asinh", "f", _unary("Asinh")),
    ("Tan", "f", _clipped("Tan", 1.2)),
    ("Sinh", "f", _clipped("Sinh", 4)),
    ("Cosh", "f", _clipped("Cosh", 4)),
    ("Asin", "f", _clipped("Asin", 0.9)),
    ("Acos", "f", _clipped("Acos", 0.9)),
    ("Atanh", "f", _clipped("Atanh", 0.9)),
    ("Acosh", "f", _positive("Acosh")),
    ("Mish", "f", _unary("Mish")),
    ("Celu", "f", _unary("Celu", alpha=lambda s: s.choice((0.5, 1.0, 2.0)))),
    ("ThresholdedRelu", "f", _unary("ThresholdedRelu", alpha=lambda s: s.choice((0.1, 1.0)))),
    ("Hardmax", "f", lambda s: [N("Hardmax", [s.a], {"axis": s.axis()})] if s.rank else None),
    ("LpNormalization", "f", lambda s: [N("LpNormalization", [s.a], {
        "axis": s.axis(), "p": s.choice((1, 2))})] if s.rank else None),  # fmt: skip
    ("Trilu", "x", lambda s: [N("Trilu", [s.a, s.const(s.rng.randint(-2, 2))], {
        "upper": s.choice((0, 1))})] if s.rank >= 2 else None),  # fmt: skip
    ("ScatterElements", "n", _scatter_elements),
    ("ScatterND", "n", _scatter_nd),
    ("ReduceProd", "n", _reduce("ReduceProd")),
    ("QuantizeDequantize", "f", _quantize_dequantize),
    ("CastFloat8", "f", _cast_float8),
    ("NegativeLogLikelihoodLoss", "f", _loss("NegativeLogLikelihoodLoss")),
    ("SoftmaxCrossEntropyLoss", "f", _loss("SoftmaxCrossEntropyLoss")),
    ("GridSample", "f", _grid_sample),
    ("LpPool", "f", _lp_pool),
    ("DFT", "f", _dft),
    ("MatMulInteger", "f", _matmul_integer),
    ("ConvInteger", "f", _conv_integer),
)


@dataclass
class OnnxProgram:
    """A drawn model: its ``seed``, ``source`` (defines ``make_inputs()`` and
    ``make_model()``), and the dtypes its values hold."""

    seed: int
    source: str
    dtypes: set[str] = field(default_factory=set)

    def script(self) -> str:
        """A runnable script: the model, then the comparison :func:`check` makes."""
        return (
            f"# polyfuse fuzz --onnx, seed {self.seed}\n{self.source}\n"
            "from polyfuse.onnx.backend import prepare\n"
            "from polyfuse.testing.onnx_programs import reference_evaluator\n\n"
            "model, feeds = make_model(), make_inputs()\n"
            "want = reference_evaluator(model).run(None, feeds)\n"
            "got = prepare(model, 'CPU').run(feeds)\n"
            "for k, (g, w) in enumerate(zip(got, want)):\n"
            "    print(k, w.dtype, g.dtype, g.shape == w.shape and "
            "float(abs(g.astype('float64') - w.astype('float64')).max(initial=0)))\n"
        )


@dataclass
class OnnxOutcome:
    """What happened to one model: "pass", "mismatch" (an output differs from the reference
    evaluator's) or "crash" (importing, compiling or running it raised)."""

    program: OnnxProgram
    status: str
    detail: str = ""
    size: int = 0  # nodes in the model

    @property
    def failed(self) -> bool:
        return self.status != "pass"


_HEADER = (
    "import numpy as np\n"
    "from onnx import TensorProto, helper, numpy_helper\n"
)


def _kind(v: np.ndarray) -> str:
    return "b" if v.dtype == np.bool_ else ("f" if v.dtype.kind == "f" else "i")


def _fits(kind: str, v: np.ndarray) -> bool:
    return kind == "x" or kind == _kind(v) or (kind == "n" and _kind(v) != "b")


def _ok(v: Any, max_elements: int = SMALL_ELEMENTS) -> bool:
    """A value a model may keep: 1 to ``max_elements`` elements, rank ≤ 4, finite and
    moderate."""
    if not isinstance(v, np.ndarray) or not 0 < v.size <= max_elements or v.ndim > 4:
        return False
    if v.dtype.kind == "f":
        d = v.astype(np.float64)
        return bool(np.isfinite(d).all()) and float(np.abs(d).max()) <= LIMIT
    return v.dtype == np.bool_ or (v.dtype.kind in "iu" and int(np.abs(v).max()) <= 100_000)


def _literal(a: np.ndarray) -> str:
    return f"np.array({a.tolist()!r}, dtype='{a.dtype}')"


def _input(rng: random.Random, dtype: str, max_elements: int = SMALL_ELEMENTS) -> str:
    shape = input_shape(rng, 4, max_elements)
    g = f"np.random.default_rng({rng.randrange(1 << 30)})"
    if dtype == "bool":
        return f"{g}.random({shape}) > 0.5"
    if dtype in ("int32", "int64"):
        return f"{g}.integers(-20, 20, {shape}).astype('{dtype}')"
    if dtype in NARROW_INPUTS:
        lo, hi = NARROW_INPUTS[dtype]
        return f"{g}.integers({lo}, {hi}, {shape}).astype('{dtype}')"
    return f"({g}.standard_normal({shape}) * 2).astype('{dtype}')"


def _model_source(inputs: dict[str, np.ndarray], consts: dict[str, np.ndarray],
                  nodes: list[tuple[str, str]], outputs: dict[str, np.ndarray]) -> str:  # fmt: skip
    from onnx import helper

    def vi(name: str, v: np.ndarray) -> str:
        t = helper.tensor_dtype_to_string(helper.np_dtype_to_tensor_dtype(v.dtype))
        return f"helper.make_tensor_value_info({name!r}, {t}, {list(v.shape)!r})"

    lines = ["def make_model():", "    consts = ["]
    lines += [f"        numpy_helper.from_array({_literal(v)}, {n!r})," for n, v in consts.items()]
    lines += ["    ]", "    nodes = ["]
    lines += [f"        {n},{f'  # {why}' if why else ''}" for n, why in nodes] + ["    ]"]
    lines += ["    inputs = ["] + [f"        {vi(n, v)}," for n, v in inputs.items()] + ["    ]"]
    lines += ["    outputs = ["] + [f"        {vi(n, v)}," for n, v in outputs.items()] + ["    ]"]
    lines += [
        "    graph = helper.make_graph(nodes, 'fuzz', inputs, outputs, consts)",
        f"    return helper.make_model(graph, opset_imports=[helper.make_opsetid('', {OPSET})])",
    ]
    return "\n".join(lines) + "\n"


def _node_source(n: N, ins: list[str], outs: list[str]) -> str:
    attrs = "".join(f", {k}={v!r}" for k, v in n.attrs.items())
    return f"helper.make_node({n.op!r}, {ins!r}, {outs!r}{attrs})"


_FIXED_OPS: list[type] = []

#: operators whose onnx reference sums its 16-bit inputs in their own dtype
_SUMMED_IN_FLOAT64 = ("ReduceSum", "ReduceMean", "ReduceL1", "ReduceL2", "ReduceSumSquare",
                      "ReduceLogSum", "ReduceLogSumExp", "Softmax", "LogSoftmax", "CumSum",
                      "Einsum", "InstanceNormalization", "ReduceProd", "CumProd",
                      "NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss",
                      "GridSample")  # fmt: skip


def _in_float64(base: type) -> type:
    """``base`` (an onnx reference operator) run on float64 copies of its 16-bit float inputs,
    its float64 results rounded once to their dtype: the exact result, which any accumulation
    order of a correct compiler is within its tolerance of."""

    def _run(self: Any, *inputs: Any, **attrs: Any) -> tuple:
        narrow = next((v.dtype for v in inputs if _is_16_bit(v)), None)
        if narrow is None:
            return base._run(self, *inputs, **attrs)
        wide = [v.astype(np.float64) if _is_16_bit(v) else v for v in inputs]
        out = base._run(self, *wide, **attrs)
        return tuple(v.astype(narrow) if v.dtype == np.float64 else v for v in out)

    return type(base.__name__.split("_")[0], (base,), {"_run": _run})


def _is_16_bit(v: Any) -> bool:
    """A float16 or bfloat16 (ml_dtypes) array."""
    return isinstance(v, np.ndarray) and v.dtype.itemsize == 2 and (
        v.dtype.kind == "f" or v.dtype.name == "bfloat16"
    )


def reference_evaluator(model: Any) -> Any:
    """ONNX's reference evaluator for ``model``, with the operators it gets wrong replaced
    (onnx 1.16-1.23): ``Erf``, ``Gelu`` and ``HardSwish`` computed in the input's dtype (its
    own round to float32 values or constants: a float64 result 1e-8 off);
    ``LayerNormalization`` of a 16-bit input in float32 (``stash_type`` 1, stage one's
    computation precision; its own rounds every intermediate to float16); ``GlobalMaxPool``
    over the spatial axes of any rank (its own reduces axes 1 and 2 of a 3-D input); ``LRN``
    over every channel (its own sums the squares of the first N channels only, and divides
    ``alpha`` by ``size`` in float32: a float64 result 1e-8 off, fuzz seed 8003); ``MaxPool``
    with ``auto_pad`` SAME or VALID through the explicit pads the specification gives (its own
    pads a SAME_LOWER pool's odd total at the end when strided, and sizes its output by
    ``floor(n / stride)``: fuzz seed 8161); ``LpNormalization`` with the magnitudes the
    specification names (its own p=1 sums signed values); ``MeanVarianceNormalization``,
    ``GroupNormalization`` and ``RMSNormalization`` in float64, rounded once (their function
    bodies round every intermediate to float16, and MVN's adds a float32 epsilon a float16
    graph refuses); and the operators that sum many values
    (:data:`_SUMMED_IN_FLOAT64`) of 16-bit inputs in float64, rounded once (onnx's own add in
    float16: a log-softmax of float16 values 0.52 off, fuzz seed 20098 at ``--max-elements``; a
    running sum of 513 values 0.48 off, seed 20263; a sum of 64 values 13 units off, seed
    20676; polyfuse sums in float32, as torch; the losses likewise, and ``GridSample``,
    whose float16 reference rounds the sample coordinates and moves the samples);
    ``Attention`` (opset 23-25) of 16-bit inputs likewise (its own matmuls, softmax and sums
    round every step to the 16-bit dtype)."""
    import math

    from onnx.reference import ReferenceEvaluator
    from onnx.reference.op_run import OpRun
    from onnx.reference.ops import load_op
    from onnx.reference.ops.op_layer_normalization import _layer_normalization
    from onnx.reference.ops.op_max_pool import MaxPool as _MaxPool

    if not _FIXED_OPS:

        class Erf(OpRun):
            def _run(self, x: np.ndarray) -> tuple[np.ndarray]:
                return (np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype),)

        class LayerNormalization(OpRun):
            def _run(self, x, scale, b=None, axis=-1, epsilon=1e-5, stash_type=1):  # noqa: ANN001, ANN202
                if x.dtype.itemsize > 2 or stash_type != 1:
                    return _layer_normalization(x, scale, b, axis=axis, epsilon=epsilon)
                wide = [None if v is None else v.astype(np.float32) for v in (x, scale, b)]
                y, mean, rstd = _layer_normalization(*wide, axis=axis, epsilon=epsilon)
                return y.astype(x.dtype), mean, rstd

        class Gelu(OpRun):
            def _run(self, x, approximate="none"):  # noqa: ANN001, ANN202
                v = x.astype(np.float64)
                if approximate == "tanh":
                    y = 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))
                else:
                    y = 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2)))
                return (y.astype(x.dtype),)

        class HardSwish(OpRun):
            def _run(self, x):  # noqa: ANN001, ANN202
                v = x.astype(np.float64)
                return ((v * np.clip(v / 6 + 0.5, 0, 1)).astype(x.dtype),)

        class GlobalMaxPool(OpRun):
            def _run(self, x):  # noqa: ANN001, ANN202
                return (x.max(axis=tuple(range(2, x.ndim)), keepdims=True),)

        class LRN(OpRun):
            def _run(self, x, alpha=1e-4, beta=0.75, bias=1.0, size=1):  # noqa: ANN001, ANN202
                v = x.astype(np.float64)
                alpha, beta, bias = float(alpha), float(beta), float(bias)  # not float32 scalars
                sq = np.zeros_like(v)
                lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
                for c in range(x.shape[1]):
                    sq[:, c] = (v[:, max(0, c - lo) : c + hi + 1] ** 2).sum(axis=1)
                return ((v / (bias + alpha / size * sq) ** beta).astype(x.dtype),)

        class MaxPool(_MaxPool):
            def _run(self, x, auto_pad=None, ceil_mode=None, dilations=None,  # noqa: ANN001, ANN202
                     kernel_shape=None, pads=None, storage_order=None, strides=None):  # fmt: skip
                if auto_pad in ("SAME_UPPER", "SAME_LOWER", "VALID"):
                    pads = _explicit_pads(x.shape[2:], auto_pad, kernel_shape, strides, dilations)
                    auto_pad, ceil_mode = "NOTSET", 0
                return super()._run(x, auto_pad, ceil_mode, dilations, kernel_shape, pads,
                                    storage_order, strides)  # fmt: skip

        class LpNormalization(OpRun):
            def _run(self, x, axis=-1, p=2):  # noqa: ANN001, ANN202
                v = x.astype(np.float64)
                n = (np.abs(v) ** p).sum(axis=axis, keepdims=True) ** (1.0 / p)
                return (np.where(n == 0, 0.0, v / np.where(n == 0, 1.0, n)).astype(x.dtype),)

        class MeanVarianceNormalization(OpRun):
            def _run(self, x, axes=(0, 2, 3)):  # noqa: ANN001, ANN202
                v = x.astype(np.float64)
                c = v - v.mean(axis=tuple(axes), keepdims=True)
                sd = np.sqrt((c * c).mean(axis=tuple(axes), keepdims=True))
                return ((c / (sd + 1e-9)).astype(x.dtype),)

        class GroupNormalization(OpRun):
            def _run(self, x, scale, bias, epsilon=1e-5, num_groups=1, stash_type=1):  # noqa: ANN001, ANN202
                n, c, g = x.shape[0], x.shape[1], int(num_groups)
                v = x.astype(np.float64).reshape(n, g, -1)
                c_ = v - v.mean(axis=2, keepdims=True)
                y = (c_ / np.sqrt((c_ * c_).mean(axis=2, keepdims=True) + epsilon)).reshape(x.shape)
                per = (1, c) + (1,) * (x.ndim - 2)
                sc, bi = (np.asarray(t, np.float64) for t in (scale, bias))
                if sc.size == g != c:  # opset 18: one scale and bias per group
                    sc, bi = np.repeat(sc, c // g), np.repeat(bi, c // g)
                return ((y * sc.reshape(per) + bi.reshape(per)).astype(x.dtype),)

        class RMSNormalization(OpRun):
            def _run(self, x, scale, axis=-1, epsilon=1e-5, stash_type=1):  # noqa: ANN001, ANN202
                v = x.astype(np.float64)
                axes = tuple(range(axis % x.ndim, x.ndim))
                ms = (v * v).mean(axis=axes, keepdims=True)
                return ((v / np.sqrt(ms + epsilon) * scale).astype(x.dtype),)

        _FIXED_OPS.extend((Erf, LayerNormalization, Gelu, HardSwish, GlobalMaxPool, LRN, MaxPool))
        _FIXED_OPS.extend((LpNormalization, MeanVarianceNormalization, GroupNormalization,
                           RMSNormalization))  # fmt: skip
        _FIXED_OPS.extend(_in_float64(load_op("", op, OPSET)) for op in _SUMMED_IN_FLOAT64)
        _FIXED_OPS.append(_in_float64(load_op("", "Attention", 25)))
    return ReferenceEvaluator(model, new_ops=_FIXED_OPS)


def _explicit_pads(
    spatial: Sequence[int],
    auto_pad: str,
    kernel: Sequence[int],
    strides: Sequence[int] | None,
    dilations: Sequence[int] | None,
) -> list[int]:
    """ONNX's pads (all begins, then all ends) for ``auto_pad``: none for VALID; for SAME the
    total that makes the output ``ceil(n / stride)`` long, split evenly with the odd one at
    the end (SAME_UPPER) or at the beginning (SAME_LOWER)."""
    n = len(spatial)
    strides, dilations = strides or [1] * n, dilations or [1] * n
    begins, ends = [0] * n, [0] * n
    if auto_pad == "VALID":
        return begins + ends
    for i, size in enumerate(spatial):
        span = (kernel[i] - 1) * dilations[i] + 1
        total = max(0, (-(-size // strides[i]) - 1) * strides[i] + span - size)
        begins[i] = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
        ends[i] = total - begins[i]
    return begins + ends


def _run_step(nodes: list[str], env: dict[str, np.ndarray], values: set[str] | dict,
              outs: list[str]) -> list[np.ndarray]:  # fmt: skip
    """Run one step's nodes (reading ``env``: the names in ``values`` graph inputs, the rest
    constants) with :func:`reference_evaluator` after strict type and shape
    inference; raises where the step is not a valid model, or where the reference's result
    has another shape or dtype than ONNX's own shape inference gives (the reference's bug,
    e.g. a MaxPool with ``auto_pad`` and dilations: the step is not drawn)."""
    import onnx
    from onnx import helper, numpy_helper, shape_inference

    made = [eval(n, {"helper": helper})  # noqa: S307 - our own generated source
            for n in nodes]  # fmt: skip
    names = {i for n in made for i in n.input if i} - {o for n in made for o in n.output}
    feeds = {k: env[k] for k in sorted(names) if k in values}
    consts = [numpy_helper.from_array(env[k], k) for k in sorted(names) if k not in values]
    vis = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for k, v in feeds.items()]  # fmt: skip
    graph = helper.make_graph(made, "step", vis, [helper.make_value_info(o, onnx.TypeProto())
                                                  for o in outs], consts)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    typed = shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    got = list(reference_evaluator(model).run(outs, feeds))
    for vi, v in zip(typed.graph.output, got, strict=True):  # the reference against the types
        t = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        if t.elem_type and t.elem_type != helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype):
            raise ValueError(f"the reference's {vi.name} is not of the inferred type")
        if t.HasField("shape") and None not in dims and tuple(dims) != np.shape(v):
            raise ValueError(f"the reference's {vi.name} is {np.shape(v)}, inferred {dims}")
    return got


def _coarsest(dtypes: set[str]) -> str:
    """The coarsest float dtype of ``dtypes`` (float32 when none): whose tolerance applies."""
    return next((d for d in ("float16", "float32", "float64") if d in dtypes), "float32")


def _stable(src: list[str], env: dict[str, np.ndarray], inputs: dict, out: str,
            base: np.ndarray, moved: list[str], tol: Any, seed: Any) -> bool:  # fmt: skip
    """Whether a step's result stays within half the tolerance ``tol`` when each computed
    float operand in ``moved`` moves by up to the tolerance (three random moves). Where not,
    the comparison would hang on rounding noise the tolerance allows upstream: a value at a
    rounding boundary of Floor or a cast to int, a near tie of ArgMax or a comparison, a
    normalisation of a nearly constant row."""
    rng = np.random.default_rng(seed)
    for _ in range(3):
        env2 = dict(env)
        for n in moved:
            v = env[n].astype(np.float64)
            room = tol.atol * max(1.0, float(np.abs(v).max())) + tol.rtol * np.abs(v)
            env2[n] = (v + room * rng.uniform(-1, 1, v.shape)).astype(env[n].dtype)
        try:
            got = _run_step(src, env2, inputs, [out])[0]
        except Exception:  # noqa: BLE001 - e.g. a moved value outside an op's domain
            return False
        if got.shape != base.shape or got.dtype != base.dtype:
            return False
        if base.dtype.kind != "f":
            if not np.array_equal(got, base):
                return False
            continue
        g, w = got.astype(np.float64), base.astype(np.float64)
        room = tol.atol * max(1.0, float(np.abs(w).max(initial=0))) + tol.rtol * np.abs(w)
        if not np.all(np.abs(g - w) <= 0.5 * room):
            return False
    return True


def draw(
    seed: int,
    dtypes: Sequence[str] | None = None,
    steps: int = 6,
    max_elements: int = SMALL_ELEMENTS,
) -> OnnxProgram:
    """A model of about ``steps`` steps over inputs of ``dtypes`` (float32 alone by
    default; see the module docstring), no tensor beyond ``max_elements``."""
    from polyfuse.graph.dtypes import tolerance

    rng = random.Random(f"onnx program {seed}")
    pool = [d for d in INPUT_DTYPES if d in (dtypes or ("float32",))] or ["float32"]
    narrow = [d for d in NARROW_INPUTS if d in (dtypes or ())]
    side = random.Random(f"narrow input {seed}")  # its own stream: the rest draws as before
    inputs: dict[str, np.ndarray] = {}
    in_src = []
    for k in range(rng.randint(1, 3)):
        src = _input(rng, rng.choice(pool), max_elements)
        if narrow and side.random() < 0.15:  # this input narrow instead
            src = _input(side, side.choice(narrow), max_elements)
        in_src.append(f"        'x{k}': {src},")
        inputs[f"x{k}"] = eval(src, {"np": np})  # noqa: S307 - our own generated source
    values: dict[str, np.ndarray] = dict(inputs)
    consts: dict[str, np.ndarray] = {}
    nodes: list[tuple[str, str]] = []  # (source, the step it ends)
    outputs: dict[str, np.ndarray] = {}
    tries = 0
    while len(outputs) < steps and tries < steps * 25:
        tries += 1
        name, kinds, template = rng.choice(STEPS)
        picked = pick_operands(rng, kinds, values, _fits)
        if picked is None:
            continue
        a, b = picked
        s = Draw(rng, a, b, values[a], values[b], consts)
        try:
            made = template(s)
        except (ValueError, IndexError, ZeroDivisionError):
            continue
        if not made:
            continue
        out = f"v{len(outputs)}"
        src: list[str] = []
        passed: list[str] = []  # the value each node of the step passes on
        for k, n in enumerate(made):
            names_k = [f"t{len(nodes)}_{k}_{j}" for j in range(n.outputs)]
            if k == len(made) - 1:
                names_k[n.take] = out
            ins = [passed[int(i[1:])] if i.startswith("@") else i for i in n.inputs]
            passed.append(names_k[n.take])
            src.append(_node_source(n, ins, names_k))
        try:
            got = _run_step(src, {**values, **s.new}, values, [out])
        except Exception:  # noqa: BLE001 - an invalid draw: drop it
            continue
        if not _ok(got[0], max_elements):
            continue
        tol = tolerance(_coarsest({str(v.dtype) for v in values.values()} | {str(got[0].dtype)}))
        moved = [n for n in dict.fromkeys((a, b))
                 if n.startswith("v") and values[n].dtype.kind == "f"]  # fmt: skip
        env = {**values, **s.new}
        if moved and not _stable(src, env, values, out, got[0], moved, tol, [seed, tries]):
            continue
        consts.update(s.new)
        values[out] = outputs[out] = got[0]
        nodes += [(line, name if k == len(src) - 1 else "") for k, line in enumerate(src)]
    if not outputs:  # nothing drew: the model passes an input through
        nodes.append((_node_source(N("Identity", ["x0"]), ["x0"], ["v0"]), "Identity"))
        outputs["v0"] = inputs["x0"]
    source = (
        _HEADER
        + "\n\ndef make_inputs():\n    return {\n"
        + "\n".join(in_src)
        + "\n    }\n\n\n"
        + _model_source(inputs, consts, nodes, outputs)
    )
    held = {str(v.dtype) for v in values.values()}
    return OnnxProgram(seed, source, held)


def _close(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> str:
    """"" when ``got`` matches the reference's ``want``, else why not."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"{got.dtype}{got.shape} where the reference gives {want.dtype}{want.shape}"
    if want.dtype.kind != "f":
        return "" if np.array_equal(got, want) else "differs"
    g, w = got.astype(np.float64), want.astype(np.float64)
    scale = max(1.0, float(np.abs(w).max(initial=0)))
    bad = ~(np.abs(g - w) <= atol * scale + rtol * np.abs(w))
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        return f"{g.flat[k]:.6g} at {np.unravel_index(k, w.shape)} where the reference " \
               f"gives {w.flat[k]:.6g}"
    return ""


def check(program: OnnxProgram) -> OnnxOutcome:
    """Import ``program``'s model, run it on the emulator and compare every output with the
    reference evaluator's (see the module docstring)."""
    from polyfuse.graph.dtypes import tolerance
    from polyfuse.onnx.backend import prepare

    env: dict[str, Any] = {}
    exec(program.source, env)  # noqa: S102 - our own generated source
    model, feeds = env["make_model"](), env["make_inputs"]()
    tol = tolerance(_coarsest(program.dtypes))
    want = reference_evaluator(model).run(None, feeds)
    nodes = len(model.graph.node)
    try:
        got = prepare(model, "CPU").run(feeds)
    except Exception as e:  # a crash is a finding: report it, go on
        return OnnxOutcome(program, "crash", crash_detail(e), nodes)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        why = _close(np.asarray(g), np.asarray(w), tol.rtol, tol.atol)
        if why:
            line = next((ln.split("  # ")[-1] for ln in program.source.splitlines()
                         if f"['v{k}']" in ln), "")  # fmt: skip
            return OnnxOutcome(program, "mismatch", f"output v{k} ({line}): {why}", nodes)
    return OnnxOutcome(program, "pass", "", nodes)


def fuzz_onnx(
    n: int,
    seed: int = 0,
    dtypes: Sequence[str] | None = None,
    progress: Callable[[int, OnnxOutcome], None] | None = None,
    steps: int = 6,
    max_elements: int = SMALL_ELEMENTS,
) -> list[OnnxOutcome]:
    """Draw and check ``n`` models of about ``steps`` steps from ``seed`` on."""
    return run_programs(n, seed, lambda s: draw(s, dtypes, steps, max_elements), check, progress)
