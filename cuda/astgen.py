"""isl AST generation for a mapped micrograph, converted into our kernel AST.

``AstBuild.from_context`` gets the block/thread parameter ranges so isl drops guards they
imply; ``node_from_schedule`` then emits loops only for the serial (unmapped) schedule
dimensions and ``if``s for partial tiles. User nodes are calls ``S(i0, i1, ...)`` whose
arguments are the statement's domain coordinates as isl expressions of loop iterators and
parameters; we keep them as :class:`KStmt` and let the printer write statement bodies.
"""

from __future__ import annotations

import islpy as isl

from polyfuse.cuda.kernel_ast import KDef, KExpr, KFor, KIf, KInt, KMark, KNode, KOp, KStmt, KVar
from polyfuse.poly.mapping import MappedMicrograph

_OP = isl.ast_expr_op_type
_BIN = {
    _OP.add: "+",
    _OP.sub: "-",
    _OP.mul: "*",
    _OP.div: "/",
    _OP.pdiv_q: "/",
    _OP.pdiv_r: "%",
    _OP.zdiv_r: "%",
    _OP.fdiv_q: "fdiv",
    _OP.eq: "==",
    _OP.le: "<=",
    _OP.lt: "<",
    _OP.ge: ">=",
    _OP.gt: ">",
    _OP.and_: "&&",
    _OP.and_then: "&&",
    _OP.or_: "||",
    _OP.or_else: "||",
    _OP.min: "min",
    _OP.max: "max",
}


def convert_expr(e: isl.AstExpr) -> KExpr:
    """isl AST expression → :class:`KExpr`."""
    t = e.get_type()
    if t == isl.ast_expr_type.int:
        return KInt(e.int_get_val().to_python())
    if t == isl.ast_expr_type.id:
        return KVar(e.id_get_id().get_name())
    op = e.op_get_type()
    args = tuple(convert_expr(e.op_get_arg(i)) for i in range(e.op_get_n_arg()))
    if op == _OP.minus:
        return KOp("neg", args)
    if op in (_OP.cond, _OP.select):
        return KOp("?:", args)
    if op in _BIN:
        name = _BIN[op]
        if name in ("min", "max") and len(args) > 2:  # isl min/max are n-ary
            acc = args[0]
            for a in args[1:]:
                acc = KOp(name, (acc, a))
            return acc
        return KOp(name, args)
    raise NotImplementedError(f"isl AST operator {op}")


def convert_node(n: isl.AstNode) -> list[KNode]:
    """isl AST node → list of kernel AST nodes."""
    t = n.get_type()
    if t == isl.ast_node_type.block:
        out: list[KNode] = []
        kids = n.block_get_children()
        for i in range(kids.n_ast_node()):
            out.extend(convert_node(kids.get_at(i)))
        return out
    if t == isl.ast_node_type.for_:
        var = n.for_get_iterator().id_get_id().get_name()
        init = convert_expr(n.for_get_init())
        body = convert_node(n.for_get_body())
        if n.for_is_degenerate():
            return [KDef(var, init, body)]
        inc = n.for_get_inc().int_get_val().to_python()
        return [KFor(var, init, convert_expr(n.for_get_cond()), inc, body)]
    if t == isl.ast_node_type.if_:
        then = convert_node(n.if_get_then_node())
        orelse = convert_node(n.if_get_else_node()) if n.if_has_else_node() else []
        return [KIf(convert_expr(n.if_get_cond()), then, orelse)]
    if t == isl.ast_node_type.user:
        call = n.user_get_expr()
        name = call.op_get_arg(0).id_get_id().get_name()
        args = tuple(convert_expr(call.op_get_arg(i)) for i in range(1, call.op_get_n_arg()))
        return [KStmt(name, args)]
    if t == isl.ast_node_type.mark:
        return [KMark(n.mark_get_id().get_name(), convert_node(n.mark_get_node()))]
    raise NotImplementedError(f"isl AST node type {t}")


def generate_ast(mm: MappedMicrograph) -> tuple[isl.AstNode, list[KNode]]:
    """Run isl AST generation on the mapped schedule; return isl's AST and ours."""
    build = isl.AstBuild.from_context(mm.context)
    ast = build.node_from_schedule(mm.schedule)
    return ast, convert_node(ast)
