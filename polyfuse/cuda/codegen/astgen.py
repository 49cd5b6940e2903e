"""isl AST generation for a mapped micrograph, converted into our kernel AST.

``AstBuild.from_context`` gets the block/thread parameter ranges so isl drops guards they
imply; ``node_from_schedule`` then emits loops only for the serial (unmapped) schedule
dimensions and ``if``s for partial tiles. User nodes are calls ``S(i0, i1, ...)`` whose
arguments are the statement's domain coordinates as isl expressions of loop iterators and
parameters; we keep them as :class:`KStmt` and let the printer write statement bodies.
"""

from __future__ import annotations

import islpy as isl

from polyfuse.cuda.codegen.kernel_ast import (
    KDef,
    KExpr,
    KFor,
    KIf,
    KInt,
    KMark,
    KNode,
    KOp,
    KStmt,
    KVar,
)
from polyfuse.cuda.codegen.namer import loop_variable
from polyfuse.poly.gemm_tree import PHASE, ast_schedule
from polyfuse.poly.mapping import MappedKernel
from polyfuse.poly.promote import GemmKernel

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


def _implied(prefix: isl.UnionMap, member: isl.UnionMap, domain: isl.UnionSet) -> bool:
    """Whether ``member`` is a function of ``prefix`` on ``domain`` (it orders nothing)."""
    member = member.intersect_domain(domain)
    return prefix.intersect_domain(domain).reverse().apply_range(member).is_single_valued()


def _trim_band(node: isl.ScheduleNode) -> tuple[isl.ScheduleNode, bool]:
    """Drop the band members that the schedule before them determines.

    Returns the node at the same position and whether the whole band went (the node is then
    the band's child).
    """
    domain = node.get_domain()
    acc = node.get_prefix_schedule_union_map()
    part = node.band_get_partial_schedule()
    n = node.band_n_member()
    keep = []
    for j in range(n):
        member = isl.UnionMap.from_union_pw_aff(part.get_at(j))
        if not _implied(acc, member, domain):
            keep.append(j)
            acc = acc.flat_range_product(member)
    if len(keep) == n:
        return node, False
    if not keep:
        return node.delete(), True
    flags = [node.band_member_get_coincident(j) for j in keep]
    permutable = node.band_get_permutable()
    for j in reversed(range(n)):
        if j not in keep:
            part = part.drop_dims(isl.dim_type.set, j, 1)
    node = node.delete().insert_partial_schedule(part).band_set_permutable(permutable)
    for i, c in enumerate(flags):
        node = node.band_member_set_coincident(i, c)
    return node, False


def _visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
    """Trim every band at or below ``node``; returns the node at the same position."""
    if node.get_type() == isl.schedule_node_type.band:
        node, gone = _trim_band(node)
        if gone:
            return _visit(node)  # trim what took the band's place
    return _visit_children(node)


def _visit_children(node: isl.ScheduleNode) -> isl.ScheduleNode:
    for i in range(node.n_children()):
        node = _visit(node.child(i)).parent()
    return node


def drop_implied_members(sched: isl.Schedule) -> isl.Schedule:
    """The same execution order without band members the enclosing schedule determines.

    Such members order nothing (every instance already has its own outer schedule value),
    but isl's AST generator mishandles some of them: after isl's scheduler put
    ``[8r0 + 4r1 + 2r2 + r3]`` above ``[r0, r1, r2]`` (four reduce axes of extent 2), it
    emitted a loop that ran half of the instances (r2 = 0 only) — a silently wrong
    reduction. Removing them gives isl the schedule it generates correctly.
    """
    return _visit(sched.get_root()).get_schedule()


def aligned_build(context: isl.Set, like: isl.Space) -> isl.AstBuild:
    """An AST build whose context lists the parameters of ``like`` first, in ``like``'s order.

    isl's AST generation mixes parameters up when the context orders them differently from
    the schedule: a copy guard ``(p0c + 11) % 16 >= 11`` (the copy's thread coordinate) came
    out as ``(t1 + 11) % 16 >= 11`` (another parameter at that position), so only some
    threads copied a strided conv's input tile — a silently wrong result. Everything built
    with a context goes through here, its schedule or expressions aligned to the same space.
    """
    return isl.AstBuild.from_context(context.align_params(like))


def expr_from(build_context: isl.Set, pa: isl.PwAff) -> isl.AstExpr:
    """isl's AST expression of ``pa`` under ``build_context`` (parameters aligned first)."""
    pa = pa.align_params(build_context.get_space())
    return aligned_build(build_context, pa.get_space()).expr_from_pw_aff(pa)


def generate_ast(mm: MappedKernel) -> tuple[isl.AstNode, list[KNode]]:
    """Run isl AST generation on the mapped schedule; return isl's AST and ours."""
    sched = drop_implied_members(mm.schedule).align_params(mm.context.get_space())
    build = aligned_build(mm.context, sched.get_domain().get_space())
    ast = build.node_from_schedule(sched)
    return ast, convert_node(ast)


def generate_gemm_ast(gk: GemmKernel) -> tuple[isl.AstNode, list[KNode]]:
    """isl AST generation from the kernel's schedule tree (its marks dropped), loop variables
    named by role (in the namer's generated space; the phase is a sequence, no loop)."""
    ctx = gk.context.get_ctx()
    assert gk.schedule_tree is not None
    sched = ast_schedule(gk.schedule_tree).align_params(gk.context.get_space())
    build = aligned_build(gk.context, sched.get_domain().get_space())
    names = [n for n in gk.iterators if n != PHASE]
    ids = isl.IdList.alloc(ctx, len(names))
    for name in names:
        ids = ids.add(isl.Id(loop_variable(name), context=ctx))
    build = build.set_iterators(ids)
    ast = build.node_from_schedule(sched)
    return ast, convert_node(ast)
