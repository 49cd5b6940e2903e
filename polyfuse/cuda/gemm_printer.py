"""Statement bodies of GEMM-like kernels (:class:`polyfuse.poly.promote.GemmKernel`).

isl generates the loop AST from the tiled schedule map
(:func:`polyfuse.cuda.astgen.generate_gemm_ast`); the
lowering passes (:func:`polyfuse.cuda.lower.lower_gemm_kernel`) make its shared tiles, copies,
barriers and register micro-tile explicit in the kernel IR, and
:func:`polyfuse.cuda.printer.emit_kernel` prints it. :class:`GemmBodyPrinter` only reads the IR:
reads listed in a :class:`KTile` index the shared buffer, stores listed in a :class:`KStage`
go to their register run, reads listed in a :class:`KFragment` read its register array, register
arrays are indexed by their micro-tile loop variables.
"""

from __future__ import annotations

from polyfuse.cuda.body_printer import BodyPrinter
from polyfuse.cuda.c_text import c_index
from polyfuse.cuda.kernel_ast import KernelIR, MemSpace
from polyfuse.graph import expr as ex
from polyfuse.poly.model import Statement
from polyfuse.poly.placement import Placement


class GemmBodyPrinter(BodyPrinter):
    """Statement bodies of a lowered GEMM IR: tile reads and register arrays as the IR says."""

    def __init__(self, ir: KernelIR, placements: dict[str, Placement], idents: dict[int, str]):
        super().__init__(placements, idents, namer=ir.namer)
        shapes = {a.name: a.shape for a in ir.allocs}
        self.tiles = {t.tensor: t for t in ir.tiles}
        self.lo = {t.tensor: [c_index(lo) for lo in t.lo] for t in ir.tiles}
        self.strides: dict[str, list[int]] = {}
        for t in ir.tiles:
            dims, stride, acc = shapes[t.buffer], [], 1
            for d in reversed(dims):
                stride.append(acc)
                acc *= d
            self.strides[t.tensor] = stride[::-1]
        self.arrays = {
            a.name: "".join(f"[{v}]" for v in a.index_vars) or "[0]"
            for a in ir.allocs
            if a.space is MemSpace.REGISTER and a.shape
        }
        self.staged = {t.tensor: t for t in ir.staged}
        self.fragments = {f.tensor: f for f in ir.fragments}
        self.current = ""  # the statement being printed

    def statement(self, s: Statement, args: list[str], ident: str) -> str:
        self.current = s.name
        return super().statement(s, args, ident)

    def visit_Select(self, e: ex.Select, env: dict[int, str]) -> str:
        # a select-to-zero around a read of a select-free tile (isl proved the tile's zeros
        # are the select's): the bare read, so that the update is one fused multiply-add
        if isinstance(e.a, ex.Read) and isinstance(e.b, ex.Const) and float(e.b.value) == 0:
            t = self.tiles.get(self.idents[e.a.tensor.uid])
            if t is not None and t.select_free and self.current in t.stmts:
                return self.visit(e.a, env)
        return super().visit_Select(e, env)

    def tensor_ref(self, ident, shape, idx, store=False):
        st = self.staged.get(ident)
        if store and st is not None and self.current in st.stmts:
            return f"{st.buffer}[{st.var}]"
        reg = self.namer.register(ident)
        if reg in self.arrays:
            return f"{reg}{self.arrays[reg]}"
        f = self.fragments.get(ident)
        if f is not None and not store and self.current in f.stmts:
            return f"{f.buffer}[{c_index(f.index)}]"
        t = self.tiles.get(ident)
        if t is not None and not store and self.current in t.stmts:
            if t.merge:  # the tile views contiguous dims of the tensor as one
                idx = [
                    " + ".join(
                        f"{i} * {c}" if c != 1 else i for i, c in zip(idx, row, strict=True) if c
                    )
                    for row in t.merge
                ]
            strides = self.strides[ident]
            stage = []
            if t.stage is not None:  # a multi-stage buffer: the stage is its first dim
                stage = [f"{c_index(t.stage)} * {strides[0]}"]
                strides = strides[1:]
            terms = stage + [
                f"({i} - {lo})" + (f" * {st}" if st != 1 else "")
                for i, lo, st in zip(idx, self.lo[ident], strides, strict=True)
            ]
            return f"{t.buffer}[{' + '.join(terms)}]"
        return super().tensor_ref(ident, shape, idx, store)
