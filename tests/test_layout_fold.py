"""Layout folding (graph/passes/layout_fold.py, issue 24 item 1): a reshape, transpose, slice,
expand or concat between two computations is not a kernel.

Each test compiles a graph twice — with every graph pass but the fold (before) and with all of
them (after) — and checks the structure (launches, kernels that only move data, the plan line
of the fold or refusal) and the numbers on the emulator against ``polyfuse.reference``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import islpy as isl
import numpy as np
import pytest

import polyfuse
from polyfuse import ops, reference, te
from polyfuse.graph.expr import Binary, Read, walk
from polyfuse.graph.graph import build_graph
from polyfuse.graph.passes import DEFAULT_PASSES, PassAction, run_passes
from polyfuse.graph.passes.layout_fold import is_move, layout_fold

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import fusion_models  # noqa: E402

RNG = np.random.default_rng(24)
NO_FOLD = tuple(p for p in DEFAULT_PASSES if p != "layout_fold")


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _compile(inputs, outputs, passes=True):
    return polyfuse.compile(inputs, outputs, check_cuda=False, passes=passes)


def _layout_only(fn) -> list[str]:
    return fusion_models.layout_kernels(fn)[0]


def _records(fn, action: PassAction) -> list[str]:
    return [
        r.reason
        for r in fn.plan.graph.pass_records
        if r.pass_name == "layout_fold" and r.action == action
    ]


def _check_numbers(fn, inputs, outputs, arrays, race_check=False):
    """The emulator runs ``fn``'s CUDA on ``arrays``; compare with the reference of the
    graph as written (before any pass): float32 sums against float64, so the absolute
    tolerance scales with the largest value."""
    got = fn(*arrays, device="emulate", race_check=race_check)
    got = list(got) if isinstance(got, tuple) else [got]
    want = reference.evaluate(outputs, dict(zip(inputs, arrays, strict=True)))
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        scale = max(1.0, float(np.max(np.abs(w))))
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * scale)


def _gemm_note(fn, prim: str) -> bool:
    """Whether the kernel running ``prim`` is tiled as a GEMM (a block tile with a register
    micro-tile in its notes: detect_gemm accepted its operands' access relations)."""
    for k, names in zip(fn.kernels, fusion_models.kernel_prims(fn), strict=True):
        if prim in names:
            # (a refusal's note names the tiling it could not build: "no GEMM tiling: ...")
            return any(
                "block tile" in n and "micro-tile" in n and not n.startswith("no GEMM tiling")
                for n in k.notes
            )
    raise AssertionError(f"{prim} runs in no kernel")


def test_transposed_gemm_operand_reads_through_the_permutation():
    """y = x @ exp(b)^T: the transpose is a kernel before; after, the GEMM reads exp(b)
    through the permuted relation (the shared-memory copies do the gather)."""
    x, b = te.placeholder((64, 32), name="x"), te.placeholder((48, 32), name="b")
    y = ops.matmul(x, ops.transpose(ops.exp(b, name="eb"), name="bt"), name="y")
    before = _compile([x, b], [y], NO_FOLD)
    after = _compile([x, b], [y])
    assert len(_layout_only(before)) == 1 and len(before.launches) == 3
    assert _layout_only(after) == [] and len(after.launches) == 2
    (line,) = _records(after, PassAction.FOLDED)
    assert line.startswith("bt folded into the loads of y (consumer side): they read eb through")
    assert "(injective)" in line
    assert _gemm_note(after, "y")
    _check_numbers(after, [x, b], [y], [_rand(64, 32), _rand(48, 32)])


@pytest.mark.parametrize(("bs", "s", "nh", "d"), [(2, 16, 2, 16), (2, 20, 3, 12)])
def test_head_split_and_merge_fold_into_the_attention_gemms(bs, s, nh, d):
    """BERT's heads: (B, S, H*D) -> reshape (B, S, H, D) -> transpose (B, H, S, D) into the
    batched GEMM, and back: transpose -> reshape (B, S, H*D) into the output projection,
    whose reduction axis then reads the batched result at ``k // D`` and ``k % D``. With
    D = 12 the output projection's k-tiles (8) straddle two heads: the promotion's copies
    gather them from both."""
    h = nh * d
    x = te.placeholder((bs, s, h), name="x")
    wq, wk, wo = (te.placeholder((h, h), name=n) for n in ("wq", "wk", "wo"))

    def heads(t, perm, name):
        return ops.transpose(ops.reshape(t, (bs, s, nh, d)), perm, name=name)

    qh = heads(ops.matmul(x, wq, name="q"), (0, 2, 1, 3), "qh")  # (B, H, S, D)
    kt = heads(ops.matmul(x, wk, name="k"), (0, 2, 3, 1), "kt")  # (B, H, D, S)
    att = ops.matmul(qh, kt, name="att")  # (B, H, S, S)
    ctx = ops.matmul(ops.softmax(att, -1), qh, name="ctx")  # (B, H, S, D)
    merged = ops.reshape(ops.transpose(ctx, (0, 2, 1, 3), name="ct"), (bs, s, h), name="merge")
    y = ops.matmul(merged, wo, name="y")
    ins = [x, wq, wk, wo]
    before = _compile(ins, [y], NO_FOLD)
    after = _compile(ins, [y])
    assert len(_layout_only(before)) >= 4
    assert _layout_only(after) == []
    assert len(after.launches) <= len(before.launches) - 4
    # the output projection reads ctx directly, with a floor division and a modulo by D
    folded = _records(after, PassAction.FOLDED)
    assert any(line.startswith("merge folded into the loads of y") for line in folded)
    assert any(f"mod {d}" in line for line in folded)  # isl's quasi-affine relation
    assert _gemm_note(after, "att")
    # D = 16: the k-tile (8) divides D and y reads ``ctx[b, k // 16, s, k % 16]`` as a tiled
    # GEMM (as BERT's D = 64 does for every k-tile the ranking tries). D = 12: no k-tile of
    # 8, 16 or 32 keeps to one head's run (a k-tile's footprint would have no fixed box; y
    # ran as a plain loop nest): the reduction axis is split into (heads, D), affine.
    yt = after.plan.graph.prims["y"].tensor
    (rd,) = [r for r in yt.op.reads() if r.tensor.name == "ctx"]
    ops_used = {n.op for i in rd.indices for n in walk(i) if isinstance(n, Binary)}
    split = [r for r in after.plan.graph.pass_records if r.pass_name == "split_reduction"]
    if d == 16:
        assert {"floordiv", "mod"} <= ops_used and not split
    else:
        assert not {"floordiv", "mod"} & ops_used and f"({nh} x {d})" in split[0].reason
    assert _gemm_note(after, "y")
    _check_numbers(after, ins, [y], [_rand(bs, s, h), *(_rand(h, h) for _ in range(3))])


def test_gram_product_folds_its_transpose_and_stays_a_tiled_gemm():
    """``q @ transpose(q)`` folded is ``sum_k q[i, k] * q[j, k]``: one tensor read through
    two relations. The GEMM promotion stages one shared tile per access relation, so the
    transpose folds (it stayed a kernel before: 'a GEMM stages one shared tile per tensor')
    and the product is a tiled GEMM with a tile of q per access."""
    x, w = te.placeholder((64, 32), name="x"), te.placeholder((32, 32), name="w")
    q = ops.matmul(x, w, name="q")
    g = ops.matmul(q, ops.transpose(q, name="qt"), name="gram")
    fn = _compile([x, w], [g])
    assert _records(fn, PassAction.REFUSED) == []
    (line,) = _records(fn, PassAction.FOLDED)
    assert line.startswith("qt folded into the loads of gram (consumer side): they read q")
    assert _layout_only(fn) == [] and len(fn.launches) == 2
    # the folded reader, as isl relations: q through {S[i, j, k] -> q[i, k]} and
    # {S[i, j, k] -> q[j, k]}
    gp = fn.plan.graph.prims["gram"]
    rels = [m for r, m in gp.relations.reads if r.tensor.name == "q"]
    box = "0 <= i < 64 and 0 <= j < 64 and 0 <= k < 32"
    ctx = rels[0].get_ctx()
    want = [isl.Map(f"{{ S[i, j, k] -> X[{a}, k] : {box} }}", context=ctx) for a in "ij"]
    anon = [
        m.set_tuple_name(isl.dim_type.in_, "S").set_tuple_name(isl.dim_type.out, "X")
        for m in rels
    ]
    assert len(anon) == 2 and all(a.is_equal(b) for a, b in zip(anon, want, strict=True))
    assert _gemm_note(fn, "gram")
    kernels = zip(fn.kernels, fusion_models.kernel_prims(fn), strict=True)
    (k,) = [k for k, names in kernels if "gram" in names]
    assert sorted(n.split(":")[0] for n in k.notes if ": shared (" in n) == ["q", "q__1"]
    _check_numbers(fn, [x, w], [g], [_rand(64, 32), _rand(32, 32)])


def test_half_precision_gram_product_folds_its_transpose_into_two_tensor_core_tiles():
    """float16 ``q @ transpose(q)``: the transpose folds and the tensor-core GEMM reads ``q``
    as both operands, B's shared tile being the array's further access (``s_q_t1``). It stayed
    a kernel before ('the tensor-core GEMM stages one shared tile per tensor'). Compiles for
    sm_80, matches the reference in both thread orders, and its cp.async writes and
    ldmatrix reads are bank-conflict free."""
    from kernel_checks import bank_sites

    x = te.placeholder((64, 32), name="x", dtype="float16")
    w = te.placeholder((32, 32), name="w", dtype="float16")
    q = ops.matmul(x, w, name="q")
    g = ops.matmul(q, ops.transpose(q, name="qt"), name="gram")
    fn = polyfuse.compile([x, w], [g], check_cuda=True)
    assert _records(fn, PassAction.REFUSED) == []
    assert _layout_only(fn) == []
    (k,) = [k for k in fn.kernels if "gram" in k.name]
    assert "pf_mma_m16n8k16" in k.source
    assert "__half s_q[" in k.source and "__half s_q_t1[" in k.source  # A's tile and B's
    xv = (0.5 * _rand(64, 32)).astype(np.float16)
    wv = (0.3 * _rand(32, 32)).astype(np.float16)
    want = reference.evaluate([g], {x: xv, w: wv})[0].astype(np.float64)
    for race in (False, True):
        got = fn(xv, wv, device="emulate", race_check=race).astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
    _, copies, loads = bank_sites(fn, [xv, wv])
    assert copies and loads and [str(c) for c in copies + loads if c.conflicts] == []


def test_layout_op_as_graph_output_folds_into_the_producer_store():
    """out = transpose(a @ b) is a graph output: the GEMM computes it in the transposed
    layout (its store through the inverse permutation); one kernel, still a GEMM."""
    a, b = te.placeholder((64, 32), name="a"), te.placeholder((32, 48), name="b")
    out = ops.transpose(ops.matmul(a, b, name="ab"), name="out")
    before = _compile([a, b], [out], NO_FOLD)
    after = _compile([a, b], [out])
    assert len(before.launches) == 2 and len(_layout_only(before)) == 1
    assert len(after.launches) == 1 and _layout_only(after) == []
    (line,) = _records(after, PassAction.FOLDED)
    assert line.startswith("output out folded into the store of ab (producer side)")
    assert "injective, onto ab" in line
    assert list(after.plan.graph.prims) == ["out"]
    assert _gemm_note(after, "out")
    _check_numbers(after, [a, b], [out], [_rand(64, 32), _rand(32, 48)])


def test_reshape_output_with_div_mod_folds_into_an_elementwise_store():
    x = te.placeholder((6, 10), name="x")
    out = ops.reshape(ops.exp(x, name="ex"), (4, 15), name="out")
    after = _compile([x], [out])
    assert len(after.launches) == 1 and _layout_only(after) == []
    (line,) = _records(after, PassAction.FOLDED)
    assert "producer side" in line and "mod" in line
    _check_numbers(after, [x], [out], [_rand(6, 10)])


def test_non_injective_output_fold_is_refused():
    """An expand of a GEMM result as a graph output: storing through it would write each
    element of the product several times — refused (isl: not injective). The expand stays
    a primitive (here the GEMM's epilogue writes it), and the numbers are unchanged."""
    a, b = te.placeholder((32, 16), name="a"), te.placeholder((16, 32), name="b")
    ab = ops.matmul(a, b, name="ab")
    out = te.compute((32, 3, 32), lambda i, r, j: ab[i, j], name="expand")
    fn = _compile([a, b], [out])
    (line,) = _records(fn, PassAction.REFUSED)
    assert line.startswith("expand stays a kernel: ") and "is not injective" in line
    assert _records(fn, PassAction.FOLDED) == []
    assert sorted(fn.plan.graph.prims) == ["ab", "expand"]
    _check_numbers(fn, [a, b], [out], [_rand(32, 16), _rand(16, 32)])


def test_partial_and_shared_output_folds_are_refused():
    """A slice as an output covers part of its producer; a transpose whose producer has
    another reader would compute it twice: both stay kernels."""
    x = te.placeholder((8, 8), name="x")
    sl = ops.slice(ops.exp(x, name="ex"), [2], [6], [0], name="sl")
    fn = _compile([x], [sl])
    (line,) = _records(fn, PassAction.REFUSED)
    assert "does not cover ex" in line
    y = ops.exp(x, name="ey")
    outs = [ops.transpose(y, name="yt"), ops.relu(y, name="ry")]
    fn = _compile([x], outs)
    (line,) = _records(fn, PassAction.REFUSED)
    assert "ey has other readers" in line
    _check_numbers(fn, [x], outs, [_rand(8, 8)])


def test_gather_reader_keeps_the_move():
    """A reader that indexes the move by data (a gather) has no affine access to compose."""
    tab = te.placeholder((8, 4), name="tab")
    ids = te.placeholder((5,), name="ids")
    tt = ops.transpose(ops.exp(tab, name="et"), name="tt")  # (4, 8)
    g = te.compute((5, 4), lambda i, j: tt[j, te.data_index(ids[i])], name="g")
    graph = layout_fold(build_graph([tab, ids], [g]))
    reasons = [r.reason for r in graph.pass_records if r.action == PassAction.REFUSED]
    assert reasons == [
        "tt stays a kernel: g reads it at a data-dependent index (not an affine access)",
        "g stays a kernel: it reads tt at a data-dependent index (not an affine access)",
    ]
    assert "tt" in graph.prims


def test_concat_stays_out_of_a_gemm_operand_but_folds_into_elementwise():
    a, b = te.placeholder((16, 8), name="a"), te.placeholder((16, 8), name="b")
    w = te.placeholder((16, 16), name="w")
    cat = ops.concat([ops.exp(a, name="ea"), b], axis=1, name="cat")  # (16, 16)
    y = ops.matmul(cat, w, name="y")
    fn = _compile([a, b, w], [y])
    (line,) = _records(fn, PassAction.REFUSED)
    assert "a concat stays out of a contraction's operand (y)" in line
    _check_numbers(fn, [a, b, w], [y], [_rand(16, 8), _rand(16, 8), _rand(16, 16)])
    # an aligned concat fuses with its elementwise reader by the partition rules: no fold
    z = ops.relu(ops.concat([ops.exp(a, name="ea2"), b], axis=1, name="cat2"), name="z")
    fn = _compile([a, b], [z])
    assert _layout_only(fn) == [] and len(fn.launches) == 1
    assert _records(fn, PassAction.FOLDED) == []
    # a transpose read by that concat stays: folded, the concat would turn opaque and no
    # rule would fuse exp -> concat any more; left alone it fuses (opaque -> elementwise)
    c = te.placeholder((8, 16), name="c")
    cat = ops.concat([ops.exp(a, name="ea3"), ops.transpose(c, name="ct")], axis=1, name="cat3")
    z = ops.relu(cat, name="z3")
    fn = _compile([a, c], [z])
    assert _layout_only(fn) == [] and len(fn.launches) == 1
    (line,) = _records(fn, PassAction.REFUSED)
    assert line == (
        "ct stays a kernel: folded, cat3 would read it through a layout access and turn "
        "opaque: no partition rule would fuse ea3 -> cat3 any more"
    )
    _check_numbers(fn, [a, c], [z], [_rand(16, 8), _rand(8, 16)])


def test_patch_embedding_folds_through_concat_into_the_add_before_layer_norm():
    """ViT's embedding: conv output (B, C, P, P) -> reshape (B, C, N) -> transpose (B, N, C)
    -> concat with the class token -> + position -> layer norm. The add's micrograph joins
    the layer norm (rule 4 before rule 5), so a move left alone would be a kernel of its
    own: the reshape, transpose, token broadcast and concat all fold (two rounds) and the
    add reads the conv output through reshape∘transpose (div/mod by P)."""
    bs, ch, p = 2, 16, 4
    n = p * p
    x = te.placeholder((bs, ch, p, p), name="x")
    tok = te.placeholder((1, 1, ch), name="tok")
    pos = te.placeholder((1, n + 1, ch), name="pos")
    g, bt = te.placeholder((ch,), name="g"), te.placeholder((ch,), name="bt")
    e = ops.transpose(ops.reshape(ops.exp(x, name="ex"), (bs, ch, n), name="rs"), (0, 2, 1))
    cls = te.compute((bs, 1, ch), lambda i, r, j: tok[0, 0, j], name="cls")
    h = ops.add(ops.concat([cls, e], axis=1, name="cat"), pos, name="h")
    y = ops.layer_norm(h, g, bt, name="ln")
    ins = [x, tok, pos, g, bt]
    before = _compile(ins, [y], NO_FOLD)
    fn = _compile(ins, [y])
    assert _layout_only(before) and _layout_only(fn) == []
    assert len(fn.launches) < len(before.launches)
    folded = _records(fn, PassAction.FOLDED)
    assert any(line.startswith("cat folded into the loads of h") for line in folded)
    assert any("rs folded" in line and "mod 4" in line for line in folded)
    arrays = [_rand(bs, ch, p, p), _rand(1, 1, ch), _rand(1, n + 1, ch), _rand(ch), _rand(ch)]
    _check_numbers(fn, ins, [y], arrays)


def test_moves_are_recognised_by_their_bodies():
    x = te.placeholder((4, 6), name="x")
    assert is_move(ops.transpose(x))
    assert is_move(ops.reshape(x, (3, 8)))
    assert is_move(ops.concat([x, x], axis=0))
    assert not is_move(ops.exp(x))
    assert not is_move(te.compute((4, 6), lambda i, j: x[i, j] * 2.0))


@pytest.mark.slow  # BERT ~13 s, GPT-2 and ViT ~30 s each on 2 cores
@pytest.mark.parametrize("name", ["bert_base", "gpt2_small", "vit_b16"])
def test_tiny_transformers_have_no_layout_kernels(name):
    """The zoo transformers at tiny size: no kernel only reshapes or transposes, fewer
    launches than without the fold, and the emulator matches the reference."""
    from polyfuse import zoo

    m = zoo.build(name, "tiny")
    fn = polyfuse.compile(m.inputs, m.outputs, constants=m.constants, check_cuda=False)
    off = polyfuse.compile(
        m.inputs, m.outputs, constants=m.constants, check_cuda=False, passes=NO_FOLD
    )
    assert _layout_only(fn) == [] and _layout_only(off)
    assert len(fn.launches) < len(off.launches)
    arrays = m.sample_inputs(seed=3)
    got = fn(*arrays, device="emulate")
    got = got if isinstance(got, tuple) else (got,)
    want = m.reference(*arrays)
    want = want if isinstance(want, tuple | list) else (want,)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_run_passes_folds_to_a_fixed_point_and_values_hold():
    """A chain of moves (slice -> reshape -> transpose) folds in one pass: the reader reads
    the producer through the composition of all three; the reference values are equal."""
    x = te.placeholder((2, 6, 4), name="x")
    ex = ops.exp(x, name="ex")
    sl = ops.slice(ex, [1], [2], [0], name="sl")  # (1, 6, 4)
    rs = ops.reshape(sl, (4, 6), name="rs")
    tr = ops.transpose(rs, name="tr")  # (6, 4)
    out = ops.relu(tr, name="out")
    g = run_passes(build_graph([x], [out]), evaluate=lambda t, f: reference.evaluate([t], f)[0])
    assert sorted(g.prims) == ["ex", "out"]
    (rd,) = [n for n in walk(g.prims["out"].tensor.op.body) if isinstance(n, Read)]
    assert rd.tensor.name == "ex"
    xv = _rand(2, 6, 4)
    want = reference.evaluate([out], {x: xv})[0]
    np.testing.assert_array_equal(reference.evaluate(g.outputs, {x: xv})[0], want)


def test_a_reduction_takes_an_output_move_into_its_store_and_its_combine_stays_unguarded():
    """Fuzz seed 200250: a column sum stored through a transpose kept the tile of its output's
    last axis (2) on the statement's kept band (extent 3), so the partial tile's guard held
    the combine's barriers (a divergent ``__syncthreads``). The mapping now cuts the kept tile
    to one that tiles the band; the move folds into the store and the values hold in both
    thread orders."""
    x = te.placeholder((2, 2, 3), name="x")
    u = te.compute((2, 2, 3), lambda i, j, c: -x[i, j, c], name="u")
    b = te.compute((2, 2, 3), lambda i, j, c: u[i, j, c] + x[i, j, c] * 2.0, name="b")
    k = te.reduce_axis(2, name="k")
    r = te.compute((2, 3), lambda i, j: te.sum(b[k, i, j], axis=[k]), name="r")
    t = te.compute((3, 2), lambda i, j: r[j, i], name="t")
    fn = _compile([x], [t])
    assert len(fn.kernels) == 1
    assert any("'t'" in line or " t " in line for line in _records(fn, PassAction.FOLDED))
    assert "tiles the kept ranges" in " ".join(fn.kernels[0].notes)
    _check_numbers(
        fn, [x], [t], [RNG.uniform(0.5, 2.5, (2, 2, 3)).astype(np.float32)], race_check=True
    )


def test_a_column_max_with_a_transposed_store_runs_in_both_thread_orders():
    """The larger fuzz graph of seed 200250: a column max beside an elementwise output."""
    x = te.placeholder((8, 32, 3), name="x")
    e = te.compute((8, 32, 3), lambda a, b, c: -x[a, b, c] / x[a, b, c], name="e")
    g = te.compute((8, 32, 3), lambda a, b, c: e[a, b, c] * e[a, b, c], name="g")
    k = te.reduce_axis(8, name="k")
    r = te.compute((32, 3), lambda i, j: te.max(e[k, i, j], axis=[k]), name="r")
    t = te.compute((3, 32), lambda i, j: r[j, i], name="t")
    fn = _compile([x], [g, t])
    xs = [RNG.uniform(0.5, 2.5, (8, 32, 3)).astype(np.float32)]
    _check_numbers(fn, [x], [g, t], xs, race_check=True)


def test_a_gather_along_a_dimension_of_extent_1_folds_the_move_and_drops_its_table():
    """Found by ``polyfuse fuzz --onnx`` (seed 127: a nearest Resize of a reshaped input):
    the composed subscript of a data index into a dimension of extent 1 is 0, so the
    rewritten reader no longer reads the index table. The fold's isl check raised an
    AssertionError ("it reads other tensors than the composition says"); a table read only
    inside data indices may go."""
    x = te.placeholder((2, 3, 1), name="x")
    ids = te.placeholder((2,), name="ids")
    r = ops.reshape(ops.exp(x, name="ex"), (1, 1, 6, 1), name="r")
    g = te.compute((1, 1, 6, 2), lambda a, b, c, d: r[a, b, c, te.data_index(ids[d])] * 2.0,
                   name="g")  # fmt: skip
    fn = _compile([x, ids], [g])
    assert "r" not in fn.plan.graph.prims
    _check_numbers(fn, [x, ids], [g], [_rand(2, 3, 1), np.zeros(2, np.float32)])


def test_a_reduction_reading_an_index_table_per_column_beside_a_folded_move_compiles():
    """A reduction reading an int64 table at ``t[j, 0]`` and ``t[j, 1]`` beside a folded
    transpose crashed layout folding with a bare StopIteration (found by ONNX ScatterND's
    import): the single-access rule for 16-bit tensor-core operands took the int64 table for
    one and looked for a fold to undo among the reads of other tensors."""
    x = te.placeholder((6, 4), "float32", name="x")
    t = te.placeholder((6, 2), "int64", name="t")
    xt = ops.transpose(x, [1, 0], name="xt")

    def body(i):
        j = te.reduce_axis(6, name="j")
        hit = te.equal(t[j, 0], te.cast(i, "int64")) & (t[j, 1] >= 0)
        return te.sum(te.where(hit, xt[0, j], 0.0), axis=j)

    s = te.compute((4,), body, name="s")
    fn = polyfuse.compile([x, t], [s])
    xv = np.arange(24, dtype=np.float32).reshape(6, 4)
    tv = np.array([[0, 1], [1, 1], [0, -1], [3, 0], [2, 2], [0, 0]], np.int64)
    np.testing.assert_array_equal(fn(xv, tv, device="emulate"), [20, 4, 16, 12])
