"""Op kinds come from isl dataflow relations, not from op names."""

import islpy as isl
import pytest

from polyfuse import ops, te
from polyfuse.graph.graph import build_graph
from polyfuse.graph.kinds import AccessKind, OpKind, access_kind


def kinds_of(inputs, outputs):
    g = build_graph(inputs, outputs)
    return {p.name: p.kind for p in g.prims.values()}, g


@pytest.mark.parametrize(
    "read, in_shape, expected",
    [
        ("{ S[i, j] -> X[i, j] }", (4, 8), AccessKind.ALIGNED),
        ("{ S[i, j] -> X[i + 1, j] }", (5, 8), AccessKind.ALIGNED),
        ("{ S[i, j] -> b[j] }", (8,), AccessKind.INJECTIVE),
        ("{ S[i, j] -> X[0, j] }", (1, 8), AccessKind.INJECTIVE),
        ("{ S[i, j] -> X[j, i] }", (8, 4), AccessKind.LAYOUT),
        ("{ S[i, j] -> X[2i, j] }", (8, 8), AccessKind.LAYOUT),
    ],
)
def test_access_kind_from_isl_strings(read, in_shape, expected):
    dom = "0 <= i < 4 and 0 <= j < 8"
    w = isl.Map(f"{{ S[i, j] -> T[i, j] : {dom} }}")
    r = isl.Map(read).intersect_domain(isl.Set(f"{{ S[i, j] : {dom} }}"))
    assert access_kind(r, w, in_shape, (4, 8)) == expected


def test_reduction_and_contraction_accesses():
    dom = "{ S[i, j, k] : 0 <= i < 4 and 0 <= j < 3 and 0 <= k < 8 }"
    w = isl.Map("{ S[i, j, k] -> C[i, j] }").intersect_domain(isl.Set(dom))
    a = isl.Map("{ S[i, j, k] -> A[i, k] }").intersect_domain(isl.Set(dom))
    assert access_kind(a, w, (4, 8), (4, 3)) == AccessKind.GENERAL
    w2 = isl.Map("{ S[i, k] -> T[i] : 0 <= i < 4 and 0 <= k < 8 }")
    r2 = isl.Map("{ S[i, k] -> X[i, k] : 0 <= i < 4 and 0 <= k < 8 }")
    assert access_kind(r2, w2, (4, 8), (4,)) == AccessKind.SURJECTIVE


def test_elementwise_and_bias_broadcast():
    x, b = te.placeholder((4, 8), name="x"), te.placeholder((8,), name="b")
    e = ops.exp(x, name="e")
    y = ops.add(e, b, name="y")
    kinds, _ = kinds_of([x, b], [y])
    assert kinds["e"] == OpKind.ELEMENTWISE
    assert kinds["y"] == OpKind.BROADCAST


@pytest.mark.parametrize("axis", [0, 1, None])
def test_reductions_row_col_all(axis):
    x = te.placeholder((4, 8), name="x")
    kinds, _ = kinds_of([x], [ops.reduce_sum(x, axis=axis, name="r")])
    assert kinds["r"] == OpKind.REDUCTION


def test_opaque_ops():
    a, b = te.placeholder((4, 8), name="a"), te.placeholder((8, 3), name="b")
    xi, w = te.placeholder((1, 2, 6, 6), name="xi"), te.placeholder((3, 2, 3, 3), name="w")
    outs = [
        ops.matmul(a, b, name="mm"),
        ops.conv2d(xi, w, padding=1, name="cv"),
        ops.reshape(a, (8, 4), name="rs"),
        ops.transpose(a, name="tr"),
    ]
    kinds, _ = kinds_of([a, b, xi, w], outs)
    for n in ("mm", "cv", "rs", "tr"):
        assert kinds[n] == OpKind.OPAQUE, n


def test_kind_does_not_depend_on_names():
    # The same computation under a misleading name is classified by its relations.
    x = te.placeholder((4, 8), name="x")
    k = te.reduce_axis(8, name="k")
    looks_elementwise = te.compute((4,), lambda i: te.sum(x[i, k], axis=k), name="relu")
    kinds, _ = kinds_of([x], [looks_elementwise])
    assert kinds["relu"] == OpKind.REDUCTION
