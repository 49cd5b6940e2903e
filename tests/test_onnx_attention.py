"""ONNX ``Attention`` (opsets 23-25): multi-head, grouped-query and multi-query heads, 3-D
and 4-D inputs, past/present caches, boolean and float masks (shorter than the keys too), the
causal frontier and sliding windows with their offsets, ``nonpad_kv_seqlen`` as a run-time
input, soft caps, ``softmax_precision`` and the four ``qk_matmul_output`` modes; and
``RotaryEmbedding`` (opset 23: partial, interleaved, positions at run time). Each case runs
against ONNX's reference evaluator (16-bit in float64, rounded once) at sizes that are no
multiple of anything, then compiles with NVRTC for sm_80 and sm_90 and reruns race-free."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import helper  # noqa: E402
from test_onnx_fuzz import _nodes_model  # noqa: E402
from test_onnx_norms_and_math import _agrees  # noqa: E402

from polyfuse.errors import PolyfuseError  # noqa: E402
from polyfuse.graph.graph import build_graph  # noqa: E402
from polyfuse.onnx.backend import prepare  # noqa: E402
from polyfuse.testing.onnx_programs import reference_evaluator  # noqa: E402

RNG = np.random.default_rng(23)


def _x(*shape, dtype="float32"):
    return RNG.standard_normal(shape).astype(dtype)


def _attention(inputs: dict, outputs=("Y",), opset=23, **attrs):
    names = ["Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen"]
    ins = [n if n in inputs else "" for n in names]
    while ins and not ins[-1]:
        ins.pop()
    node = helper.make_node("Attention", ins, list(outputs), **attrs)
    return _agrees([node], inputs, opset=opset)


def test_multi_head_attention_of_4d_inputs_with_a_float_mask_and_its_scores():
    q, k, v = _x(2, 3, 5, 6), _x(2, 3, 7, 6), _x(2, 3, 7, 10)
    mask = _x(5, 7)
    y, qk = _attention({"Q": q, "K": k, "V": v, "attn_mask": mask}, ("Y", "", "", "QK"),
                       qk_matmul_output_mode=2)  # fmt: skip
    assert y.shape == (2, 3, 5, 10) and qk.shape == (2, 3, 5, 7)
    s = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k) / np.sqrt(6) + mask
    np.testing.assert_allclose(qk, s, rtol=1e-5, atol=1e-5)


def test_grouped_query_3d_attention_with_a_cache_a_short_float_mask_and_causal_offset():
    """Nine query heads share three key/value heads; the past (4 keys) precedes the 3 new
    ones, so query i sees keys j <= i + 4; the mask covers 6 of the 7 keys (the 7th reads
    -inf)."""
    q, k, v = _x(2, 3, 9 * 6), _x(2, 3, 3 * 6), _x(2, 3, 3 * 5)
    pk, pv = _x(2, 3, 4, 6), _x(2, 3, 4, 5)
    y, kk, vv = _attention(
        {"Q": q, "K": k, "V": v, "attn_mask": _x(3, 6), "past_key": pk, "past_value": pv},
        ("Y", "present_key", "present_value"), is_causal=1, q_num_heads=9, kv_num_heads=3,
    )  # fmt: skip
    assert y.shape == (2, 3, 45) and kk.shape == (2, 3, 7, 6) and vv.shape == (2, 3, 7, 5)
    np.testing.assert_array_equal(kk[:, :, :4], pk)
    np.testing.assert_array_equal(kk[:, :, 4:], k.reshape(2, 3, 3, 6).transpose(0, 2, 1, 3))


@pytest.mark.parametrize("mode", [1, 3])
def test_a_boolean_mask_a_soft_cap_and_the_probabilities_out(mode):
    mask = RNG.random((2, 3, 5, 7)) < 0.7
    mask[:, :, :, 0] = True
    _attention({"Q": _x(2, 3, 5, 8), "K": _x(2, 3, 7, 8), "V": _x(2, 3, 7, 4), "attn_mask": mask},
               ("Y", "", "", "QK"), softcap=1.5, qk_matmul_output_mode=mode, scale=0.3)  # fmt: skip


def test_mode_0_gives_the_scores_before_the_soft_cap():
    """The specification and the operator's function body say mode 0 is the raw product;
    onnx's reference evaluator returns it soft-capped (so Y alone is compared with it)."""
    q, k, v = _x(1, 2, 5, 8), _x(1, 2, 7, 8), _x(1, 2, 7, 4)
    node = helper.make_node("Attention", ["Q", "K", "V"], ["Y", "", "", "QK"], softcap=1.5,
                            qk_matmul_output_mode=0, scale=0.3)  # fmt: skip
    inputs = {"Q": q, "K": k, "V": v}
    model = _nodes_model([node], inputs, opset=23)
    y, qk = prepare(model, "CPU").run(inputs)
    np.testing.assert_allclose(qk, 0.3 * np.einsum("bhid,bhjd->bhij", q, k), rtol=1e-5, atol=1e-6)
    y_ref = reference_evaluator(model).run(None, inputs)[0]
    np.testing.assert_allclose(y, y_ref, rtol=1e-4, atol=1e-5)


def test_a_fully_masked_row_gives_zeros_not_nan():
    mask = np.ones((5, 7), bool)
    mask[2] = False
    y, p = _attention({"Q": _x(1, 2, 5, 4), "K": _x(1, 2, 7, 4), "V": _x(1, 2, 7, 4),
                       "attn_mask": mask}, ("Y", "", "", "P"), qk_matmul_output_mode=3)  # fmt: skip
    assert not np.isnan(y).any()
    np.testing.assert_array_equal(y[:, :, 2], 0)
    np.testing.assert_array_equal(p[:, :, 2], 0)
    np.testing.assert_allclose(p[:, :, [0, 1, 3, 4]].sum(-1), 1, rtol=1e-5)


def test_nonpad_kv_seqlen_is_read_at_run_time_with_a_window_and_a_rank3_mask():
    """An external cache of 9 slots: batch 0 holds 6 valid keys, batch 1 all 9, so the causal
    frontier of query i is j <= i + nonpad[b] - 4; a window of 2 to the left; a mask per
    head (rank 3: heads, queries, keys); one graph input, two values of it."""
    q, k, v = _x(2, 3, 4, 6), _x(2, 3, 9, 6), _x(2, 3, 9, 6)
    for lengths in ([6, 9], [9, 5]):
        _attention({"Q": q, "K": k, "V": v, "attn_mask": _x(3, 4, 9),
                    "nonpad_kv_seqlen": np.array(lengths, np.int64)}, opset=25, is_causal=1,
                   left_window_size=2)  # fmt: skip


def test_a_bidirectional_window_and_multi_query_heads():
    _attention({"Q": _x(1, 4, 6, 3), "K": _x(1, 1, 6, 3), "V": _x(1, 1, 6, 3)}, opset=25,
               left_window_size=1, right_window_size=2)  # fmt: skip


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_attention_with_softmax_precision(dtype):
    import ml_dtypes  # noqa: F401  (numpy's bfloat16)

    q, k, v = _x(2, 2, 5, 8, dtype=dtype), _x(2, 2, 7, 8, dtype=dtype), _x(2, 2, 7, 8, dtype=dtype)
    for prec in (None, 1):
        at = {} if prec is None else {"softmax_precision": prec}
        _attention({"Q": q, "K": k, "V": v}, ("Y", "", "", "QK"), opset=24, is_causal=1,
                   qk_matmul_output_mode=3, **at)  # fmt: skip


def test_the_row_guard_is_built_only_where_a_row_can_be_fully_masked():
    """A plain causal attention without cache masks no row entirely: no row-bias reduction.
    A mask (data) or a window that starts right of some query does."""

    def computes(inputs, **at):
        node = helper.make_node("Attention", list(inputs), ["Y"], **at)
        model = prepare(_nodes_model([node], inputs, opset=25), "CPU").model
        return " ".join(build_graph(model.inputs, model.outputs).topo_order())

    qkv = {"Q": _x(1, 2, 5, 4), "K": _x(1, 2, 5, 4), "V": _x(1, 2, 5, 4)}
    assert "attn_row_bias" not in computes(qkv, is_causal=1)
    assert "attn_row_bias" not in computes(qkv, left_window_size=0, right_window_size=0)
    assert "attn_row_bias" in computes({**qkv, "attn_mask": _x(5, 5)})


@pytest.mark.parametrize(
    ("inputs", "attrs", "message"),
    [
        ({"Q": _x(1, 3, 12), "K": _x(1, 3, 12), "V": _x(1, 3, 12)}, {},
         "3-D inputs need the q_num_heads and kv_num_heads attributes"),
        ({"Q": _x(1, 3, 4, 8), "K": _x(1, 2, 5, 8), "V": _x(1, 2, 5, 8)}, {}, "do not fit"),
        ({"Q": _x(1, 2, 4, 8), "K": _x(1, 2, 5, 8), "V": _x(1, 2, 5, 8),
          "attn_mask": _x(3, 4, 5)}, {}, "attn_mask (3, 4, 5) does not broadcast"),
        ({"Q": _x(1, 2, 4, 8), "K": _x(1, 2, 5, 8), "V": _x(1, 2, 5, 8)},
         {"qk_matmul_output_mode": 4}, "qk_matmul_output_mode=4"),
    ],  # fmt: skip
)
def test_attention_that_does_not_fit_is_a_one_line_error_naming_the_node(inputs, attrs, message):
    names = ["Q", "K", "V", "attn_mask"][: len(inputs)]
    node = helper.make_node("Attention", names, ["Y", "", "", "QK"], name="attn7", **attrs)
    model = _nodes_model([node], inputs, opset=23, infer=False)
    with pytest.raises(PolyfuseError) as e:
        prepare(model, "CPU")
    assert message in str(e.value) and "attn7" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("layout", ["3d", "4d"])
def test_rotary_embedding_partial_with_run_time_positions(interleaved, layout):
    """Six of ten features per head turn (halves or even/odd pairs) by the angles at each
    token's position, read from ``position_ids`` at run time; the rest pass through."""
    nb, heads, seq, d, rd = 2, 3, 5, 10, 6
    x = _x(nb, seq, heads * d) if layout == "3d" else _x(nb, heads, seq, d)
    ang = RNG.uniform(0, 6.3, (11, rd // 2))
    inputs = {"x": x, "pos": RNG.integers(0, 11, (nb, seq)).astype(np.int64)}
    consts = {"cos": np.cos(ang).astype(np.float32), "sin": np.sin(ang).astype(np.float32)}
    at = {"interleaved": interleaved, "rotary_embedding_dim": rd}
    if layout == "3d":
        at["num_heads"] = heads
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"], **at)
    (y,) = _agrees([node], inputs, consts, opset=23)
    keep = y.reshape(nb, seq, heads, d)[..., rd:] if layout == "3d" else y[..., rd:]
    was = x.reshape(nb, seq, heads, d)[..., rd:] if layout == "3d" else x[..., rd:]
    np.testing.assert_array_equal(keep, was)


def test_rotary_embedding_with_caches_per_token():
    x = _x(2, 2, 4, 8)
    ang = RNG.uniform(0, 6.3, (2, 4, 4))
    consts = {"cos": np.cos(ang).astype(np.float32), "sin": np.sin(ang).astype(np.float32)}
    _agrees([helper.make_node("RotaryEmbedding", ["x", "cos", "sin"], ["y"])], {"x": x},
            consts, opset=23)  # fmt: skip


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
def test_linear_attention_update_rules_with_grouped_heads_and_a_past_state(rule):
    """Six query heads on two key/value heads over five steps, from a given state; decay
    per head or per key feature, beta per head or shared."""
    nb, steps, hq, hkv, dk, dv = 2, 5, 6, 2, 4, 3
    inputs = {"q": _x(nb, steps, hq * dk), "k": _x(nb, steps, hkv * dk) * 0.5,
              "v": _x(nb, steps, hkv * dv), "s": _x(nb, hkv, dk, dv)}  # fmt: skip
    names = ["q", "k", "v", "s"]
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    names += ["g" if gated else "", "b" if delta else ""]
    if gated:
        inputs["g"] = -np.abs(_x(nb, steps, hkv * dk if rule == "gated" else hkv))
    if delta:
        inputs["b"] = RNG.uniform(0, 1, (nb, steps, 1 if rule == "delta" else hkv)).astype(
            np.float32
        )
    while not names[-1]:
        names.pop()
    node = helper.make_node("LinearAttention", names, ["y", "state"], q_num_heads=hq,
                            kv_num_heads=hkv, update_rule=rule)  # fmt: skip
    _agrees([node], inputs, opset=26)


def test_linear_attention_over_too_many_steps_is_a_one_line_refusal():
    from polyfuse.errors import UnsupportedOpError

    inputs = {"q": _x(1, 65, 4), "k": _x(1, 65, 4), "v": _x(1, 65, 4)}
    node = helper.make_node("LinearAttention", ["q", "k", "v"], ["y"], q_num_heads=1,
                            kv_num_heads=1, update_rule="linear", name="la")  # fmt: skip
    with pytest.raises(UnsupportedOpError) as e:
        prepare(_nodes_model([node], inputs, opset=26, infer=False), "CPU")
    assert "LinearAttention over 65 steps (it is unrolled; up to 64)" in str(e.value)
