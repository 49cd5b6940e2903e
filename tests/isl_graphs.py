"""The graphs of issue 19 items 9 and 10, built with polyfuse's ops (no torch), and the isl
scheduler input of the first, as isl text. Shared by tests/test_isl_bounded.py and the child
processes it compiles them in (which must not need the code under test to import this)."""

from __future__ import annotations

import islpy as isl

from polyfuse import ops, te
from polyfuse.poly.schedule import MAX_COEFFICIENT, configure


def swin_tail(c: int = 96, hw: int = 16, pad: int = 5, shift: int = 3, rename=None):
    """x (1, hw, hw, c) → LayerNorm(c) → pad H and W by ``pad`` after → roll by -``shift``
    along H then W, as torch.onnx exports it (two slices and a concat per axis), under the
    names the ONNX importer gives swin_t's nodes (or ``rename`` of them)."""
    n = rename or (lambda s: s)
    x = te.placeholder((1, hw, hw, c), name=n("x"))
    g = te.placeholder((c,), name=n("ln_weight"))
    b = te.placeholder((c,), name=n("ln_bias"))
    h = ops.layer_norm(x, g, b, name=n("_ln_LayerNormalization_ln20"))
    p = ops.pad(h, ((0, 0), (0, pad), (0, pad), (0, 0)), name=n("_Pad_pad23"))
    e = hw + pad
    s1 = ops.slice(p, [shift], [e], [1], name=n("_Slice_1_slice24"))
    s2 = ops.slice(p, [0], [shift], [1], name=n("_Slice_2_slice25"))
    r1 = ops.concat([s1, s2], axis=1, name=n("_Concat_1_concat26"))
    s3 = ops.slice(r1, [shift], [e], [2], name=n("_Slice_3_slice27"))
    s4 = ops.slice(r1, [0], [shift], [2], name=n("_Slice_4_slice28"))
    out = ops.concat([s3, s4], axis=2, name=n("_Concat_2_concat29"))
    return [x, g, b], [out]


def conv_pool(length: int = 8000, channels: int = 32, kernel: int = 16, stride: int = 1):
    """x (1, 1, length) → Conv1d(1, channels, kernel, stride) with bias → ReLU → MaxPool1d(4)
    (the pool as a max over the last two dims with a (1, 4) window)."""
    x = te.placeholder((1, 1, length), name="input")
    w = te.placeholder((channels, 1, kernel), name="conv_weight")
    b = te.placeholder((channels,), name="conv_bias")
    y = ops.conv(x, w, b, stride=stride, name="_0_Conv_conv3")
    r = ops.relu(y, name="_1_Relu_relu4")
    out = ops.max_pool2d(r, (1, 4), name="_2_MaxPool_maxpool5")
    return [x, w, b], [out]


# The scheduler input of swin_t's hanging group, as the ONNX import named it (statements
# S_<primitive>; the batch dimension of size 1 is not a loop). isl's order of these names
# made its band search run for 20 minutes; every dependence is also a proximity and a
# coincidence constraint.
D = "0 <= d1 <= {0} and 0 <= d2 <= {1} and 0 <= d3 <= 95"
SWIN_DOMAIN = (
    "{ "
    + "; ".join(
        f"S__{name}[d1, d2, d3] : " + D.format(a, b)
        for name, a, b in [
            ("Slice_2_slice25", 2, 20),
            ("Concat_1_concat26", 20, 20),
            ("Slice_4_slice28", 20, 2),
            ("Pad_pad23", 20, 20),
            ("Concat_2_concat29", 20, 20),
            ("ln_LayerNormalization_ln20", 15, 15),
            ("Slice_1_slice24", 17, 20),
            ("Slice_3_slice27", 20, 17),
        ]
    )
    + "; S__ln_LayerNormalization_ln20_rstd[d1, d2] : 0 <= d1 <= 15 and 0 <= d2 <= 15 }"
)
SWIN_DEPS = """{
  S__Slice_4_slice28[i0, i1, i2] -> S__Concat_2_concat29[i0, 18 + i1, i2]
    : 0 <= i0 <= 20 and 0 <= i1 <= 2 and 0 <= i2 <= 95;
  S__Concat_1_concat26[i0, i1, i2] -> S__Slice_3_slice27[i0, -3 + i1, i2]
    : 0 <= i0 <= 20 and 3 <= i1 <= 20 and 0 <= i2 <= 95;
  S__Slice_1_slice24[i0, i1, i2] -> S__Concat_1_concat26[i0, i1, i2]
    : 0 <= i0 <= 17 and 0 <= i1 <= 20 and 0 <= i2 <= 95;
  S__Concat_1_concat26[i0, i1, i2] -> S__Slice_4_slice28[i0, i1, i2]
    : 0 <= i0 <= 20 and 0 <= i1 <= 2 and 0 <= i2 <= 95;
  S__Pad_pad23[i0, i1, i2] -> S__Slice_2_slice25[i0, i1, i2]
    : 0 <= i0 <= 2 and 0 <= i1 <= 20 and 0 <= i2 <= 95;
  S__Slice_2_slice25[i0, i1, i2] -> S__Concat_1_concat26[18 + i0, i1, i2]
    : 0 <= i0 <= 2 and 0 <= i1 <= 20 and 0 <= i2 <= 95;
  S__ln_LayerNormalization_ln20[i0, i1, i2] -> S__Pad_pad23[i0, i1, i2]
    : 0 <= i0 <= 15 and 0 <= i1 <= 15 and 0 <= i2 <= 95;
  S__ln_LayerNormalization_ln20_rstd[i0, i1] -> S__ln_LayerNormalization_ln20[i0, i1, i2]
    : 0 <= i0 <= 15 and 0 <= i1 <= 15 and 0 <= i2 <= 95;
  S__Slice_3_slice27[i0, i1, i2] -> S__Concat_2_concat29[i0, i1, i2]
    : 0 <= i0 <= 20 and 0 <= i1 <= 17 and 0 <= i2 <= 95;
  S__Pad_pad23[i0, i1, i2] -> S__Slice_1_slice24[-3 + i0, i1, i2]
    : 3 <= i0 <= 20 and 0 <= i1 <= 20 and 0 <= i2 <= 95
}"""


def swin_constraints(ctx: isl.Context) -> isl.ScheduleConstraints:
    """The swin_t group's scheduler input on ``ctx`` (configured as polyfuse configures it)."""
    configure(ctx)
    deps = isl.UnionMap(SWIN_DEPS, context=ctx)
    return (
        isl.ScheduleConstraints.on_domain(isl.UnionSet(SWIN_DOMAIN, context=ctx))
        .set_validity(deps)
        .set_proximity(deps)
        .set_coincidence(deps)
    )


def swin_call(ctx: isl.Context):
    """The scheduler call on it, with polyfuse's bound on the schedule coefficients."""
    sc = swin_constraints(ctx)
    ctx.set_schedule_max_coefficient(MAX_COEFFICIENT)
    return sc.compute_schedule
