"""The GPU benchmark's cases and their peers: each case's computation written once over an
array namespace (torch or jax.numpy), so PyTorch eager, torch.compile, JAX and the float64
reference all compute what polyfuse's graph computes (tests/test_gpu_benchmark.py checks it
against the suite's and the examples' numpy references)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

LN_EPS = BN_EPS = 1e-5
RMS_EPS = 1e-6
ADAM = {"step": 10, "lr": 1e-3, "b1": 0.9, "b2": 0.999, "eps": 1e-8}


class Ops:
    """The few operations whose spelling differs between torch and jax.numpy."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        if kind == "torch":
            import torch

            self.m = torch
        else:
            import jax
            import jax.numpy as jnp

            # XLA computes float32 products in TF32 on tensor cores by default; TF32 is off
            # for every peer here (the 2026-11-25 run without this had XLA at 0.42 ms for
            # a 4096³ float32 matmul, 6× above the FP32 peak)
            jax.config.update("jax_default_matmul_precision", "highest")
            self.m, self.jax = jnp, jax

    def mean(self, x, axis, keepdims=True):
        if self.kind == "torch":
            return self.m.mean(x, dim=axis, keepdim=keepdims)
        return self.m.mean(x, axis=axis, keepdims=keepdims)

    def sum(self, x, axis, keepdims=False):
        if self.kind == "torch":
            return self.m.sum(x, dim=axis, keepdim=keepdims)
        return self.m.sum(x, axis=axis, keepdims=keepdims)

    def max(self, x, axis, keepdims=True):
        if self.kind == "torch":
            return self.m.amax(x, dim=axis, keepdim=keepdims)
        return self.m.max(x, axis=axis, keepdims=keepdims)

    def erf(self, x):
        return self.m.erf(x) if self.kind == "torch" else self.jax.scipy.special.erf(x)

    def sigmoid(self, x):
        return self.m.sigmoid(x) if self.kind == "torch" else self.jax.nn.sigmoid(x)

    def relu(self, x):
        return self.m.relu(x) if self.kind == "torch" else self.m.maximum(x, 0.0)

    def softmax(self, x, axis=-1):
        e = self.m.exp(x - self.max(x, axis))
        return e / self.sum(e, axis, keepdims=True)

    def swap_last(self, x):
        return x.transpose(-1, -2) if self.kind == "torch" else self.m.swapaxes(x, -1, -2)

    def conv2d(self, x, w, padding):
        if self.kind == "torch":
            return self.m.nn.functional.conv2d(x, w, padding=padding)
        return self.jax.lax.conv_general_dilated(
            x, w, (1, 1), [(padding, padding)] * 2, dimension_numbers=("NCHW", "OIHW", "NCHW")
        )


def _ln(o: Ops, x, g, b):
    m = o.mean(x, -1)
    d = x - m
    return d / o.m.sqrt(o.mean(d * d, -1) + LN_EPS) * g + b


def _gelu_erf(o: Ops, u):
    return 0.5 * u * (1.0 + o.erf(u * (1.0 / math.sqrt(2.0))))


def _adam3(o: Ops, *a):
    bc1 = 1.0 - ADAM["b1"] ** ADAM["step"]
    bc2 = 1.0 - ADAM["b2"] ** ADAM["step"]
    out = []
    for j in range(3):
        p, g, m, v = a[4 * j : 4 * j + 4]
        m2 = m * ADAM["b1"] + g * (1.0 - ADAM["b1"])
        v2 = v * ADAM["b2"] + g * g * (1.0 - ADAM["b2"])
        p2 = p - (m2 / bc1) / (o.m.sqrt(v2 / bc2) + ADAM["eps"]) * ADAM["lr"]
        out += [p2, m2, v2]
    return tuple(out)


def _lstm(o: Ops, gates, c):
    hd = c.shape[-1]
    i, f, g, out = (gates[:, j * hd : (j + 1) * hd] for j in range(4))
    c2 = o.sigmoid(f) * c + o.sigmoid(i) * o.m.tanh(g)
    return o.sigmoid(out) * o.m.tanh(c2), c2


def _batchnorm(o: Ops, x, gamma, beta):
    mu = o.mean(x, (0, 2, 3))
    d = x - mu
    var = o.mean(d * d, (0, 2, 3))
    return o.relu(d / o.m.sqrt(var + BN_EPS) * gamma + beta), mu, var


def _attention(o: Ops, q, k, v):
    scale = 1.0 / math.sqrt(q.shape[-1])
    return o.softmax(q @ o.swap_last(k) * scale) @ v


#: case name -> peer function ``(ops, *inputs) -> output or tuple of outputs``.
PEERS: dict[str, Callable[..., Any]] = {
    "layernorm": lambda o, x, g, b: _ln(o, x, g, b),
    "layernorm_lib": lambda o, x, g, b: _ln(o, x, g, b),
    "softmax": lambda o, x: o.softmax(x),
    "log_softmax": lambda o, x: (
        (x - o.max(x, -1)) - o.m.log(o.sum(o.m.exp(x - o.max(x, -1)), -1, keepdims=True))
    ),
    "bias_gelu_tanh": lambda o, x, b: (
        lambda u: 0.5 * u * (1.0 + o.m.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u * u * u)))
    )(x + b),
    "residual_layernorm": lambda o, x, r, g, b: _ln(o, x + r, g, b),
    "attn_softmax": lambda o, s, mask: o.softmax(s * 0.125 + mask),
    "lstm_cell": _lstm,
    "batchnorm_train_relu": _batchnorm,
    "adam3": _adam3,
    "two_branches": lambda o, x1, x2: (o.relu(x1 * 2.0 + 1.0), o.sum(x2 * x2, -1)),
    "rmsnorm_swiglu": lambda o, x, w, a, b: (
        x / o.m.sqrt(o.mean(x * x, -1) + RMS_EPS) * w,
        a * o.sigmoid(a) * b,
    ),
    "ffn_up_gelu": lambda o, a, w, bias: _gelu_erf(o, a @ w + bias),
    "matmul_4096": lambda o, a, w, bias: _gelu_erf(o, a @ w + bias),
    "conv3x3_relu": lambda o, x, w, bias: o.relu(o.conv2d(x, w, 1) + bias[None, :, None, None]),
    "attention_s128": _attention,
    "attention_s512": _attention,
    "matmul_bf16": lambda o, a, w: a @ w,
    "matmul_bf16_s1": lambda o, a, w: a @ w,
    "matmul_bf16_s3": lambda o, a, w: a @ w,
    "matmul_bf16_s4": lambda o, a, w: a @ w,
    "matmul_bf16_f1": lambda o, a, w: a @ w,
    "matmul_bf16_k64_s2": lambda o, a, w: a @ w,
    "matmul_bf16_k64_s3": lambda o, a, w: a @ w,
    "matmul_bf16_k64_s4": lambda o, a, w: a @ w,
    "matmul_bf16_t128x128w4": lambda o, a, w: a @ w,
    "matmul_bf16_t128x128": lambda o, a, w: a @ w,
    "matmul_bf16_t256x128": lambda o, a, w: a @ w,
    "matmul_tf32": lambda o, a, w: a @ w,
    "matmul_tf32_k32_s3": lambda o, a, w: a @ w,
    "ffn_up_gelu_bf16": lambda o, a, w, bias: _gelu_erf(o, a @ w + bias),
    "ffn_up_gelu_bf16_k64_s3": lambda o, a, w, bias: _gelu_erf(o, a @ w + bias),
    "conv3x3_relu_bf16": lambda o, x, w, bias: o.relu(
        o.conv2d(x, w, 1) + bias[None, :, None, None]
    ),
    "attention_s512_bf16": _attention,
    "ffn_down_bf16": lambda o, a, w: a @ w,
    "ffn_down_bf16_t96x64": lambda o, a, w: a @ w,
    "ffn_down_bf16_rolled": lambda o, a, w: a @ w,
    "ffn_down_f32": lambda o, a, w: a @ w,
    "ffn_down_f32_k1": lambda o, a, w: a @ w,
}

SUITE = (
    "layernorm",
    "layernorm_lib",
    "softmax",
    "log_softmax",
    "bias_gelu_tanh",
    "residual_layernorm",
    "attn_softmax",
    "lstm_cell",
    "batchnorm_train_relu",
    "adam3",
    "two_branches",
    "rmsnorm_swiglu",
)
#: The compute cases of ../shared/bench/gpu/README.md: (example, arguments at full size).
COMPUTE: dict[str, tuple[str, dict[str, int]]] = {
    "ffn_up_gelu": ("matmul_bias_gelu", {"m": 8192, "k": 768, "n": 3072}),
    "matmul_4096": ("matmul_bias_gelu", {"m": 4096, "k": 4096, "n": 4096}),
    "conv3x3_relu": ("conv2d_relu", {"batch": 32, "channels": 64, "size": 56, "filters": 64}),
    "attention_s128": ("attention", {"batch": 16, "heads": 12, "seq": 128, "dim": 64}),
    "attention_s512": ("attention", {"batch": 8, "heads": 12, "seq": 512, "dim": 64}),
}


@dataclass(frozen=True)
class TensorCase:
    """A case compiled with its own dtype and mapping (the tensor-core cases of issue 23,
    split-K): an example (``matmul``: a plain ``a @ w``) at full size, the dtype of every
    tensor, the ``MappingConfig`` fields it compiles with, the math that bounds it (``bf16`` /
    ``tf32`` / ``fp32``: its floor uses the cuBLAS rate measured in that math) and
    the peers timed beside it (a stage variant times polyfuse alone: it is compared with its
    sibling)."""

    example: str
    args: dict[str, int]
    dtype: str
    math: str
    mapping: dict[str, Any] = field(default_factory=dict)
    peers: tuple[str, ...] = ("eager", "inductor")


_MM4096 = {"m": 4096, "k": 4096, "n": 4096}
_FFN = {"m": 8192, "k": 768, "n": 3072}
#: BERT-base's FFN down projection at batch 8 x 128 tokens
_FFN_DOWN = {"m": 1024, "k": 3072, "n": 768}


def _k(block_k: int, stages: int) -> dict[str, int]:
    """A forced k-tile and stage count (a variant timed beside the model's choice)."""
    return {"mma_block_k": block_k, "gemm_stages": stages}


def _t(block_m: int, block_n: int, warps_m: int, warps_n: int) -> dict[str, Any]:
    """A forced block tile and warp grid (``MappingConfig.mma_tile``) timed beside the
    model's."""
    return {"mma_tile": (block_m, block_n, warps_m, warps_n)}


#: Tensor-core cases: bf16 4096³ at the stage model's S and at S = 1, 3, 4 (pipelined vs one
#: stage), with single-buffered register fragments (``_f1``), with 64-deep k-tiles at
#: S = 2..4 (dynamic shared memory past 48 KB), at other block tiles (``_t``: 128x128 of four
#: 64x64 warps, two blocks per SM, whose barriers the other block hides; of eight 64x32
#: warps; 256x128), tf32 4096³ (``allow_tf32``; its peers run
#: with TF32 on), the BERT-base FFN, a conv and attention in bf16, and the BERT-base FFN down
#: projection (1024 x 768 x 3072: the model's 64x64, 192 blocks on 132 SMs) beside 96x64 (132
#: blocks; modelled 24.6 against 31.4 us, not among the model's candidates until measured) and
#: beside its steady k-tile loop kept rolled (``_rolled``: stage counters at run time, 2.9
#: other instructions per HMMA in SASS against 1.7-1.8 unrolled by its 4 stages).
#: JAX is not timed for them (its float32 precision is set globally).
TENSOR_CORE: dict[str, TensorCase] = {
    "matmul_bf16": TensorCase("matmul", _MM4096, "bfloat16", "bf16"),
    "matmul_bf16_s1": TensorCase("matmul", _MM4096, "bfloat16", "bf16", {"gemm_stages": 1}, ()),
    "matmul_bf16_s3": TensorCase("matmul", _MM4096, "bfloat16", "bf16", {"gemm_stages": 3}, ()),
    "matmul_bf16_s4": TensorCase("matmul", _MM4096, "bfloat16", "bf16", {"gemm_stages": 4}, ()),
    "matmul_bf16_f1": TensorCase(
        "matmul", _MM4096, "bfloat16", "bf16", {"mma_fragment_buffers": 1}, ()
    ),
    "matmul_bf16_k64_s2": TensorCase("matmul", _MM4096, "bfloat16", "bf16", _k(64, 2), ()),
    "matmul_bf16_k64_s3": TensorCase("matmul", _MM4096, "bfloat16", "bf16", _k(64, 3), ()),
    "matmul_bf16_k64_s4": TensorCase("matmul", _MM4096, "bfloat16", "bf16", _k(64, 4), ()),
    "matmul_bf16_t128x128w4": TensorCase(
        "matmul", _MM4096, "bfloat16", "bf16", _t(128, 128, 2, 2), ()
    ),
    "matmul_bf16_t128x128": TensorCase(
        "matmul", _MM4096, "bfloat16", "bf16", _t(128, 128, 2, 4), ()
    ),
    "matmul_bf16_t256x128": TensorCase(
        "matmul", _MM4096, "bfloat16", "bf16", _t(256, 128, 4, 2), ()
    ),
    "matmul_tf32": TensorCase("matmul", _MM4096, "float32", "tf32", {"allow_tf32": True}),
    "matmul_tf32_k32_s3": TensorCase(
        "matmul", _MM4096, "float32", "tf32", {"allow_tf32": True, **_k(32, 3)}, ()
    ),
    "ffn_up_gelu_bf16": TensorCase("matmul_bias_gelu", _FFN, "bfloat16", "bf16"),
    "ffn_up_gelu_bf16_k64_s3": TensorCase(
        "matmul_bias_gelu", _FFN, "bfloat16", "bf16", _k(64, 3), ()
    ),
    "conv3x3_relu_bf16": TensorCase(
        "conv2d_relu", COMPUTE["conv3x3_relu"][1], "bfloat16", "bf16", {}, ("eager",)
    ),
    "attention_s512_bf16": TensorCase(
        "attention", COMPUTE["attention_s512"][1], "bfloat16", "bf16", {}, ("eager",)
    ),
    "ffn_down_bf16": TensorCase("matmul", _FFN_DOWN, "bfloat16", "bf16"),
    "ffn_down_bf16_t96x64": TensorCase(
        "matmul", _FFN_DOWN, "bfloat16", "bf16", _t(96, 64, 2, 2), ()
    ),
    "ffn_down_bf16_rolled": TensorCase(
        "matmul", _FFN_DOWN, "bfloat16", "bf16", {"mma_stage_unroll": False}, ()
    ),
}
#: Split-K (``poly/split_k.py``): BERT-base's FFN down projection (batch 8 x 128 tokens) in
#: float32, whose one-stage tiles leave SMs idle, at the model's choice (a reduction in parts)
#: and in one stage (``split_k=1``), beside cuBLAS FP32 (TF32 off).
SPLIT_K: dict[str, TensorCase] = {
    "ffn_down_f32": TensorCase("matmul", _FFN_DOWN, "float32", "fp32", {}, ("eager",)),
    "ffn_down_f32_k1": TensorCase("matmul", _FFN_DOWN, "float32", "fp32", {"split_k": 1}, ()),
}
#: every case compiled with its own dtype and mapping fields
CONFIGURED: dict[str, TensorCase] = {**TENSOR_CORE, **SPLIT_K}
CASES = (*SUITE, *COMPUTE, *CONFIGURED)
_BATCH_KEY = {"matmul": "m", "matmul_bias_gelu": "m", "conv2d_relu": "batch", "attention": "batch"}


def _example(name: str) -> tuple[str, dict[str, int]]:
    if name in CONFIGURED:
        return CONFIGURED[name].example, CONFIGURED[name].args
    return COMPUTE[name]


def _compute_args(name: str, scale: int) -> dict[str, int]:
    """A compute case's example arguments; ``scale`` divides the batch-like dimension."""
    example, args = _example(name)
    args = dict(args)
    key = _BATCH_KEY[example]
    args[key] = max(1, args[key] // scale)
    if example == "attention" and scale > 1:
        args["heads"] = max(1, args["heads"] // 4)
    return args


def _flops(name: str, args: dict[str, int]) -> float:
    """Multiply-add FLOPs of a compute case (2 per MAC); 0 for the memory-bound suite."""
    if name not in COMPUTE and name not in CONFIGURED:
        return 0.0
    example = _example(name)[0]
    if example in ("matmul", "matmul_bias_gelu"):
        return 2.0 * args["m"] * args["k"] * args["n"]
    if example == "conv2d_relu":
        s = args["size"]
        return 2.0 * args["batch"] * args["filters"] * s * s * args["channels"] * 9
    b, h, s, d = args["batch"], args["heads"], args["seq"], args["dim"]
    return 2.0 * 2.0 * b * h * s * s * d
