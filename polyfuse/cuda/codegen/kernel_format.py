"""``print(ir)`` of a :class:`polyfuse.cuda.codegen.kernel_ast.KernelIR`: the kernel IR as
pseudo-code,
every node and table shown (accesses with their buffer, scope and index)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from polyfuse.cuda.codegen.kernel_nodes import (
    ROW_BLOCK,
    KAlloc,
    KAssign,
    KAsyncCopy,
    KBarrier,
    KChunkCopy,
    KCombine,
    KCommit,
    KCopy,
    KDef,
    KFor,
    KFragmentLoad,
    KGuardedCopy,
    KIf,
    KLdmatrix,
    KLet,
    KMark,
    KMma,
    KNode,
    KRegisters,
    KRowBlocks,
    KScope,
    KSection,
    KStmt,
    KVector,
    KVectorStore,
    KWait,
)
from polyfuse.cuda.codegen.kernel_walk import KVisitor


class _Format(KVisitor[list[str]]):
    """The pseudo-code lines of ``print(ir)``, one visit per node at indentation ``depth``."""

    def lines(self, nodes: Sequence[KNode], depth: int) -> list[str]:
        return [line for n in nodes for line in self.visit(n, depth)]

    def visit_default(self, n: Any, depth: int) -> list[str]:
        # a node defined above this module (a Layer 3 dispatch) formats itself
        return n.format_lines(depth, self.lines) if hasattr(n, "format_lines") else []

    def visit_KFor(self, n: KFor, depth: int) -> list[str]:
        unroll = f"  // unrolled{f' by {n.unroll_by}' if n.unroll_by else ''}" if n.unroll else ""
        unroll += "  // rolled" if n.rolled else ""
        head = f"{'  ' * depth}for {n.var} = {n.init}; {n.cond}; += {n.step}{unroll}"
        pad = "  " * (depth + 1)
        ptrs = [f"{pad}stream {p.name} = &{p.array}[{p.start}] += {p.step}" for p in n.streams]
        return [head] + ptrs + self.lines(n.body, depth + 1)

    def visit_KIf(self, n: KIf, depth: int) -> list[str]:
        pad = "  " * depth
        out = [f"{pad}if {n.cond}"] + self.lines(n.then, depth + 1)
        if n.orelse:
            out += [f"{pad}else"] + self.lines(n.orelse, depth + 1)
        return out

    def visit_KCombine(self, n: KCombine, depth: int) -> list[str]:
        head = (
            f"{'  ' * depth}combine {n.form} {n.reduction} lanes={n.lanes} kept={n.kept} "
            f"{n.scope.value} scratch={n.scratch}"
        )
        return [head] + self.lines(n.body, depth + 1)

    def visit_KDef(self, n: KDef, depth: int) -> list[str]:
        return [f"{'  ' * depth}let {n.var} = {n.value}"] + self.lines(n.body, depth + 1)

    def visit_KMark(self, n: KMark, depth: int) -> list[str]:
        return [f"{'  ' * depth}// {n.name}"] + self.lines(n.body, depth)

    def visit_KVector(self, n: KVector, depth: int) -> list[str]:
        ld = ", ".join(a.tensor for a in n.loads)
        st = ", ".join(a.tensor for a in n.stores)
        head = f"{'  ' * depth}vector {n.var} < {n.width} load [{ld}] store [{st}]"
        if n.local:
            head += f" local [{', '.join(a.tensor for a in n.local)}]"
        pad = "  " * (depth + 1)
        moves = [f"{pad}load {x.lanes} = {x.target} x{n.width}" for x in n.lane_loads]
        moves += [f"{pad}store {x.target} x{n.width} = {x.lanes}" for x in n.lane_stores]
        moves += [f"{pad}pairs {p}" for p in n.native]  # native 16-bit pairs: the body is not run
        return [head] + moves + self.lines(n.body, depth + 1)

    def visit_KStmt(self, n: KStmt, depth: int) -> list[str]:
        guard = f" if {n.guard}" if n.guard is not None else ""
        pad = "  " * depth
        head = f"{pad}{n.stmt}({', '.join(map(str, n.args))}){guard}"
        if not n.stores:
            return [head]
        return [head + ":"] + [f"{pad}  store {s}" for s in n.stores]

    def visit_KAlloc(self, n: KAlloc, depth: int) -> list[str]:
        where = "static" if n.offset is None else f"dynamic+{n.offset}"
        where = f"pool {n.pool}+{n.offset}B" if n.pool else where
        lo = f" lo=({', '.join(map(str, n.lo))})" if n.lo else ""
        dims = "x".join(map(str, n.shape)) or "scalar"
        by = f" indexed by ({', '.join(n.index_vars)})" if n.index_vars else ""
        al = f" align {n.align}" if n.align else ""
        pad = "  " * depth
        return [f"{pad}alloc {n.space.value} {n.dtype} {n.name}[{dims}] {where}{lo}{by}{al}"]

    def visit_KBarrier(self, n: KBarrier, depth: int) -> list[str]:
        note = f"  // {n.note}" if n.note else ""
        return [f"{'  ' * depth}barrier {n.scope.value}{note}"]

    def visit_KAsyncCopy(self, n: KAsyncCopy, depth: int) -> list[str]:
        return [f"{'  ' * depth}async_copy[{n.group}] {_copy(n)}"]

    def visit_KCopy(self, n: KCopy, depth: int) -> list[str]:
        return [f"{'  ' * depth}copy {_copy(n)}"]

    def visit_KVectorStore(self, n: KVectorStore, depth: int) -> list[str]:
        guard = f" if {n.guard}" if n.guard is not None else ""
        idx = ", ".join(map(str, n.dst_index))
        return [f"{'  ' * depth}vector_store {n.dst}[{idx}]x{n.width} = {n.src}{guard}"]

    def visit_KCommit(self, n: KCommit, depth: int) -> list[str]:
        return [f"{'  ' * depth}commit"]

    def visit_KWait(self, n: KWait, depth: int) -> list[str]:
        return [f"{'  ' * depth}wait pending<={n.pending}"]

    def visit_KMma(self, n: KMma, depth: int) -> list[str]:
        return [f"{'  ' * depth}mma{n.shape} {n.acc} += {n.a} @ {n.b}  // {n.intrinsic}"]

    def visit_KLet(self, n: KLet, depth: int) -> list[str]:
        value = f" = {n.value}" if n.value is not None else ""
        return [f"{'  ' * depth}{'let' if n.const else 'var'} {n.ctype} {n.name}{value}"]

    def visit_KAssign(self, n: KAssign, depth: int) -> list[str]:
        return [f"{'  ' * depth}{n.target} {n.op} {n.value}"]

    def visit_KRegisters(self, n: KRegisters, depth: int) -> list[str]:
        dims = "x".join(map(str, n.shape))
        return [f"{'  ' * depth}alloc {n.scope} {n.ctype} {n.name}[{dims}]"]

    def visit_KLdmatrix(self, n: KLdmatrix, depth: int) -> list[str]:
        tr = ".trans" if n.trans else ""
        return [f"{'  ' * depth}ldmatrix.x{n.count}{tr} {n.dst} <- shared:{n.src}"]

    def visit_KFragmentLoad(self, n: KFragmentLoad, depth: int) -> list[str]:
        return [f"{'  ' * depth}fragment {n.dst} <- shared:{n.src} (32-bit)"]

    def visit_KChunkCopy(self, n: KChunkCopy, depth: int) -> list[str]:
        return [f"{'  ' * depth}cp.async16 shared:{n.dst} <- global:{n.src} ({n.src_bytes} B read)"]

    def visit_KGuardedCopy(self, n: KGuardedCopy, depth: int) -> list[str]:
        guard = f" if {n.guard} else 0" if n.guard is not None else ""
        return [f"{'  ' * depth}copy {n.dtype} shared:{n.dst} = global:{n.src}{guard}"]

    def visit_KScope(self, n: KScope, depth: int) -> list[str]:
        return [f"{'  ' * depth}scope  // {n.note}"] + self.lines(n.body, depth + 1)

    def visit_KSection(self, n: KSection, depth: int) -> list[str]:
        pad = "  " * (depth + 1)
        dims = ", ".join(f"{c} < {s}" for c, s in n.grid_dims)
        threads = ", ".join(f"{c} < {s}" for c, s in n.thread_dims)
        head = [f"{'  ' * depth}section block {n.block} -> ({dims}) threads ({threads})"]
        head += [
            f"{pad}grid {', '.join(f'{c} = {e}' for c, e in g.values())} (copies to {g.buffer})"
            for g in n.thread_grids
        ]
        return head + self.lines(n.allocs, depth + 1) + self.lines(n.body, depth + 1)

    def visit_KRowBlocks(self, n: KRowBlocks, depth: int) -> list[str]:
        head = (
            f"{'  ' * depth}row_blocks {ROW_BLOCK} x{n.repeat} of gemm grid {list(n.gemm_grid)} "
            f"rows grid {list(n.rows_grid)}"
        )
        return [head] + self.lines(n.body, depth + 1)


def format_nodes(nodes: Sequence[KNode], depth: int) -> list[str]:
    """The pseudo-code lines of ``nodes`` at indentation ``depth``."""
    return _Format().lines(nodes, depth)


def format_ir(ir: Any) -> str:
    """``print(ir)``: launch shape, parameters, copy grids, allocations, the access tables
    (shared tiles, fragments, staged stores), then the body (lane combines included)."""
    head = [
        f"kernel {ir.name} grid={ir.blocks} block={ir.threads} micrographs={list(ir.micrographs)}",
    ]
    if ir.reduction or ir.lane_params:
        head.append(f"  lanes ({', '.join(ir.lane_params)}) laneless {sorted(ir.laneless)}")
    if ir.dynamic_smem_bytes or ir.min_blocks:
        head.append(f"  dynamic_smem={ir.dynamic_smem_bytes} min_blocks={ir.min_blocks}")
    head += [f"  param {p.ctype} {p.name}" for p in ir.params]
    head += [
        f"  grid {', '.join(f'{c} = {e}' for c, e in g.values())} (copies to {g.buffer})"
        for g in ir.thread_grids
    ]
    head += format_nodes(ir.allocs, 1)
    for t in ir.tiles:
        extra = f" stage {t.stage}" if t.stage is not None else ""
        extra += f" merge {list(t.merge)}" if t.merge else ""
        extra += " select_free" if t.select_free else ""
        head.append(
            f"  tile {t.buffer}[i] = {t.tensor}[i + ({', '.join(map(str, t.lo))})] "
            f"for {sorted(t.stmts)}{extra}"
        )
    head += [
        f"  fragment {f.buffer}[{f.index}] = {f.tensor} for {sorted(f.stmts)}" for f in ir.fragments
    ]
    head += [
        f"  staged {st.tensor} -> {st.buffer}[{st.var}] for {sorted(st.stmts)}" for st in ir.staged
    ]
    return "\n".join(head + format_nodes(ir.body, 1))


def _copy(n: KCopy) -> str:
    vec = f"x{n.width}" if n.width > 1 else ""
    dst = f"{n.dst}[{', '.join(map(str, n.dst_index))}]{vec}"
    src = f"{n.src}[{', '.join(map(str, n.src_index))}]"
    if n.stream:
        src = f"{n.stream}[{n.stream_offset}] ({src})"
    return f"{dst} = {src}" + (f" if {n.guard} else {n.fill}" if n.guard is not None else "")
