"""Transformer models: BERT-base encoder, GPT-2 small block stack, ViT-B/16.

Each ``*_model(b, cfg)`` is written against a backend ``b`` (:mod:`polyfuse.zoo.backend`) and
returns the list of outputs. Linear layers are ``matmul`` + bias; attention is batched matmuls
over ``(batch, heads, seq, head_dim)`` with a softmax over the keys.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["BERT", "GPT2", "VIT", "bert_model", "gpt2_model", "vit_model"]

#: Full and tiny configurations (batch, seq, hidden, heads, ffn, layers).
BERT = {
    "full": dict(batch=8, seq=128, hidden=768, heads=12, ffn=3072, layers=12),
    "tiny": dict(batch=2, seq=8, hidden=32, heads=2, ffn=64, layers=2),
}
GPT2 = {
    "full": dict(batch=8, seq=128, hidden=768, heads=12, ffn=3072, layers=12),
    "tiny": dict(batch=2, seq=8, hidden=32, heads=2, ffn=64, layers=2),
}
VIT = {
    "full": dict(
        batch=8, image=224, patch=16, hidden=768, heads=12, ffn=3072, layers=12, classes=1000
    ),
    "tiny": dict(batch=2, image=16, patch=8, hidden=32, heads=2, ffn=64, layers=2, classes=10),
}


def linear(b: Any, x: Any, d_in: int, d_out: int, name: str) -> Any:
    """``x @ W + bias`` with ``W: (d_in, d_out)``."""
    w = b.param(f"{name}_w", (d_in, d_out))
    bias = b.param(f"{name}_bias", (d_out,), "zero")
    return b.add(b.matmul(x, w), bias)


def layer_norm(b: Any, x: Any, hidden: int, name: str) -> Any:
    """Layer norm over the last dim with learned scale and shift."""
    g = b.param(f"{name}_gamma", (hidden,), "one")
    s = b.param(f"{name}_beta", (hidden,), "zero")
    return b.layer_norm(x, g, s, 1e-5)


def attention(b: Any, x: Any, cfg: dict, name: str, mask: Any = None) -> Any:
    """Multi-head self-attention on ``x: (B, S, H)``; ``mask`` (S, S) is added to the scores."""
    bs, s, h, nh = cfg["batch"], cfg["seq"], cfg["hidden"], cfg["heads"]
    d = h // nh

    def heads(t: Any, perm: tuple[int, ...]) -> Any:
        return b.transpose(b.reshape(t, (bs, s, nh, d)), perm)

    q = heads(linear(b, x, h, h, f"{name}_q"), (0, 2, 1, 3))  # (B, nh, S, d)
    k = heads(linear(b, x, h, h, f"{name}_k"), (0, 2, 3, 1))  # (B, nh, d, S)
    v = heads(linear(b, x, h, h, f"{name}_v"), (0, 2, 1, 3))
    scores = b.mul(b.matmul(q, k), 1.0 / math.sqrt(d))
    if mask is not None:
        scores = b.add(scores, mask)
    p = b.softmax(scores, -1)
    ctx = b.reshape(b.transpose(b.matmul(p, v), (0, 2, 1, 3)), (bs, s, h))
    return linear(b, ctx, h, h, f"{name}_o")


def mlp(b: Any, x: Any, cfg: dict, name: str, approximate: str = "none") -> Any:
    """The feed-forward block: linear, GELU, linear."""
    h, f = cfg["hidden"], cfg["ffn"]
    return linear(b, b.gelu(linear(b, x, h, f, f"{name}_fc1"), approximate), f, h, f"{name}_fc2")


def post_ln_layer(b: Any, x: Any, cfg: dict, name: str) -> Any:
    """A BERT (post-LN) encoder layer."""
    h = cfg["hidden"]
    a = layer_norm(b, b.add(x, attention(b, x, cfg, f"{name}_attn")), h, f"{name}_ln1")
    return layer_norm(b, b.add(a, mlp(b, a, cfg, f"{name}_ffn")), h, f"{name}_ln2")


def pre_ln_layer(b: Any, x: Any, cfg: dict, name: str, mask: Any = None, approx: str = "none"):
    """A GPT-2 / ViT (pre-LN) block."""
    h = cfg["hidden"]
    x = b.add(x, attention(b, layer_norm(b, x, h, f"{name}_ln1"), cfg, f"{name}_attn", mask))
    return b.add(x, mlp(b, layer_norm(b, x, h, f"{name}_ln2"), cfg, f"{name}_mlp", approx))


def bert_model(b: Any, cfg: dict) -> list[Any]:
    """BERT encoder from the embedding output ``(B, S, H)`` to the last hidden states."""
    x = b.input("embeddings", (cfg["batch"], cfg["seq"], cfg["hidden"]))
    for i in range(cfg["layers"]):
        x = post_ln_layer(b, x, cfg, f"layer{i}")
    return [x]


def gpt2_model(b: Any, cfg: dict) -> list[Any]:
    """GPT-2 block stack (pre-LN, tanh GELU) with the causal mask as an additive input."""
    s = cfg["seq"]
    x = b.input("embeddings", (cfg["batch"], s, cfg["hidden"]))
    mask = b.input("causal_mask", (s, s), kind="causal_mask")
    for i in range(cfg["layers"]):
        x = pre_ln_layer(b, x, cfg, f"block{i}", mask, "tanh")
    return [layer_norm(b, x, cfg["hidden"], "ln_f")]


def vit_model(b: Any, cfg: dict) -> list[Any]:
    """ViT: patch embedding as a strided conv, class token, position embedding, pre-LN
    encoder, final norm and a linear head on the class token."""
    bs, img, p, h = cfg["batch"], cfg["image"], cfg["patch"], cfg["hidden"]
    n = (img // p) ** 2
    x = b.input("image", (bs, 3, img, img))
    w = b.param("patch_embed_w", (h, 3, p, p))
    bias = b.param("patch_embed_bias", (h,), "zero")
    e = b.conv2d(x, w, bias, stride=p)  # (B, H, img/p, img/p)
    e = b.transpose(b.reshape(e, (bs, h, n)), (0, 2, 1))  # (B, N, H)
    cls = b.broadcast_to(b.param("cls_token", (1, 1, h), "zero"), (bs, 1, h))
    x = b.add(b.concat([cls, e], 1), b.param("pos_embed", (1, n + 1, h), "zero"))
    seq_cfg = dict(cfg, seq=n + 1)
    for i in range(cfg["layers"]):
        x = pre_ln_layer(b, x, seq_cfg, f"block{i}")
    x = layer_norm(b, x, h, "ln_f")
    cls_out = b.reshape(b.slice(x, [0], [1], [1]), (bs, h))
    return [linear(b, cls_out, h, cfg["classes"], "head")]
