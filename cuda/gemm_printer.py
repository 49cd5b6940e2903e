"""CUDA printer for GEMM-like kernels (:class:`polyfuse.poly.promote.GemmKernel`).

isl generates the loop AST from the tiled schedule map (:func:`generate_gemm_ast`); this module
prints it: copy statements ``C_x`` fill the ``__shared__`` tiles (zeros outside the array),
barrier statements become IR barriers (``lower_barriers.lower_sync_statements``), the
accumulator is a register array indexed by the micro-tile loop variables (loops with constant
trip counts get ``#pragma unroll`` so the array lives in registers), promoted reads index the
shared tile, and epilogue statements are guarded by the original domain (the schedule runs on
whole tiles). Not yet a pure function of the kernel IR: parameters, tiles and copies are still
decided here (issue 11).
"""

from __future__ import annotations

import islpy as isl

from polyfuse.cuda.astgen import convert_expr, convert_node
from polyfuse.cuda.kernel_ast import (
    KBarrier,
    KDef,
    Kernel,
    KFor,
    KIf,
    KInt,
    KMark,
    KNode,
    KParam,
    KStmt,
)
from polyfuse.cuda.lower_barriers import lower_sync_statements
from polyfuse.cuda.printer import BARRIER as _BARRIER
from polyfuse.cuda.printer import BodyPrinter, c_index
from polyfuse.cuda.printer import decompose as _decompose
from polyfuse.poly.placement import Placement
from polyfuse.poly.promote import SYNC_AFTER, SYNC_BEFORE, GemmKernel


def generate_gemm_ast(gk: GemmKernel) -> tuple[isl.AstNode, list[KNode]]:
    """isl AST generation from the tiled schedule map, loop variables named by role."""
    ctx = gk.context.get_ctx()
    build = isl.AstBuild.from_context(gk.context)
    ids = isl.IdList.alloc(ctx, len(gk.iterators))
    for name in gk.iterators:
        ids = ids.add(isl.Id(name, context=ctx))
    build = build.set_iterators(ids)
    ast = build.node_from_schedule_map(gk.schedule_map)
    return ast, convert_node(ast)


class _GemmBody(BodyPrinter):
    """Reads of promoted operands go to their shared tile; the accumulator to registers."""

    def __init__(self, gk: GemmKernel, placements: dict[str, Placement], idents: dict[int, str]):
        self.prom = {p.tensor: p for p in gk.promotions}
        # The boxes' lower bounds as C (the k-tile loops are named kt*, like isl's params).
        build = isl.AstBuild.from_context(gk.tile_context)
        self.lo = {
            p.tensor: [c_index(convert_expr(build.expr_from_pw_aff(lo))) for lo in p.lo]
            for p in gk.promotions
        }
        # Outside the update (the epilogue) a promoted tensor is read from global memory.
        as_global = {
            k: Placement(k, "global", p.reason) if k in self.prom else p
            for k, p in placements.items()
        }
        super().__init__(as_global, idents)
        self.acc = f"{gk.shape.update.prim}_acc"
        self.reg_index = "".join(f"[{v}]" for v in gk.reg_iters) or "[0]"
        self.in_update = False  # only the update's reads are rewritten to the shared tiles

    def tensor_ref(self, ident, shape, idx, store=False):
        if ident == self.acc:
            return f"r_{ident}{self.reg_index}"
        p = self.prom.get(ident) if self.in_update else None
        if p is not None and not store:
            terms = [
                f"({i} - {lo})" + (f" * {st}" if st != 1 else "")
                for i, lo, st in zip(idx, self.lo[ident], p.stride, strict=True)
            ]
            return f"s_{ident}[{' + '.join(terms)}]"
        return super().tensor_ref(ident, shape, idx, store)


def _unrollable(n: KFor) -> bool:
    return isinstance(n.init, KInt) and n.var.startswith("ii")


def print_gemm_kernel(
    name: str, gk: GemmKernel, body: list[KNode], placements: dict[str, Placement], idents
) -> Kernel:
    """Print a GEMM kernel's AST as one ``__global__`` function."""
    model = gk.scheduled.model
    tiling = gk.tiling
    assert tiling is not None and gk.shape is not None
    bp = _GemmBody(gk, placements, idents)
    stmts = {s.name: s for s in model.statements}
    prom = {p.copy_stmt: p for p in gk.promotions}

    def copy(n: KStmt) -> str:
        p = prom[n.stmt]
        nk = len(n.args) - len(p.size)
        es = [c_index(a) for a in n.args[nk:]]
        dst = " + ".join(
            f"({e} - {lo})" + (f" * {st}" if st != 1 else "")
            for e, lo, st in zip(es, bp.lo[p.tensor], p.stride, strict=True)
        )
        lin, stride = [], 1
        for d in reversed(range(len(es))):
            lin.append(es[d] if stride == 1 else f"{es[d]} * {stride}")
            stride *= p.shape[d]
        src = f"{p.tensor}[{' + '.join(reversed(lin))}]"
        conds = [
            f"{e} >= 0 && {e} < {size}"
            for e, size, chk in zip(es, p.shape, p.bounds_check, strict=True)
            if chk
        ]
        value = f"({' && '.join(conds)}) ? {src} : 0.0f" if conds else src
        return f"s_{p.tensor}[{dst}] = {value};"

    def emit_stmt(n: KStmt) -> str:
        if n.stmt in prom:
            return copy(n)
        s = stmts[n.stmt]
        args = [c_index(a) for a in n.args]
        bp.in_update = s.role == "update"
        text = bp.statement(s, args, s.prim)
        bounds = gk.guards.get(n.stmt, [])
        conds = [f"{a} <= {hi}" for a, (_, hi) in zip(args, bounds, strict=False) if hi is not None]
        return f"if ({' && '.join(conds)}) {{ {text} }}" if conds else text

    def emit(nodes: list[KNode], depth: int) -> list[str]:
        pad = "  " * depth
        out: list[str] = []
        for n in nodes:
            if isinstance(n, KMark):
                out += emit(n.body, depth)
            elif isinstance(n, KFor):
                init, cond = c_index(n.init), c_index(n.cond)
                if _unrollable(n):
                    out.append(f"{pad}#pragma unroll")
                out.append(f"{pad}for (int {n.var} = {init}; {cond}; {n.var} += {n.step}) {{")
                out += emit(n.body, depth + 1)
                out.append(f"{pad}}}")
            elif isinstance(n, KIf):
                out.append(f"{pad}if ({c_index(n.cond)}) {{")
                out += emit(n.then, depth + 1)
                if n.orelse:
                    out.append(f"{pad}}} else {{")
                    out += emit(n.orelse, depth + 1)
                out.append(f"{pad}}}")
            elif isinstance(n, KDef):
                out.append(f"{pad}{{")
                out.append(f"{pad}  const int {n.var} = {c_index(n.value)};")
                out += emit(n.body, depth + 1)
                out.append(f"{pad}}}")
            elif isinstance(n, KStmt):
                out.append(pad + emit_stmt(n))
            elif isinstance(n, KBarrier):
                out.append(f"{pad}{_BARRIER[n.scope]};")
            else:
                raise TypeError(f"the GEMM printer has no rule for {type(n).__name__}")
        return out

    params: list[KParam] = []
    for ident, role in model.tensors.items():
        if placements[ident].space == "register":
            continue
        const = role.role == "input"
        params.append(KParam(ident, "const float*" if const else "float*", ident))
    nthreads = tiling.nthreads
    sig = ", ".join(f"{p.ctype} __restrict__ {p.name}" for p in params)
    lines = [f'extern "C" __global__ void __launch_bounds__({nthreads}) {name}({sig}) {{']
    lines += _decompose("blockIdx.x", "_b", list(zip(gk.block_params, gk.grid_dims, strict=True)))
    lines += _decompose(
        "threadIdx.x", "_t", list(zip(gk.thread_params, gk.tile_sizes, strict=True))
    )
    for p in gk.promotions:
        rows, cols = p.thread_grid
        lines.append(f"  const int {p.params[0]} = threadIdx.x / {cols};")
        lines.append(f"  const int {p.params[1]} = threadIdx.x % {cols};")
        lines.append(f"  __shared__ float s_{p.tensor}[{p.floats}];")
    regs = [r for r in tiling.regs if r > 1]
    dims = "".join(f"[{r}]" for r in regs) or "[1]"
    lines.append(f"  float r_{bp.acc}{dims};")
    for ident, p in placements.items():
        if ident != bp.acc and p.in_register:
            lines.append(f"  float r_{ident};")
    lines += emit(lower_sync_statements(body, frozenset((SYNC_BEFORE, SYNC_AFTER))), 1)
    lines.append("}")
    grid = 1
    for g in gk.grid_dims:
        grid *= g
    return Kernel(
        name,
        params,
        body,
        (grid, 1, 1),
        (nthreads, 1, 1),
        [model.micrograph.name],
        shared_bytes=0,
        source="\n".join(lines) + "\n",
    )
