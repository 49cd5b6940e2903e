"""Graphs the end-to-end tests compile, each with a numpy reference.

Shapes are small (the emulator runs every CUDA thread as a fiber) and deliberately not
multiples of the tile sizes, so partial tiles and guards are exercised.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from polyfuse import ops, te


@dataclass
class Case:
    name: str
    inputs: list
    outputs: list
    reference: Callable[..., tuple[np.ndarray, ...]]


def np_softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_log_softmax(x, axis=-1):
    s = x - x.max(axis=axis, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=axis, keepdims=True))


def np_layer_norm(x, g, b, eps=1e-5):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * g + b


def np_gelu(x):
    from math import erf

    return 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2.0)))


def np_gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def np_conv2d(x, w, stride, padding, dilation, groups):
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh = (h + 2 * padding - dilation * (kh - 1) - 1) // stride + 1
    ow = (wd + 2 * padding - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((n, o, oh, ow), np.float64)
    og = o // groups
    for g in range(groups):
        xs = xp[:, g * cg : (g + 1) * cg]
        ws = w[g * og : (g + 1) * og]
        for a in range(kh):
            for b in range(kw):
                patch = xs[
                    :,
                    :,
                    a * dilation : a * dilation + stride * oh : stride,
                    b * dilation : b * dilation + stride * ow : stride,
                ]
                out[:, g * og : (g + 1) * og] += np.einsum("nchw,oc->nohw", patch, ws[:, :, a, b])
    return out


def _ph(shape, name):
    return te.placeholder(shape, name=name)


def build_cases() -> list[Case]:
    cases: list[Case] = []
    add = lambda name, ins, outs, ref: cases.append(Case(name, ins, outs, ref))  # noqa: E731

    # Elementwise chain (te directly) and broadcasts on each axis.
    x = _ph((5, 37), "x")
    b = _ph((37,), "b")
    c0 = te.compute((5, 37), lambda i, j: x[i, j] * 2.0, name="c0")
    c1 = te.compute((5, 37), lambda i, j: c0[i, j] + b[j], name="c1")
    c2 = te.compute((5, 37), lambda i, j: te.exp(c1[i, j] * 0.1), name="c2")
    c3 = te.compute((5, 37), lambda i, j: c2[i, j] - 1.0, name="c3")
    c4 = te.compute((5, 37), lambda i, j: te.tanh(c3[i, j]) + te.sigmoid(c1[i, j]), name="c4")
    add(
        "elementwise_chain",
        [x, b],
        [c4],
        lambda x, b: (np.tanh(np.exp((2 * x + b) * 0.1) - 1) + 1 / (1 + np.exp(-(2 * x + b))),),
    )
    x3 = _ph((3, 7, 11), "x3")
    for axis, shape in ((0, (3, 1, 1)), (1, (1, 7, 1)), (2, (11,))):
        bb = _ph(shape, f"bias{axis}")
        add(
            f"broadcast_axis{axis}",
            [x3, bb],
            [ops.relu(ops.add(ops.mul(x3, bb), 1.5))],
            lambda x, b: (np.maximum(x * b + 1.5, 0),),
        )

    # Reductions on each axis and on all axes.
    for axis in (0, 1, 2, None):
        add(
            f"reduce_sum_axis{axis}",
            [x3],
            [ops.reduce_sum(x3, axis=axis)],
            lambda x, axis=axis: (x.sum(axis=axis),),
        )
    add("reduce_max_axis1", [x3], [ops.reduce_max(x3, axis=1)], lambda x: (x.max(axis=1),))
    add(
        "reduce_mean_keepdims",
        [x3],
        [ops.reduce_mean(x3, axis=(0, 2), keepdims=True)],
        lambda x: (x.mean(axis=(0, 2), keepdims=True),),
    )

    # Composites.
    xs = _ph((6, 45), "xs")
    add("softmax", [xs], [ops.softmax(xs)], lambda x: (np_softmax(x),))
    add("softmax_axis0", [xs], [ops.softmax(xs, axis=0)], lambda x: (np_softmax(x, 0),))
    add("log_softmax", [xs], [ops.log_softmax(xs)], lambda x: (np_log_softmax(x),))
    g, bt = _ph((45,), "gamma"), _ph((45,), "beta")
    add(
        "layer_norm",
        [xs, g, bt],
        [ops.layer_norm(xs, g, bt)],
        lambda x, g, b: (np_layer_norm(x, g, b),),
    )
    add("gelu_erf", [xs], [ops.gelu(xs)], lambda x: (np_gelu(x),))
    add("gelu_tanh", [xs], [ops.gelu(xs, approximate="tanh")], lambda x: (np_gelu_tanh(x),))

    # Contractions.
    a, w, bias = _ph((33, 17), "a"), _ph((17, 29), "w"), _ph((29,), "bias")
    add(
        "matmul_bias_gelu",
        [a, w, bias],
        [ops.gelu(ops.add(ops.matmul(a, w), bias))],
        lambda a, w, b: (np_gelu(a.astype(np.float64) @ w + b),),
    )
    ba, bb2 = _ph((3, 9, 7), "ba"), _ph((3, 7, 5), "bb")
    add(
        "batched_matmul", [ba, bb2], [ops.matmul(ba, bb2)], lambda a, b: (a.astype(np.float64) @ b,)
    )
    X, W = _ph((2, 4, 9, 9), "X"), _ph((6, 2, 3, 3), "W")
    add(
        "conv2d_stride_pad_groups_relu",
        [X, W],
        [ops.relu(ops.conv2d(X, W, stride=2, padding=1, groups=2))],
        lambda x, w: (np.maximum(np_conv2d(x, w, 2, 1, 1, 2), 0),),
    )
    add(
        "conv2d_dilation",
        [X, W],
        [ops.conv2d(X, W, padding=2, dilation=2, groups=2)],
        lambda x, w: (np_conv2d(x, w, 1, 2, 2, 2),),
    )

    # Pooling and layout.
    def np_maxpool(x, k=3, s=2, p=1):
        xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)), constant_values=-np.inf)
        oh = (x.shape[2] + 2 * p - k) // s + 1
        ow = (x.shape[3] + 2 * p - k) // s + 1
        out = np.full(x.shape[:2] + (oh, ow), -np.inf)
        for u in range(k):
            for v in range(k):
                out = np.maximum(out, xp[:, :, u : u + s * oh : s, v : v + s * ow : s])
        return out

    add("max_pool2d", [X], [ops.max_pool2d(X, 3, 2, 1)], lambda x: (np_maxpool(x),))
    add(
        "avg_pool2d",
        [X],
        [ops.avg_pool2d(X, 2)],
        lambda x: (x[:, :, :8, :8].reshape(2, 4, 4, 2, 4, 2).mean(axis=(3, 5)),),
    )
    add("transpose", [x3], [ops.transpose(x3, (2, 0, 1))], lambda x: (x.transpose(2, 0, 1),))
    add(
        "reshape",
        [x3],
        [ops.reshape(ops.exp(x3), (7, -1))],
        lambda x: (np.exp(x).reshape(7, -1),),
    )
    y3 = _ph((3, 4, 11), "y3")
    add(
        "concat",
        [x3, y3],
        [ops.concat([x3, ops.neg(y3)], axis=1)],
        lambda x, y: (np.concatenate([x, -y], axis=1),),
    )
    add(
        "slice",
        [x3],
        [ops.slice(x3, [1, 2], [7, 11], axes=[1, 2], steps=[2, 3])],
        lambda x: (x[:, 1:7:2, 2:11:3],),
    )
    add(
        "pad",
        [x3],
        [ops.pad(x3, [(0, 0), (1, 2), (3, 0)], value=0.5)],
        lambda x: (np.pad(x, ((0, 0), (1, 2), (3, 0)), constant_values=0.5),),
    )
    # Two outputs.
    add(
        "two_outputs",
        [xs],
        [ops.exp(xs), ops.reduce_sum(ops.mul(xs, xs), axis=1)],
        lambda x: (np.exp(x), (x * x).sum(1)),
    )
    return cases
