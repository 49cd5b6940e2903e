"""merge_siblings: contractions of one input with different constant weights (attention's Q,
K, V projections) become one contraction over the concatenated weights; each is a slice of it.

Before/after pairs: launch counts, the merged constant, the plan's records, a refusal per
reason, values against ``polyfuse.reference`` (bit-identical in the reference: a merged
element sums the same products in the same order) and on the emulator.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import islpy as isl
import numpy as np
import pytest

import polyfuse
from polyfuse import ops, reference, te, zoo
from polyfuse.graph.graph import build_graph
from polyfuse.graph.passes import DEFAULT_PASSES, PassAction, merge_siblings, run_passes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import fusion_models  # noqa: E402

RNG = np.random.default_rng(2024)
NO_MERGE = tuple(p for p in DEFAULT_PASSES if p != "merge_siblings")
B, S, H, NH = 2, 8, 32, 2
D = H // NH


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _evaluate(t, feeds):
    return reference.evaluate([t], feeds)[0]


def _records(g, action: PassAction | None = None) -> list[str]:
    return [
        r.reason
        for r in g.pass_records
        if r.pass_name == "merge_siblings" and (action is None or r.action == action)
    ]


def _attention(bias: bool, weights_constant: bool = True):
    """One attention block on ``x``: Q, K, V projections (with bias adds when ``bias``),
    heads split, scores, softmax, context, heads merged, plus ``x``."""
    x = te.placeholder((B, S, H), name="x")
    ws = [te.placeholder((H, H), name=f"w{c}") for c in "qkv"]
    bs = [te.placeholder((H,), name=f"b{c}") for c in "qkv"]
    consts = {t: _rand(*t.shape) for t in ws + bs} if weights_constant else {}
    lin = [ops.matmul(x, w, name=f"{c}_mm") for w, c in zip(ws, "qkv", strict=True)]
    if bias:
        lin = [ops.add(m, b, name=f"{c}_add") for m, b, c in zip(lin, bs, "qkv", strict=True)]

    def heads(t, perm):
        return ops.transpose(ops.reshape(t, (B, S, NH, D)), perm)

    q, k, v = heads(lin[0], (0, 2, 1, 3)), heads(lin[1], (0, 2, 3, 1)), heads(lin[2], (0, 2, 1, 3))
    p = ops.softmax(ops.mul(ops.matmul(q, k, name="scores"), 1 / math.sqrt(D)), -1)
    ctx = ops.reshape(ops.transpose(ops.matmul(p, v, name="ctx"), (0, 2, 1, 3)), (B, S, H))
    out = ops.add(ctx, x, name="out")
    inputs = [x, *ws, *(bs if bias else [])]
    consts = {t: a for t, a in consts.items() if t in inputs}
    return inputs, [out], consts


def _compile(inputs, outputs, consts, passes=True, pack=True):
    args = [t for t in inputs if t not in consts]
    return polyfuse.compile(
        args, outputs, constants=consts, check_cuda=False, passes=passes, name="attn", pack=pack
    )


#: Launches are counted before Layer 3 where a merge is measured: unmerged, the V projection
#: (64 threads) packs beside the scores GEMM that took its softmax (stitch/gemm_rows.py, 64
#: threads) into one launch, which hides the GEMM the merge saves.
UNPACKED = False


def _check_emulated(fn, inputs, outputs, consts, arrays):
    feeds = {**dict(zip([t for t in inputs if t not in consts], arrays, strict=True)), **consts}
    want = reference.evaluate(outputs, feeds)
    got = fn(*arrays, device="emulate")
    got = list(got) if isinstance(got, tuple) else [got]
    for g, w in zip(got, want, strict=True):
        scale = max(1.0, float(np.max(np.abs(w))))
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * scale)


def _passed(inputs, outputs, consts, passes=DEFAULT_PASSES):
    return run_passes(build_graph(inputs, outputs, constants=consts), passes, _evaluate)


WHY_SCORES = "scores reads {}: folded, it reads {} through 2 access relations, one shared tile each"


def _shared_tiles(fn, prim: str) -> list[str]:
    """The shared tiles of the tiled GEMM kernel that runs ``prim`` (empty: not tiled)."""
    for k, names in zip(fn.kernels, fusion_models.kernel_prims(fn), strict=True):
        if prim in names:
            tiled = any("block tile" in n and "micro-tile" in n for n in k.notes)
            return sorted(n.split(":")[0] for n in k.notes if ": shared (" in n) if tiled else []
    raise AssertionError(f"{prim} runs in no kernel")


def test_q_k_v_with_biases_merge_into_one_tiled_gemm_and_values_hold():
    """Q, K, V with bias adds: all three (and their bias epilogues) merge into one GEMM over
    (H, 3H) whose epilogue adds the concatenated bias where the accumulator is. The scores
    GEMM then reads the merged tensor through two relations (Q's columns and K's): a shared
    tile per access, still a tiled GEMM (K was kept apart when promotion staged one tile per
    tensor)."""
    inputs, outputs, consts = _attention(bias=True)
    before = _compile(inputs, outputs, consts, NO_MERGE, pack=UNPACKED)
    after = _compile(inputs, outputs, consts, pack=UNPACKED)
    assert len(before.launches) == 6 and len(after.launches) == 4
    assert fusion_models.layout_kernels(after)[0] == []  # no slice kernel remains
    assert after.global_bytes() < before.global_bytes()
    g = after.plan.graph
    # round 2 sees scores and ctx as siblings of q_add_merged: refused (run-time operands)
    # (the softmax's generated name depends on how many ops were built before)
    (refusal,) = _records(g, PassAction.REFUSED)
    assert refusal.startswith(
        "scores and ctx (both reading q_add_merged) differ in operands that are not constants "
        "(q_add_merged, softmax"
    )
    assert refusal.endswith("): a merged weight must be computed at compile time")
    (line,) = _records(g, PassAction.MERGED)
    assert line == (
        "q_mm, k_mm, v_mm read x through the same access: one contraction q_mm_merged with "
        "their per-column epilogues (q_add, k_add, v_add) as q_add_merged over wq_cat [32, 96] "
        "= concat(wq, wk, wv, dim 1); bq_cat [96] = concat(bq, bk, bv, dim 0); each is a slice "
        "along axis 2 (q_add = [0, 32), k_add = [32, 64), v_add = [64, 96)); "
        + WHY_SCORES.format("q_mm and k_mm", "q_add_merged")
    )
    assert _shared_tiles(after, "scores") == ["q_add_merged", "q_add_merged__1"]
    # ctx reads the merged V columns and the softmax (named by how many ops came before it)
    merged, probs = _shared_tiles(after, "ctx")
    assert merged == "q_add_merged" and probs.startswith("softmax")
    # the merged constants; the weights and biases they replace are unbound
    byname = {t.name: t for t in inputs}
    cat = {t.name: g.constants[t.uid] for t in g.inputs if t.name.endswith("_cat")}
    np.testing.assert_array_equal(
        cat["wq_cat"], np.concatenate([consts[byname[f"w{c}"]] for c in "qkv"], axis=1)
    )
    np.testing.assert_array_equal(
        cat["bq_cat"], np.concatenate([consts[byname[f"b{c}"]] for c in "qkv"])
    )
    assert [t.name for t in g.inputs] == ["x", "wq_cat", "bq_cat"]
    assert g.prims["q_mm_merged"].tensor.shape == (B, S, 3 * H)
    assert not {"q_mm", "k_mm", "v_mm"} & set(g.prims)
    # one kernel: the merged GEMM with its bias epilogue, tiled where the accumulator is
    (names,) = [n for n in fusion_models.kernel_prims(after) if "q_mm_merged" in n]
    assert names == ["q_mm_merged", "q_add_merged"]
    # reference of the passed graph: bit-identical to the graph as written
    xv = _rand(B, S, H)
    want = reference.evaluate(outputs, {inputs[0]: xv, **consts})[0]
    got = reference.evaluate(g.outputs, {inputs[0]: xv, **_bound(g)})[0]
    np.testing.assert_array_equal(got, want)
    _check_emulated(after, inputs, outputs, consts, [xv])


def _bound(g) -> dict:
    return {t: g.constants[t.uid] for t in g.inputs if g.is_constant(t)}


def test_merge_pass_alone_is_a_before_after_pair():
    """The pass on its own: Q, K and V (contraction + bias add each) -> one contraction over
    (H, 3H) + one bias add over 3H columns; the three bias adds become slices of it."""
    inputs, outputs, consts = _attention(bias=True)
    g0 = build_graph(inputs, outputs, constants=consts)
    g1 = merge_siblings(g0)
    red0 = [n for n, p in g0.prims.items() if p.tensor.op.reduce is not None]
    red1 = [n for n, p in g1.prims.items() if p.tensor.op.reduce is not None]
    assert len(red1) == len(red0) - 2
    assert [g1.prims[n].composite for n in ("q_add", "k_add", "v_add")] == ["slice"] * 3
    assert {t.name: t.shape for t in g1.inputs if t.name.endswith("_cat")} == {
        "wq_cat": (H, 3 * H),
        "bq_cat": (3 * H,),
    }
    assert len(g1.prims) == len(g0.prims) - 1  # +2 merged, -3 (q_mm, k_mm and v_mm)
    # the slices as isl relations: q_add, k_add, v_add read columns [0, 32), [32, 64),
    # [64, 96) of the merged bias add
    box = f"0 <= b < {B} and 0 <= s < {S} and 0 <= j < {H}"
    for c, off in zip("qkv", (0, H, 2 * H), strict=True):
        ((_, rel),) = g1.prims[f"{c}_add"].relations.reads
        want = isl.Map(f"{{ S[b, s, j] -> X[b, s, j + {off}] : {box} }}", context=rel.get_ctx())
        anon = rel.set_tuple_name(isl.dim_type.in_, "S").set_tuple_name(isl.dim_type.out, "X")
        assert anon.is_equal(want)
    xv = _rand(B, S, H)
    want = reference.evaluate(outputs, {inputs[0]: xv, **consts})[0]
    np.testing.assert_array_equal(
        reference.evaluate(g1.outputs, {inputs[0]: xv, **consts, **_bound(g1)})[0], want
    )


def test_weights_that_are_not_constants_are_refused():
    inputs, outputs, consts = _attention(bias=True, weights_constant=False)
    g = _passed(inputs, outputs, consts)
    assert _records(g, PassAction.MERGED) == []
    refused = _records(g, PassAction.REFUSED)
    assert refused[0] == (
        "q_mm and k_mm (both reading x) differ in operands that are not constants (wq, wk): "
        "a merged weight must be computed at compile time"
    )


def test_different_accesses_of_the_input_are_refused():
    """``sum_k x[i, k] w1[k, j]`` and ``sum_k x[k, i] w2[k, j]``: the same form, the same
    input, two access relations (isl says they differ)."""
    x = te.placeholder((16, 16), name="x")
    w1, w2 = te.placeholder((16, 8), name="w1"), te.placeholder((16, 8), name="w2")
    k1, k2 = te.reduce_axis(16, "k"), te.reduce_axis(16, "k")
    a = te.compute((16, 8), lambda i, j: te.sum(x[i, k1] * w1[k1, j], axis=k1), name="a")
    b = te.compute((16, 8), lambda i, j: te.sum(x[k2, i] * w2[k2, j], axis=k2), name="b")
    out = ops.add(a, b, name="out")
    consts = {w1: _rand(16, 8), w2: _rand(16, 8)}
    g = _passed([x, w1, w2], [out], consts)
    assert _records(g, PassAction.MERGED) == []
    (line,) = _records(g, PassAction.REFUSED)
    assert line.startswith("a and b read x through different accesses: ")
    box = "0 <= d0 <= 15 and 0 <= r0 <= 15"
    assert line.endswith(f"-> X[d0, r0] : {box}}} vs {{S[d0, r0] -> X[r0, d0] : {box}}}")


def test_weights_differing_outside_the_concatenated_dim_are_refused():
    """``w2`` has 20 rows, of which the reduction reads 16: concatenating along the columns
    would need equal rows."""
    x = te.placeholder((4, 16), name="x")
    w1, w2 = te.placeholder((16, 8), name="w1"), te.placeholder((20, 8), name="w2")
    k1, k2 = te.reduce_axis(16, "k"), te.reduce_axis(16, "k")
    a = te.compute((4, 8), lambda i, j: te.sum(x[i, k1] * w1[k1, j], axis=k1), name="a")
    b = te.compute((4, 8), lambda i, j: te.sum(x[i, k2] * w2[k2, j], axis=k2), name="b")
    out = ops.add(a, b, name="out")
    g = _passed([x, w1, w2], [out], {w1: _rand(16, 8), w2: _rand(20, 8)})
    assert _records(g, PassAction.MERGED) == []
    (line,) = _records(g, PassAction.REFUSED)
    assert line == (
        "a and b: weights w1 [16, 8] and w2 [20, 8] differ in a dimension other than the "
        "concatenated one (1), or are not read whole along it: shapes not compatible"
    )


def _two_projections(reader):
    """``x @ wq`` (a graph output), ``x @ w2`` and ``x @ w3``; the latter two read by
    ``reader`` (a function of the two)."""
    x = te.placeholder((B, S, H), name="x")
    wq, w2, w3 = (te.placeholder((H, n), name=nm) for n, nm in ((H, "wq"), (8, "w2"), (4, "w3")))
    q = ops.matmul(x, wq, name="q_out")
    a, b = ops.matmul(x, w2, name="a"), ops.matmul(x, w3, name="b")
    consts = {wq: _rand(H, H), w2: _rand(H, 8), w3: _rand(H, 4)}
    extra, out = reader(a, b)
    return [x, *extra, wq, w2, w3], [q, out], consts


def test_an_output_sibling_is_refused_and_the_others_merge():
    """Q is a graph output: as a slice of the merged result it would need a copy kernel.
    ``a`` and ``b`` are read by GEMMs (their slices fold into those GEMMs' loads)."""

    def reader(a, b):
        u, v = te.placeholder((8, 5), name="u"), te.placeholder((4, 5), name="v")
        return [u, v], ops.add(ops.matmul(a, u, name="au"), ops.matmul(b, v, name="bv"))

    ins, outs, consts = _two_projections(reader)
    g = _passed(ins, outs, consts)
    assert _records(g, PassAction.REFUSED) == [
        "q_out is a graph output: merged, it would be a slice of the merged result, a strided "
        "store no fold can write (a copy kernel would remain)",
        # round 2: the readers now both read a_merged, with run-time weights u and v
        "au and bv (both reading a_merged) differ in operands that are not constants (u, v): "
        "a merged weight must be computed at compile time",
    ]
    (line,) = _records(g, PassAction.MERGED)
    assert line.startswith("a, b read x through the same access: one contraction a_merged over")
    assert "w2_cat [32, 12] = concat(w2, w3, dim 1)" in line
    before = _compile(ins, outs, consts, NO_MERGE)
    after = _compile(ins, outs, consts)
    assert fusion_models.layout_kernels(after)[0] == []
    assert len(after.launches) == len(before.launches) - 1
    _check_emulated(after, ins, outs, consts, [_rand(B, S, H), _rand(8, 5), _rand(4, 5)])


def test_a_slice_read_as_a_shifted_epilogue_is_refused():
    """``a`` and ``b`` read by row sums: merged, the sums would read the merged GEMM at an
    offset as its epilogue, which the GEMM path does not tile: refused."""
    ins, outs, consts = _two_projections(
        lambda a, b: (
            [],
            ops.add(ops.reduce_sum(a, -1, name="sa"), ops.reduce_sum(b, -1, name="sb")),
        )
    )
    g = _passed(ins, outs, consts)
    assert _records(g, PassAction.MERGED) == []
    refused = _records(g, PassAction.REFUSED)
    assert refused[1:] == [
        f"{n} not merged: {k} would read its slice of the merged result at an offset, "
        "as an epilogue of the merged contraction, which the GEMM path does not tile (tiled "
        "GEMMs would become one plain loop nest)"
        for n, k in (("a", "sa"), ("b", "sb"))
    ]


def test_siblings_read_by_one_contraction_merge_and_it_reads_a_tile_per_access():
    """Without bias adds, Q and K are read (through moves) by the scores GEMM: merged, it
    reads one tensor through two relations. Promotion stages a tile per access, so all
    three merge (K was refused: 'a GEMM stages one shared tile per tensor'), no slice
    kernel remains and scores stays a tiled GEMM."""
    inputs, outputs, consts = _attention(bias=False)
    g = _passed(inputs, outputs, consts)
    assert not any("two relations" in r for r in _records(g, PassAction.REFUSED))
    (line,) = _records(g, PassAction.MERGED)
    assert line.startswith("q_mm, k_mm, v_mm read x through the same access")
    assert line.endswith(WHY_SCORES.format("q_mm and k_mm", "q_mm_merged"))
    before = _compile(inputs, outputs, consts, NO_MERGE, pack=UNPACKED)
    after = _compile(inputs, outputs, consts, pack=UNPACKED)
    assert fusion_models.layout_kernels(after)[0] == []
    assert len(after.launches) == len(before.launches) - 2
    assert _shared_tiles(after, "scores") == ["q_mm_merged", "q_mm_merged__1"]
    _check_emulated(after, inputs, outputs, consts, [_rand(B, S, H)])


@pytest.mark.parametrize(
    ("name", "launches_off", "launches_on"),
    # before Layer 3 (UNPACKED); per layer the scores GEMM takes its softmax and the FFN-down
    # GEMM its add + layer norm (stitch/gemm_rows.py)
    [
        pytest.param("bert_base", 16, 12, marks=pytest.mark.slow),  # ~10 s on 2 cores
        pytest.param("gpt2_small", 17, 13, marks=pytest.mark.slow),  # ~14 s on 2 cores
        pytest.param("vit_b16", 20, 16, marks=pytest.mark.slow),  # ~25 s on 2 cores
    ],
)
def test_tiny_transformers_merge_their_projections(name, launches_off, launches_on):
    """Zoo transformers at tiny size (2 layers): one projection GEMM per layer instead of
    three (Q, K and V merged with their biases), no layout kernel, and the emulator matches
    the float64 model."""
    m = zoo.build(name, "tiny")
    off = polyfuse.compile(
        m.inputs, m.outputs, constants=m.constants, check_cuda=False, passes=NO_MERGE, pack=UNPACKED
    )
    fn = polyfuse.compile(
        m.inputs, m.outputs, constants=m.constants, check_cuda=False, pack=UNPACKED
    )
    assert (len(off.launches), len(fn.launches)) == (launches_off, launches_on)
    assert len(_records(fn.plan.graph, PassAction.MERGED)) == m.config["layers"]
    assert fusion_models.layout_kernels(fn)[0] == []
    arrays = m.sample_inputs(seed=5)
    got = fn(*arrays, device="emulate")
    got = got if isinstance(got, tuple) else (got,)
    want = m.reference(*arrays)
    want = want if isinstance(want, tuple | list) else (want,)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_half_precision_attention_merges_q_k_and_v():
    """float16 Q, K, V merge into one projection as float32's do: the scores GEMM runs on
    tensor cores reading the merged tensor as both operands (B's tile its further access).
    K was kept apart before ('the tensor-core GEMM stages one shared tile per tensor'). No
    slice kernel remains, and the emulator matches the reference."""
    x = te.placeholder((B, S, H), name="x", dtype="float16")
    ws = [te.placeholder((H, H), name=f"w{c}", dtype="float16") for c in "qkv"]
    consts = {w: (0.2 * _rand(H, H)).astype(np.float16) for w in ws}
    q, k, v = (ops.matmul(x, w, name=f"{c}_mm") for w, c in zip(ws, "qkv", strict=True))

    def heads(t, perm):
        return ops.transpose(ops.reshape(t, (B, S, NH, D)), perm)

    scores = ops.matmul(heads(q, (0, 2, 1, 3)), heads(k, (0, 2, 3, 1)), name="scores")
    ctx = ops.matmul(ops.softmax(scores, -1), heads(v, (0, 2, 1, 3)), name="ctx")
    out = ops.reshape(ops.transpose(ctx, (0, 2, 1, 3)), (B, S, H), name="out")
    g = _passed([x, *ws], [out], consts)
    assert not any("two relations" in r for r in _records(g, PassAction.REFUSED))
    (line,) = _records(g, PassAction.MERGED)
    assert line.startswith("q_mm, k_mm, v_mm read x through the same access")
    fn = polyfuse.compile(
        [x], [out], constants=consts, check_cuda=True, name="attn16", pack=UNPACKED
    )
    assert fusion_models.layout_kernels(fn)[0] == []
    (sk,) = [k for k in fn.kernels if "scores" in k.name]
    assert "pf_mma_m16n8k16" in sk.source
    xv = (0.5 * _rand(B, S, H)).astype(np.float16)
    want = reference.evaluate([out], {x: xv, **consts})[0].astype(np.float64)
    got = fn(xv, device="emulate").astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
