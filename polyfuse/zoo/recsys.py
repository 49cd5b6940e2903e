"""Recommendation models: Wide&Deep and DeepFM.

Embedding lookups are gathers, which polyfuse treats as outside the graph: the looked-up
embeddings are inputs ``(batch, fields, dim)`` (and DeepFM's first-order weights
``(batch, fields)``), as an ONNX export after the Gather would see them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["DEEPFM", "WIDE_DEEP", "deepfm_model", "wide_deep_model"]

WIDE_DEEP = {
    "full": dict(batch=512, fields=26, dim=16, dense=13, wide=1024, mlp=(1024, 512, 256)),
    "tiny": dict(batch=4, fields=3, dim=4, dense=5, wide=6, mlp=(8, 6)),
}
DEEPFM = {
    "full": dict(batch=512, fields=39, dim=10, mlp=(400, 400, 400)),
    "tiny": dict(batch=4, fields=3, dim=4, mlp=(8, 6)),
}


def mlp(b: Any, x: Any, d_in: int, widths: Sequence[int], name: str) -> Any:
    """ReLU MLP followed by a linear layer to one logit: ``(B, d_in) -> (B, 1)``."""
    for i, w in enumerate((*widths, 1)):
        x = b.add(
            b.matmul(x, b.param(f"{name}{i}_w", (d_in, w))),
            b.param(f"{name}{i}_bias", (w,), "zero"),
        )
        if i < len(widths):
            x = b.relu(x)
        d_in = w
    return x


def wide_deep_model(b: Any, cfg: dict) -> list[Any]:
    """Wide (linear over sparse cross features) + deep (MLP over embeddings and dense
    features); sigmoid of the summed logits, ``(B, 1)``."""
    bs, f, d = cfg["batch"], cfg["fields"], cfg["dim"]
    emb = b.input("embeddings", (bs, f, d))
    dense = b.input("dense_features", (bs, cfg["dense"]))
    wide = b.input("wide_features", (bs, cfg["wide"]))
    deep_in = b.concat([b.reshape(emb, (bs, f * d)), dense], 1)
    deep = mlp(b, deep_in, f * d + cfg["dense"], cfg["mlp"], "deep")
    wide_logit = b.add(
        b.matmul(wide, b.param("wide_w", (cfg["wide"], 1))), b.param("wide_bias", (1,), "zero")
    )
    return [b.sigmoid(b.add(wide_logit, deep))]


def deepfm_model(b: Any, cfg: dict) -> list[Any]:
    """DeepFM: first-order term + FM second-order term
    ``0.5 * sum_d((sum_f v)^2 - sum_f v^2)`` + deep MLP; sigmoid, ``(B, 1)``."""
    bs, f, d = cfg["batch"], cfg["fields"], cfg["dim"]
    emb = b.input("embeddings", (bs, f, d))
    first = b.input("first_order", (bs, f))
    first_term = b.reduce_sum(first, 1, keepdims=True)  # (B, 1)
    s = b.reduce_sum(emb, 1)  # (B, d)
    sq = b.reduce_sum(b.mul(emb, emb), 1)  # (B, d)
    fm = b.mul(b.reduce_sum(b.sub(b.mul(s, s), sq), 1, keepdims=True), 0.5)  # (B, 1)
    deep = mlp(b, b.reshape(emb, (bs, f * d)), f * d, cfg["mlp"], "deep")
    bias = b.param("global_bias", (1,), "zero")
    return [b.sigmoid(b.add(b.add(b.add(first_term, fm), deep), bias))]
