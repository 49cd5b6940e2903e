"""Layer 2 feedback (:mod:`polyfuse.stitch.epilogue`): elementwise ops between a GEMM and a
reduction join the GEMM's epilogue when that saves more global bytes than joining the
reduction (a pre-LN transformer's bias + residual add before its layer norm), and stay with the
reduction on a tie (a post-LN add read by the layer norm only); a GEMM that row-stitches its
reduction keeps it.
"""

from __future__ import annotations

import numpy as np
import pytest

import polyfuse
import polyfuse.driver as driver
from polyfuse import ops, reference, te
from polyfuse.base.decision import DecisionKind
from polyfuse.graph.graph import build_graph
from polyfuse.graph.partition import partition
from polyfuse.stitch.gemm_rows import GEMM_ROWS_RULE

RNG = np.random.default_rng(2424)
# rows of 2048 floats: no whole-row GEMM tile fits shared memory, so the GEMM cannot take the
# layer norm (rule 9 refuses: FOOTPRINT); small enough for the emulator
M, K, N = 16, 16, 2048


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _block(residual_is_output: bool):
    """``y = x @ w + b + r``; outputs ``layer_norm(y)`` and, pre-LN style, ``y`` (the residual
    stream, read again later) or only the layer norm (post-LN style)."""
    x, w = te.placeholder((M, K), name="x"), te.placeholder((K, N), name="w")
    b, r = te.placeholder((N,), name="b"), te.placeholder((M, N), name="r")
    g, be = te.placeholder((N,), name="g"), te.placeholder((N,), name="be")
    y = ops.add(ops.add(ops.matmul(x, w, name="mm"), b, name="bias"), r, name="res")
    ln = ops.layer_norm(y, g, be, name="ln")
    return [x, w, b, r, g, be], [ln, y] if residual_is_output else [ln]


def _kernel_reading(fn, tensor: str):
    (k,) = [k for k in fn.kernels if tensor in k.tensor_bytes]
    return k


def _check(fn, ins, outs) -> None:
    arrays = [_rand(M, K), _rand(K, N), _rand(N), _rand(M, N), _rand(N), _rand(N)]
    want = reference.evaluate(outs, dict(zip(ins, arrays, strict=True)))
    got = fn(*arrays, device="emulate")
    got = list(got) if isinstance(got, tuple) else [got]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_pre_ln_bias_and_residual_add_run_in_the_gemm_epilogue():
    """The sum is the residual stream (an output here, the next residual add's input in
    GPT-2): written either way, so the GEMM's epilogue (saving the GEMM output's write and
    read) beats the layer norm (saving one read). GEMM + bias + residual is one kernel that
    stores only the sum; the layer norm kernel reads the sum and none of b, r, mm; the plan
    has the choice with both byte figures; the numbers are the reference's."""
    ins, outs = _block(residual_is_output=True)
    fn = polyfuse.compile(ins, outs, check_cuda=False)
    assert len(fn.kernels) == 2
    assert not any(d.stitched for d in fn.plan.stitches if d.rule == GEMM_ROWS_RULE)
    gemm = _kernel_reading(fn, "w")
    assert {"x", "w", "b", "r"} <= set(gemm.tensor_bytes)
    written = [t for t, (_, wr) in gemm.tensor_bytes.items() if wr]
    assert written == ["res"]
    assert "mm" not in gemm.tensor_bytes  # the GEMM's own output stays in registers
    norm = _kernel_reading(fn, "g")
    assert norm is not gemm and {"b", "r", "mm"}.isdisjoint(norm.tensor_bytes)
    assert norm.tensor_bytes["res"][0] == 4 * M * N  # read once, not written
    (d,) = [
        d for d in fn.plan.partition.decisions if (d.producer, d.consumer) == ("res", "ln_mean")
    ]
    assert not d.fused and d.kinds == (DecisionKind.COST_MODEL,)
    sums = 4 * M * N
    assert d.reason.startswith("bias, res run in the epilogue of mm: it saves")
    assert f"saves {2 * sums} global bytes, joining the reduction" in d.reason
    assert d.reason.endswith(f"{sums} (Layer 2 feedback, stitch/epilogue.py)")
    _check(fn, ins, outs)


def _without_feedback(monkeypatch, ins, outs) -> polyfuse.CompiledGraph:
    """The same compile with no epilogue choice made (the table's order alone)."""
    with monkeypatch.context() as mp:
        mp.setattr(driver, "epilogue_choices", lambda *a: [])
        return polyfuse.compile(ins, outs, check_cuda=False)


def test_pre_ln_block_saves_the_gemm_output_round_trip(monkeypatch):
    """Against the table's order alone (bias and residual add in the layer norm's
    micrograph): the same two kernels, the GEMM output's write and read saved, one read of
    the sum added."""
    ins, outs = _block(residual_is_output=True)
    fn = polyfuse.compile(ins, outs, check_cuda=False)
    old = _without_feedback(monkeypatch, ins, outs)
    assert any(set(m.prims) >= {"bias", "res", "ln_mean"} for m in old.plan.micrographs)
    assert any(set(m.prims) >= {"mm", "bias", "res"} for m in fn.plan.micrographs)
    assert len(fn.launches) == len(old.launches) == 2
    assert fn.global_bytes() == old.global_bytes() - (2 * 4 * M * N - 4 * M * N)


def test_post_ln_add_stays_with_the_layer_norm_on_a_tie(monkeypatch):
    """The sum is read by the layer norm only: both choices save one round trip of a
    (16, 2048) tensor, a tie, so the table's order stands: the adds join the layer norm."""
    ins, outs = _block(residual_is_output=False)
    fn = polyfuse.compile(ins, outs, check_cuda=False)
    assert len(fn.kernels) == 2
    norm = _kernel_reading(fn, "g")
    assert {"mm", "b", "r"} <= set(norm.tensor_bytes) and "res" not in norm.tensor_bytes
    assert not any(d.kinds == (DecisionKind.COST_MODEL,) for d in fn.plan.partition.decisions)
    assert fn.global_bytes() == _without_feedback(monkeypatch, ins, outs).global_bytes()
    _check(fn, ins, outs)


def test_row_stitched_gemm_keeps_its_adds_and_layer_norm():
    """Rows of 96: the GEMM takes the add + layer norm (rule 9), so nothing moves although the
    sum is an output: one kernel."""
    x, w = te.placeholder((37, 32), name="x"), te.placeholder((32, 96), name="w")
    b, r = te.placeholder((96,), name="b"), te.placeholder((37, 96), name="r")
    y = ops.add(ops.add(ops.matmul(x, w, name="mm"), b, name="bias"), r, name="res")
    fn = polyfuse.compile([x, w, b, r], [ops.layer_norm(y, name="ln"), y], check_cuda=False)
    assert len(fn.kernels) == 1
    assert [d.stitched for d in fn.plan.stitches if d.rule == GEMM_ROWS_RULE] == [True]
    assert not any(d.kinds == (DecisionKind.COST_MODEL,) for d in fn.plan.partition.decisions)


@pytest.mark.slow  # whole models, ~12 s each
@pytest.mark.parametrize("name", ["gpt2_small", "vit_b16"])
def test_full_pre_ln_transformers_add_in_the_projection_epilogues(name):
    """GPT-2 small and ViT-B/16 at full size (compile only): the attention output projection
    and the FFN down projection of every layer store the residual stream with their bias and
    residual add, and a layer norm kernel reads it — but the last layer's FFN down projection,
    whose sum only the final layer norm reads (a tie), leaves its adds to that layer norm; at
    most 9 launches per layer."""
    from polyfuse import zoo

    m = zoo.build(name, "full", weights="zeros")
    fn = polyfuse.compile(m.inputs, m.outputs, constants=m.constants, check_cuda=False)
    layers = m.config["layers"]
    assert len(fn.launches) <= 9 * layers
    for i in range(layers):
        for weight, bias in (("attn_o_w", "attn_o_bias"), ("mlp_fc2_w", "mlp_fc2_bias")):
            k = _kernel_reading(fn, f"block{i}_{weight}")
            assert not any(t.endswith("_gamma") for t in k.tensor_bytes), k.name
            if i == layers - 1 and weight == "mlp_fc2_w":
                assert f"block{i}_{bias}" not in k.tensor_bytes, k.name
                assert "ln_f_gamma" in _kernel_reading(fn, f"block{i}_{bias}").tensor_bytes
                continue
            assert f"block{i}_{bias}" in k.tensor_bytes, k.name
            written = [t for t, (_, wr) in k.tensor_bytes.items() if wr]
            assert len(written) == 1
            readers = [q for q in fn.kernels if written[0] in q.tensor_bytes and q is not k]
            assert any(any(t.endswith("_gamma") for t in q.tensor_bytes) for q in readers)


def test_partition_keeps_preferred_pairs_apart_with_the_reason():
    """The partition's side (graph/partition.py): a preference pair blocks rule 4 with its
    reason (a cost-model refusal, not isl feedback), so rule 5 gives the adds to the GEMM."""
    ins, outs = _block(residual_is_output=True)
    graph = build_graph(ins, outs)
    plain = partition(graph)
    assert ["bias", "res", "ln_mean"] in [m.prims for m in plain.micrographs]
    why = "res runs in the GEMM's epilogue (test)"
    part = partition(graph, preferences={frozenset(("res", "ln_mean")): why})
    assert ["mm", "bias", "res"] in [m.prims for m in part.micrographs]
    assert ["ln_mean"] in [m.prims for m in part.micrographs]
    (d,) = [d for d in part.decisions if (d.producer, d.consumer) == ("res", "ln_mean")]
    assert (d.fused, d.reason, d.kinds) == (False, why, (DecisionKind.COST_MODEL,))
    assert d.record.kinds == (DecisionKind.COST_MODEL,) and not d.record.made
    assert part.separations == set() and part.preferences == {frozenset(("res", "ln_mean")): why}
