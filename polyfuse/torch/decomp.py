"""PyTorch's fused inference operators, written as the plain operators polyfuse lowers.

In inference, ``nn.TransformerEncoderLayer`` and ``nn.MultiheadAttention`` take PyTorch's
"fast path": Dynamo then records one fused operator (``aten._transformer_encoder_layer_fwd``,
``aten._native_multi_head_attention``) where eager mode would have run linears, a softmax and
layer norms; ``F.scaled_dot_product_attention`` picks a device kernel
(``aten._scaled_dot_product_flash_attention`` and its siblings). None of these is in PyTorch's
core-ATen decomposition table, so without the functions here the whole layer stays in PyTorch.
Likewise an ``nn.LSTM`` traced on the CPU (Dynamo's ``allow_rnn``) records one
``aten.mkldnn_rnn_layer`` per layer and direction (oneDNN's kernel), written here as its
unrolled steps.

:func:`decomposition_table` is the table the backend hands AOT autograd: core ATen, plus one
function per fused operator that computes the same thing from ``linear``, ``layer_norm``,
``matmul`` and a softmax (AOT autograd decomposes those further), minus ``_safe_softmax``,
which polyfuse lowers whole (:mod:`.lower`) rather than as ``where``/``any`` on booleans.

Masks: a mask becomes an additive bias (bool → ``0``/``-inf``: ``full`` and ``where``, and a
causal mask's ``tril`` as ``arange`` comparisons), which polyfuse lowers with the bool
tensors, so the attention and its masks are one polyfuse region. Semantics follow the C++
kernels: a multi-head-attention mask is boolean (``True`` or non-zero = masked out, as
``_masked_softmax`` reads it); an SDPA ``attn_mask`` is boolean (``True`` = attend) or
additive. Fully masked rows give zeros in SDPA
(``_safe_softmax``) and NaN in the fast path's ``_masked_softmax``, as in PyTorch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["FUSED_DECOMPOSITIONS", "decomposition_table"]

aten = torch.ops.aten


def _neg_inf_where(masked: Tensor, dtype: torch.dtype) -> Tensor:
    """``-inf`` where ``masked`` holds, else ``0`` (a mask-only computation, left eager)."""
    zeros = torch.zeros(masked.shape, dtype=dtype, device=masked.device)
    return zeros.masked_fill(masked, float("-inf"))


def _attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    scale: float,
    dropout_p: float = 0.0,
    safe: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    """``softmax(q k^T * scale + bias) v``; returns (output, probabilities, scores).

    With a bias, rows can be fully masked: with ``safe``, ``_safe_softmax`` makes them zeros
    as SDPA does; without, they are NaN as in ``_masked_softmax`` (the multi-head-attention
    fast path). Dropout (only when asked for: SDPA applies ``dropout_p`` even in eval mode) is
    random and stays in PyTorch.
    """
    scores = torch.matmul(q * scale, k.transpose(-2, -1))
    scores = scores if bias is None else scores + bias
    if (bias is None and dropout_p == 0.0) or not safe:
        probs = torch.softmax(scores, dim=-1)
    else:
        probs = aten._safe_softmax.default(scores, -1)
    if dropout_p > 0.0:
        probs = F.dropout(probs, dropout_p, training=True)
    return torch.matmul(probs, v), probs, scores


# --------------------------------------------------------------------------------------------
# scaled_dot_product_attention and its device kernels
# --------------------------------------------------------------------------------------------


def _sdpa_bias(attn_mask: Tensor | None, is_causal: bool, q: Tensor, k: Tensor) -> Tensor | None:
    """The additive bias of an SDPA call: causal and ``attn_mask`` (bool: True = attend)."""
    bias = None
    if is_causal:
        keep = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril()
        bias = _neg_inf_where(keep.logical_not(), q.dtype)
    if attn_mask is not None:
        m = attn_mask
        if m.dtype == torch.bool:
            m = _neg_inf_where(m.logical_not(), q.dtype)
        bias = m if bias is None else bias + m
    return bias


def _sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool = False,
) -> tuple[Tensor, Tensor]:
    """SDPA's math; returns (output, scores). The output is laid out as the fused kernels lay
    it out (``[B, L, H, E]`` in memory), so a later ``out.transpose(1, 2).view(B, L, H * E)``
    traces as it did in Dynamo."""
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    if enable_gqa and q.size(-3) != k.size(-3):
        rep = q.size(-3) // k.size(-3)
        k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
    out, _, scores = _attend(q, k, v, _sdpa_bias(attn_mask, is_causal, q, k), scale, dropout_p)
    if out.dim() == 4:
        out = out.transpose(1, 2).contiguous().transpose(1, 2)
    return out, scores


def _lse(scores: Tensor) -> Tensor:
    return torch.logsumexp(scores, dim=-1).to(torch.float32)


def _nine(query: Tensor, key: Tensor, out: Tensor, scores: Tensor) -> tuple[Any, ...]:
    """The 9 outputs of the flash / cuDNN / overrideable kernels; only the first two carry
    data (RNG state and debug outputs are empty, as in an inference call without dropout)."""
    seed = torch.zeros((), dtype=torch.int64, device=query.device)
    lse, empty = _lse(scores), query.new_empty(0)
    return (out, lse, None, None, query.size(2), key.size(2), seed, seed, empty)


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """``aten.scaled_dot_product_attention``, the same on every device (its own
    CompositeImplicit kernel would pick a device-specific fused kernel first)."""
    return _sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)[0]


def flash_attention_for_cpu(
    query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None
):
    """``aten._scaled_dot_product_flash_attention_for_cpu`` → (output, logsumexp)."""
    out, scores = _sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale)
    return out, _lse(scores)


def flash_attention(
    query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None
):
    """``aten._scaled_dot_product_flash_attention`` (CUDA)."""
    out, scores = _sdpa(query, key, value, None, dropout_p, is_causal, scale)
    return _nine(query, key, out, scores)


def efficient_attention(
    query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *,
    scale=None,
):  # fmt: skip
    """``aten._scaled_dot_product_efficient_attention`` (CUDA) → (out, lse, seed, offset)."""
    out, scores = _sdpa(query, key, value, attn_bias, dropout_p, is_causal, scale)
    lse = _lse(scores) if compute_log_sumexp else query.new_empty(0, dtype=torch.float32)
    seed = torch.zeros((), dtype=torch.int64, device=query.device)
    return out, lse, seed, seed


def cudnn_attention(
    query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
    return_debug_mask=False, *, scale=None,
):  # fmt: skip
    """``aten._scaled_dot_product_cudnn_attention`` (CUDA)."""
    out, scores = _sdpa(query, key, value, attn_bias, dropout_p, is_causal, scale)
    return _nine(query, key, out, scores)


def fused_attention_overrideable(
    query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False,
    *, scale=None,
):  # fmt: skip
    """``aten._scaled_dot_product_fused_attention_overrideable`` (out-of-tree devices)."""
    out, scores = _sdpa(query, key, value, attn_bias, dropout_p, is_causal, scale)
    return _nine(query, key, out, scores)


# --------------------------------------------------------------------------------------------
# The nn.MultiheadAttention / nn.TransformerEncoderLayer fast path
# --------------------------------------------------------------------------------------------


def _mha_bias(
    mask: Tensor | None, mask_type: int | None, scores: tuple[int, ...], dtype: torch.dtype
) -> Tensor | None:
    """A fast-path mask as an additive bias broadcastable to the ``[B, H, L, S]`` scores.

    As ``_masked_softmax``: any non-zero entry masks (a float mask is converted to bool);
    ``mask_type`` 1 is a key-padding mask ``[B, S]``; 0 (``[L, S]``) and 2 (``[B, H, L, S]``)
    broadcast right-aligned.
    """
    if mask is None:
        return None
    masked = mask if mask.dtype == torch.bool else mask != 0
    B, _, L, S = scores
    padding = mask_type == 1 or (
        mask_type is None and tuple(masked.shape) == (B, S) and (B, S) != (L, S)
    )
    if padding and masked.dim() == 2:
        masked = masked.view(B, 1, 1, S)
    return _neg_inf_where(masked, dtype)


def native_multi_head_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    embed_dim: int,
    num_head: int,
    qkv_weight: Tensor,
    qkv_bias: Tensor,
    proj_weight: Tensor,
    proj_bias: Tensor,
    mask: Tensor | None = None,
    need_weights: bool = True,
    average_attn_weights: bool = True,
    mask_type: int | None = None,
) -> tuple[Tensor, Tensor]:
    """``aten._native_multi_head_attention`` (batch-first ``[B, L, D]`` inputs).

    Self-attention projects q, k and v with one linear (one GEMM); cross-attention with three
    slices of the weight. Returns (output, attention weights — averaged over heads when
    ``average_attn_weights``; an empty tensor when not ``need_weights``).
    """
    if query is key and key is value:
        q, k, v = F.linear(query, qkv_weight, qkv_bias).chunk(3, dim=-1)
    else:
        wq, wk, wv = qkv_weight.chunk(3, dim=0)
        bq, bk, bv = qkv_bias.chunk(3, dim=0)
        q, k, v = F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)
    B, L, S, dh = query.size(0), query.size(1), key.size(1), embed_dim // num_head

    def heads(t: Tensor, n: int) -> Tensor:
        return t.reshape(B, n, num_head, dh).transpose(1, 2)

    q, k, v = heads(q, L), heads(k, S), heads(v, S)
    bias = _mha_bias(mask, mask_type, (B, num_head, L, S), q.dtype)
    ctx, probs, _ = _attend(q, k, v, bias, 1.0 / math.sqrt(dh), safe=False)
    out = F.linear(ctx.transpose(1, 2).reshape(B, L, embed_dim), proj_weight, proj_bias)
    if not need_weights:
        return out, query.new_empty(0)
    return out, probs.sum(dim=1) / num_head if average_attn_weights else probs


def transformer_encoder_layer_fwd(
    src: Tensor,
    embed_dim: int,
    num_heads: int,
    qkv_weight: Tensor,
    qkv_bias: Tensor,
    proj_weight: Tensor,
    proj_bias: Tensor,
    use_gelu: bool,
    norm_first: bool,
    eps: float,
    norm_weight_1: Tensor,
    norm_bias_1: Tensor,
    norm_weight_2: Tensor,
    norm_bias_2: Tensor,
    ffn_weight_1: Tensor,
    ffn_bias_1: Tensor,
    ffn_weight_2: Tensor,
    ffn_bias_2: Tensor,
    mask: Tensor | None = None,
    mask_type: int | None = None,
) -> Tensor:
    """``aten._transformer_encoder_layer_fwd``: self-attention + residual, then a ReLU/GELU
    feed-forward + residual, with layer norms before (``norm_first``) or after each."""

    def norm(t: Tensor, w: Tensor, b: Tensor) -> Tensor:
        return F.layer_norm(t, (embed_dim,), w, b, eps)

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    attn = native_multi_head_attention(
        x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
        mask, False, True, mask_type,
    )[0]  # fmt: skip
    x = attn + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    h = norm(x, norm_weight_2, norm_bias_2) if norm_first else x
    h = F.linear(h, ffn_weight_1, ffn_bias_1)
    h = F.gelu(h) if use_gelu else F.relu(h)
    x = F.linear(h, ffn_weight_2, ffn_bias_2) + x
    return x if norm_first else norm(x, norm_weight_2, norm_bias_2)


def masked_softmax(
    x: Tensor, mask: Tensor, dim: int | None = None, mask_type: int | None = None
) -> Tensor:
    """``aten._masked_softmax``: softmax with the ``True`` (non-zero) entries of ``mask``
    excluded (fully masked rows are NaN, as PyTorch's kernel gives)."""
    dim = x.dim() - 1 if dim is None else dim
    masked = mask if mask.dtype == torch.bool else mask != 0
    if mask_type == 1 and x.dim() == 4 and masked.dim() == 2:
        masked = masked.view(x.size(0), 1, 1, x.size(-1))
    return torch.softmax(x + _neg_inf_where(masked, x.dtype), dim)


def mkldnn_rnn_layer(
    input, w0, w1, w2, w3, hx_, cx_, reverse, batch_sizes, mode, hidden_size, num_layers,
    has_biases, bidirectional, batch_first, train,
):  # fmt: skip
    """``aten.mkldnn_rnn_layer`` (CPU), one direction of one ``nn.LSTM`` layer, unrolled over
    the sequence: every step's input projection as one matmul, then per step the recurrent
    matmul and the gates (i, f, g, o, PyTorch's order). 16-bit layers keep their gates and
    cell state in float32, as oneDNN does (rounded each step, a bfloat16 cell state drifted to
    3x eager's error over 5 steps); the matmuls read and write the layer's dtype. Returns
    (output, h_n, c_n, an empty workspace); other modes (GRU, RNN), training and packed
    sequences stay in PyTorch."""
    if mode != 2 or train or batch_sizes or bidirectional or num_layers != 1:
        return NotImplemented
    dtype = input.dtype
    acc = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    x = input.transpose(0, 1) if batch_first else input  # (seq, batch, features)
    xw = torch.matmul(x, w0.t()).to(acc)
    if has_biases:
        xw = xw + (w2.to(acc) + w3.to(acc))
    h, c = hx_[0], cx_[0].to(acc)
    seq = x.size(0)
    outs: list[Tensor | None] = [None] * seq
    for t in reversed(range(seq)) if reverse else range(seq):
        i, f, g, o = (xw[t] + torch.matmul(h, w1.t()).to(acc)).chunk(4, 1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = (torch.sigmoid(o) * torch.tanh(c)).to(dtype)
        outs[t] = h
    y = torch.stack(outs, 1 if batch_first else 0)  # type: ignore[arg-type]
    workspace = torch.empty(0, device=input.device, dtype=torch.uint8)
    return y, h.unsqueeze(0), c.to(dtype).unsqueeze(0), workspace


#: Fused operator → its decomposition (each entry's docstring says which overload it is).
FUSED_DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    aten._transformer_encoder_layer_fwd.default: transformer_encoder_layer_fwd,
    aten._native_multi_head_attention.default: native_multi_head_attention,
    aten._masked_softmax.default: masked_softmax,
    aten.scaled_dot_product_attention.default: scaled_dot_product_attention,
    aten._scaled_dot_product_flash_attention_for_cpu.default: flash_attention_for_cpu,
    aten._scaled_dot_product_flash_attention.default: flash_attention,
    aten._scaled_dot_product_efficient_attention.default: efficient_attention,
    aten._scaled_dot_product_cudnn_attention.default: cudnn_attention,
    aten._scaled_dot_product_fused_attention_overrideable.default: fused_attention_overrideable,
    aten.mkldnn_rnn_layer.default: mkldnn_rnn_layer,
}

#: Core-ATen decompositions polyfuse does not want: it lowers these operators itself.
_KEEP_WHOLE = (aten._safe_softmax.default,)


def decomposition_table() -> dict[Any, Callable[..., Any]]:
    """Core ATen's decompositions + :data:`FUSED_DECOMPOSITIONS`, without those of the
    operators polyfuse lowers whole (``_safe_softmax``)."""
    from torch._decomp import core_aten_decompositions

    table = dict(core_aten_decompositions())
    for op in _KEEP_WHOLE:
        table.pop(op, None)
    table.update(FUSED_DECOMPOSITIONS)
    return table
