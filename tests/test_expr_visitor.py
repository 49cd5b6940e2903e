"""The expression visitor/mutator bases (graph/expr.py, cuda/codegen/kernel_ast.py) and that every
walker uses them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from polyfuse.cuda.codegen import kernel_ast as k
from polyfuse.graph.expr import (
    NODE_CLASSES,
    Binary,
    Cast,
    Compare,
    Const,
    DataIndex,
    ExprMutator,
    ExprVisitor,
    IterVar,
    Logical,
    Read,
    Reduce,
    Select,
    Tensor,
    Unary,
    rewrite,
    substitute,
)

ROOT = Path(__file__).resolve().parents[1]


class _Count(ExprVisitor[int]):
    """Counts nodes; only IterVar has its own rule, the rest go through visit_default."""

    def visit_IterVar(self, e: IterVar) -> int:
        return 100

    def visit_default(self, e, *args) -> int:
        return 1 + sum(self.visit(c) for c in e.children())


def test_dispatch_by_node_class_with_default():
    i = IterVar("i", 0, 4)
    assert _Count().visit(i * 2 + 1) == 1 + (1 + 100 + 1) + 1


def test_missing_rule_raises_naming_visitor_and_node():
    class OnlyConst(ExprVisitor[str]):
        def visit_Const(self, e: Const) -> str:
            return "c"

    assert OnlyConst().visit(Const(1.0)) == "c"
    with pytest.raises(TypeError, match="OnlyConst has no rule for IterVar"):
        OnlyConst().visit(IterVar("i", 0, 2))


def test_extra_arguments_are_passed_through():
    class Env(ExprVisitor[str]):
        def visit_IterVar(self, e: IterVar, env: dict[int, str]) -> str:
            return env[e.uid]

        def visit_Binary(self, e: Binary, env: dict[int, str]) -> str:
            return f"{self.visit(e.a, env)}{e.op}{self.visit(e.b, env)}"

    i, j = IterVar("i", 0, 2), IterVar("j", 0, 2)
    assert Env().visit(i + j, {i.uid: "x", j.uid: "y"}) == "xaddy"


def test_mutator_keeps_unchanged_subtrees_and_rebuilds_changed_ones():
    x = Tensor((4,), "float32", "x")
    i, j = IterVar("i", 0, 4), IterVar("j", 0, 4)
    e = x[i] * 2.0 + x[j]
    assert ExprMutator().visit(e) is e  # nothing replaced: the very same tree

    class IToJ(ExprMutator):
        def visit_IterVar(self, v: IterVar):
            return j if v is i else v

    out = IToJ().visit(e)
    assert out is not e and repr(out) == "((x[j] * 2.0) + x[j])"
    assert out.b is e.b  # the untouched read is shared, not copied
    assert isinstance(out.a.a, Read) and out.a.a is not e.a.a


def test_rewrite_and_substitute():
    i = IterVar("i", 0, 4)
    three = Const(3, "int32")
    assert repr(substitute(i * 2 + i, {i.uid: three})) == "((3 * 2) + 3)"
    doubled = rewrite(i + 1, lambda n, k: Binary("mul", *k) if isinstance(n, Binary) else None)
    assert repr(doubled) == "(i * 1)"


def test_every_node_class_has_a_rebuild_rule():
    v = IterVar("zz", 0, 4)
    nodes = {
        Read: Tensor((4,), "float32", "x")[v],
        Unary: -v,
        Binary: v + 1,
        Compare: v < 2,
        Logical: (v < 2) & (v > 0),
        Select: Select(v < 2, v, v),
        Cast: Cast(v, "int32"),
        DataIndex: DataIndex(v),
        Reduce: Reduce("sum", v, ()),
    }
    assert set(nodes) | {IterVar, Const} == set(NODE_CLASSES)

    class Zero(ExprMutator):
        def visit_IterVar(self, e: IterVar):
            return Const(0, "int32")

    for cls, node in nodes.items():
        out = Zero().visit(node)
        assert type(out) is cls and "zz" not in repr(out), cls.__name__


def _node_isinstance_chains(
    tree: ast.AST, classes: tuple[type, ...] = NODE_CLASSES
) -> list[tuple[str, int]]:
    """Functions that test one value against three or more node ``classes`` (a dispatch
    chain); matching a fixed pattern (``e`` a Select whose ``e.a`` is a Read) is fine."""
    names = {c.__name__ for c in classes}
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        tested: dict[str, set[str]] = {}
        for call in ast.walk(fn):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Name)
                and call.func.id == "isinstance"
                and len(call.args) == 2
            ):
                classes = {n.id for n in ast.walk(call.args[1]) if isinstance(n, ast.Name)}
                tested.setdefault(ast.unparse(call.args[0]), set()).update(classes & names)
        if any(len(c) >= 3 for c in tested.values()):
            found.append((fn.name, fn.lineno))
    return found


@pytest.mark.parametrize("classes", [NODE_CLASSES, k.NODE_CLASSES], ids=["expression", "kernel-IR"])
def test_no_walker_dispatches_on_node_classes_by_isinstance(classes):
    """Expression and kernel-IR walkers subclass ExprVisitor/ExprMutator or KVisitor/KMutator
    instead of isinstance chains."""
    offenders = []
    for pkg in ("polyfuse", "graph", "poly", "stitch", "cuda"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for name, line in _node_isinstance_chains(ast.parse(path.read_text()), classes):
                offenders.append(f"{path.relative_to(ROOT)}:{line} {name}")
    assert offenders == []


def test_chain_check_sees_a_kernel_ir_isinstance_chain():
    src = (
        "def emit(n):\n"
        "    if isinstance(n, KFor): pass\n"
        "    elif isinstance(n, KIf): pass\n"
        "    elif isinstance(n, (KStmt, KCopy)): pass\n"
    )
    assert _node_isinstance_chains(ast.parse(src), k.NODE_CLASSES) == [("emit", 1)]


def test_every_kernel_ir_class_is_dispatched():
    """NODE_CLASSES lists every statement and integer-expression class of the kernel IR."""
    defined = {
        v
        for v in vars(k).values()
        if isinstance(v, type) and issubclass(v, k.KNode | k.KExpr) and v not in (k.KNode, k.KExpr)
    }
    assert defined == set(k.NODE_CLASSES)


def test_kernel_visitor_dispatch_and_mutator_rebuild():
    body = [
        k.KMark("part:a", [k.KFor("i", k.KInt(0), k.KInt(3), 1, [k.KStmt("S", (k.KVar("i"),))])]),
        k.KAsyncCopy("d", (), "s", ()),
        k.KCopy("d", (), "s", ()),
    ]

    class Kinds(k.KVisitor[str]):
        def visit_KCopy(self, n):
            return "copy"

    assert Kinds().visit(body[2]) == "copy"
    with pytest.raises(TypeError, match="Kinds has no rule for KAsyncCopy"):
        Kinds().visit(body[1])  # exact-class dispatch: a subclass needs its own rule

    class StmtToBarrierPair(k.KMutator):
        def visit_KStmt(self, n):
            return [k.KBarrier(k.Scope.BLOCK), n]

    out = StmtToBarrierPair().body(body)
    assert out[1:] == body[1:]  # leaves returned as they are
    loop = out[0].body[0]
    assert out[0] is not body[0] and isinstance(loop, k.KFor)
    assert [type(n).__name__ for n in loop.body] == ["KBarrier", "KStmt"]
    assert [type(n).__name__ for n in body[0].body[0].body] == ["KStmt"]  # input unchanged
