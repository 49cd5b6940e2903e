"""Lowering pass: statement instances → explicit loads and stores on scoped buffers.

Each ``KStmt(S, args)`` gets its :class:`polyfuse.cuda.codegen.kernel_access.KStore` nodes: the
primitive's te expression with its loop variables bound to ``args``, every tensor read a
:class:`KLoad` and every write a store on the buffer that serves it — the vector group's lane
array, a staged register run, a register micro-tile array, an operand fragment, a shared tile
(multi-stage, merged views), a register scalar or copy, a shared placement or the global array,
in that order. 16-bit global elements are widened where read and rounded where stored; a
reduction's init/update/final become accumulator stores, the lane combine a call at its final
statement, stores of lane-less statements guarded to lane 0. Vector groups (``KVector``) get
their whole-word loads (one per distinct lane-0 element) and stores. The printer
(:mod:`polyfuse.cuda.codegen.body_printer`) then writes these nodes as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from polyfuse.cuda.codegen.c_wide import WORDS
from polyfuse.cuda.codegen.kernel_access import (
    BufferScope,
    KAddr,
    KAllReduce,
    KBinary,
    KBuffer,
    KCall,
    KCast,
    KCompare,
    KConst,
    KDataIndex,
    KIdentity,
    KIdx,
    KLane,
    KLoad,
    KLogical,
    KOffset,
    KReduce,
    KSelect,
    KStore,
    KTerm,
    KUnary,
    KVal,
)
from polyfuse.cuda.codegen.kernel_ast import (
    KCombine,
    KernelIR,
    KExpr,
    KInt,
    KMutator,
    KNode,
    KOp,
    KStmt,
    KVar,
    KVector,
    MemSpace,
)
from polyfuse.cuda.codegen.lower_dtypes import FLOAT_TO_HALF, HALF_TO_FLOAT
from polyfuse.cuda.codegen.namer import Namer
from polyfuse.graph import expr as ex
from polyfuse.graph.dtypes import NARROW_INTS, register_dtype
from polyfuse.poly.model import Statement


class Placed(Protocol):
    """Where a tensor lives, as the pass reads it (a poly placement or a buffer placement)."""

    space: Any  # "global" | "shared" | "register"
    register_copy: bool
    box: tuple[tuple[Any, int], ...]


def _strides(shape: Sequence[int]) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


def _linear(idx: Sequence[KVal], dims: Sequence[int], lo: Sequence[KVal] = ()) -> KOffset:
    """The row-major offset of ``idx`` (less ``lo`` per dim) in an array of shape ``dims``."""
    strides = _strides(dims)
    return KOffset(
        tuple(
            KTerm(i, lo[d] if lo else None, strides[d])
            for d, i in enumerate(idx[: len(dims)])
        )
    )


class Resolver:
    """Which buffer and index serve a tensor's element: the IR's tables (tiles, fragments,
    staged stores, register arrays), the current vector group's lanes, then the placements."""

    def __init__(self, ir: KernelIR, placements: Mapping[str, Placed]):
        self.namer = ir.namer
        self.placements = placements
        self.shapes = {a.name: a.shape for a in ir.allocs}
        self.arrays = {
            a.name: a
            for a in ir.allocs
            if a.space is MemSpace.REGISTER and a.shape
        }
        self.tiles = {t.tensor: t for t in ir.tiles}
        #: read nodes served by the tile of one of their tensor's several accesses
        self.by_read = {id(r): t.tensor for t in ir.tiles for r in t.reads}
        self.staged = {t.tensor: t for t in ir.staged}
        self.fragments = {f.tensor: f for f in ir.fragments}
        self.lanes: dict[str, KLoad] = {}  # inside a vector group: tensor -> its lane
        self.stmt = ""  # the statement being lowered

    def access(
        self, ident: str, dtype: str, shape: Sequence[int], idx: list[KVal], store: bool = False
    ) -> KLoad:
        """The element ``ident[idx]`` (of te ``dtype`` and ``shape``) read, or written where
        ``store``, by the current statement."""
        if ident in self.lanes:
            return replace(self.lanes[ident], dtype=dtype)
        held = register_dtype(dtype)
        st = self.staged.get(ident)
        if store and st is not None and self.stmt in st.stmts:
            return self.local(st.buffer, held, (KIdx(KVar(st.var)),), dtype)
        reg = self.namer.register(ident)
        if reg in self.arrays:
            a = self.arrays[reg]
            index = tuple(KIdx(KVar(v)) for v in a.index_vars) or (KIdx(KInt(0)),)
            return self.local(reg, held, index, dtype)
        f = self.fragments.get(ident)
        if f is not None and not store and self.stmt in f.stmts:
            buf = KBuffer(f.buffer, held, BufferScope.FRAGMENT, self.shapes.get(f.buffer, ()))
            return KLoad(buf, (KIdx(f.index),), dtype)
        t = self.tiles.get(ident)
        if t is not None and not store and self.stmt in t.stmts:
            return self._tile(t, held, idx, dtype)
        p = self.placements[ident]
        if p.space == "register" or (p.register_copy and not store):
            return self.local(reg, held, (), dtype)
        if p.space == "shared" or (p.stage and self.stmt != p.stage):
            return self.shared(ident, dtype, idx)
        buf = KBuffer(self.namer.tensor(ident), dtype, BufferScope.GLOBAL, tuple(shape))
        return KLoad(buf, (_linear(idx, shape),), dtype)

    def shared(self, ident: str, dtype: str, idx: list[KVal]) -> KLoad:
        """The element ``ident[idx]`` in its shared tile (a placement's box)."""
        p = self.placements[ident]
        name, dims = self.namer.shared(ident), [size for _, size in p.box]
        lo = [KIdx(KVar(Namer.lower_bound(name, d))) for d in range(len(dims))]
        buf = KBuffer(name, register_dtype(dtype), BufferScope.SHARED, tuple(dims))
        return KLoad(buf, (_linear(idx, dims, lo),), dtype)

    def staged_by(self, stmt: str) -> list[str]:
        """The inputs statement ``stmt`` stages in shared memory (:mod:`polyfuse.poly.stage`)."""
        return [t for t, p in self.placements.items() if getattr(p, "stage", "") == stmt]

    def local(self, name: str, held: str, index: tuple[KVal, ...], dtype: str) -> KLoad:
        """An element of the thread's register ``name`` (held as ``held``)."""
        buf = KBuffer(name, held, BufferScope.LOCAL, self.shapes.get(name, ()))
        return KLoad(buf, index, dtype)

    def _tile(self, t: Any, held: str, idx: list[KVal], dtype: str) -> KLoad:
        """A read served by a promoted shared tile (a merged view, a pipeline stage)."""
        if t.merge:  # the tile views contiguous dims of the tensor as one
            idx = [
                KOffset(tuple(KTerm(i, None, c) for i, c in zip(idx, row, strict=True) if c))
                for row in t.merge
            ]
        shape = self.shapes[t.buffer]
        strides = _strides(shape)
        terms = []
        if t.stage is not None:  # a multi-stage buffer: the stage is its first dim
            terms.append(KTerm(KIdx(t.stage), None, strides[0], scaled=True))
            strides = strides[1:]
        terms += [
            KTerm(i, KIdx(lo), st) for i, lo, st in zip(idx, t.lo, strides, strict=True)
        ]
        return KLoad(KBuffer(t.buffer, held, BufferScope.SHARED, shape), (KOffset(tuple(terms)),),
                     dtype)  # fmt: skip


def widened(load: KLoad) -> KVal:
    """A read as a float register value: a 16-bit global element is converted."""
    if load.buffer.scope is BufferScope.GLOBAL and load.dtype in HALF_TO_FLOAT:
        return KCall(HALF_TO_FLOAT[load.dtype], (load,), "float32")
    return load


def rounded(target: KLoad, value: KVal) -> KVal:
    """``value`` as stored at ``target``: rounded to nearest even into a 16-bit global."""
    if target.buffer.scope is BufferScope.GLOBAL and target.dtype in FLOAT_TO_HALF:
        return KCall(FLOAT_TO_HALF[target.dtype], (value,), target.dtype)
    return value


def _exact(body: ex.Expr, dtype: str) -> bool:
    """Whether a compute body's register value is already exactly a ``dtype`` value: a read
    of a tensor of that dtype or a conversion to it (or ``dtype`` is not 16-bit)."""
    if dtype not in FLOAT_TO_HALF:
        return True
    if isinstance(body, ex.Read):
        return body.tensor.dtype == dtype
    return isinstance(body, ex.Cast) and body.dtype == dtype


def narrowed(value: KVal, dtype: str) -> KVal:
    """A float register value held as exactly a ``dtype`` value: a 16-bit tensor's value is
    rounded to nearest even and widened back (what a register or shared copy of it holds)."""
    if dtype in FLOAT_TO_HALF:
        return KCall(HALF_TO_FLOAT[dtype], (KCall(FLOAT_TO_HALF[dtype], (value,), dtype),),
                     "float32")  # fmt: skip
    return value


class _Values(ex.ExprVisitor[KVal]):
    """te expression → value expression, reads resolved (``env``: loop variable uid →
    value)."""

    def __init__(self, r: Resolver, idents: Mapping[int, str]):
        self.r = r
        self.idents = idents

    def visit_IterVar(self, e: ex.IterVar, env: dict[int, KVal]) -> KVal:
        return env[e.uid]

    def visit_Const(self, e: ex.Const, env: dict[int, KVal]) -> KVal:
        return KConst(e.value, e.dtype)

    def visit_Read(self, e: ex.Read, env: dict[int, KVal]) -> KVal:
        idx = [self.visit(i, env) for i in e.indices]
        t = e.tensor
        ident = self.r.by_read.get(id(e)) or self.idents[t.uid]
        return widened(self.r.access(ident, t.dtype, t.shape, idx))

    def visit_Unary(self, e: ex.Unary, env: dict[int, KVal]) -> KVal:
        return KUnary(e.op, self.visit(e.a, env), e.dtype)

    def visit_Binary(self, e: ex.Binary, env: dict[int, KVal]) -> KVal:
        data = any(isinstance(n, ex.Read) for n in ex.walk(e.a))
        a, b = self.visit(e.a, env), self.visit(e.b, env)
        return KBinary(e.op, a, b, e.dtype, (e.a.dtype, e.b.dtype), data)

    def visit_Compare(self, e: ex.Compare, env: dict[int, KVal]) -> KVal:
        return KCompare(e.op, self.visit(e.a, env), self.visit(e.b, env))

    def visit_Logical(self, e: ex.Logical, env: dict[int, KVal]) -> KVal:
        return KLogical(e.op, self.visit(e.a, env), self.visit(e.b, env))

    def visit_Select(self, e: ex.Select, env: dict[int, KVal]) -> KVal:
        # a select-to-zero around a read of a select-free tile (isl proved the tile's zeros
        # are the select's): the bare read, so that the update is one fused multiply-add
        if isinstance(e.a, ex.Read) and isinstance(e.b, ex.Const) and float(e.b.value) == 0:
            t = self.r.tiles.get(self.r.by_read.get(id(e.a)) or self.idents[e.a.tensor.uid])
            if t is not None and t.select_free and self.r.stmt in t.stmts:
                return self.visit(e.a, env)
        cond, a, b = (self.visit(c, env) for c in e.children())
        return KSelect(cond, a, b, e.dtype, (e.a.dtype, e.b.dtype))

    def visit_Cast(self, e: ex.Cast, env: dict[int, KVal]) -> KVal:
        return KCast(self.visit(e.a, env), e.a.dtype, e.dtype)

    def visit_DataIndex(self, e: ex.DataIndex, env: dict[int, KVal]) -> KVal:
        return KDataIndex(self.visit(e.a, env))


def _env(s: Statement, args: Sequence[KExpr]) -> dict[int, KVal]:
    """The statement's loop variables: its domain's (data axes, then a reduction's reduced
    axes of extent > 1) bound to ``args``, the others at their lower bound."""
    t = s.tensor
    assert t.op is not None
    dims = [a for a in t.op.axes if a.extent > 1] + [a for a in t.op.reduce_axes if a.extent > 1]
    env: dict[int, KVal] = {a.uid: KIdx(KInt(a.lo)) for a in t.op.axes + t.op.reduce_axes}
    env.update({a.uid: KIdx(args[i]) for i, a in enumerate(dims) if i < len(args)})
    return env


class Accesses:
    """Lowers statement instances of one kernel (see the module docstring)."""

    def __init__(
        self,
        ir: KernelIR,
        statements: Sequence[Statement],
        placements: Mapping[str, Placed],
        idents: Mapping[int, str],
    ):
        self.r = Resolver(ir, placements)
        self.values = _Values(self.r, idents)
        self.stmts = {s.name: s for s in statements}
        self.idents = idents
        self.ir = ir
        #: lane arrays of a vector group that only its whole-word store to global memory
        #: reads: that store rounds each lane to the tensor's dtype, so the lanes hold the
        #: float value as is (a shared row's lanes hold it rounded, as its readers expect)
        self.rounded_by_store: set[str] = set()
        self.lane_guard: KExpr | None = None
        if ir.reduction and ir.lane_params:
            eqs = tuple(KOp("==", (KVar(p), KInt(0))) for p in ir.lane_params)
            self.lane_guard = eqs[0] if len(eqs) == 1 else KOp("&&", eqs)

    def scratch(self, c: KCombine) -> KBuffer:
        """The shared scratch buffer of combine ``c``."""
        a = next((a for a in self.ir.allocs if a.name == c.scratch), None)
        return KBuffer(
            c.scratch,
            a.dtype if a is not None and a.dtype else "float32",
            BufferScope.SHARED,
            a.shape if a is not None else (),
        )

    def statement(
        self, s: Statement, args: Sequence[KExpr], combine: KCombine | None = None
    ) -> tuple[KStore, ...]:
        """The stores of one instance of ``s`` at ``args`` (``combine``: the
        :class:`KCombine` it stands in, whose lanes its final store combines)."""
        self.r.stmt = s.name
        t, ident = s.tensor, s.prim
        assert t.op is not None
        env = _env(s, args)
        out_idx = [env[a.uid] for a in t.op.axes]
        out = self.r.access(ident, t.dtype, t.shape, out_idx, store=True)
        place = self.r.placements[ident]
        guard = self.lane_guard if s.name in self.ir.laneless and place.space == "global" else None

        def store(value: KVal, wide: bool = False) -> list[KStore]:
            """``wide``: ``value`` is a wider accumulator, which a register or shared copy of a
            16-bit tensor holds rounded to the tensor's dtype (a global store rounds)."""
            held = narrowed(value, t.dtype) if wide else value
            if place.register_copy:
                reg = self.r.local(self.r.namer.register(ident), register_dtype(t.dtype), (),
                                    t.dtype)  # fmt: skip
                return [
                    KStore(reg.buffer, (), held),
                    KStore(out.buffer, out.index, rounded(out, reg), guard),
                ]
            if out.buffer.scope is not BufferScope.GLOBAL:
                value = value if out.buffer.name in self.rounded_by_store else held
            return [KStore(out.buffer, out.index, rounded(out, value), guard)]

        staging = self.stage_stores(s, env)
        if s.role == "compute":  # a body computed in float registers is wider than 16 bits
            value = self.values.visit(t.op.body, env)
            return (*staging, *store(value, not _exact(t.op.body, t.dtype)))
        red = t.op.reduce
        assert red is not None
        acc = self.r.access(f"{ident}_acc", t.dtype, t.shape, out_idx)
        held = register_dtype(red.dtype)  # the accumulator's (check_codegen_dtypes)
        if s.role == "init":
            return (KStore(acc.buffer, acc.index, KIdentity(red.op, held)),)
        if s.role == "final":
            c = combine
            if c is not None and s.prim == c.reduction:
                buf = self.scratch(c)
                scratch = KAddr(buf, held if held != buf.dtype else "")
                combined = KAllReduce(c.form, c.lanes, c.kept, red.op, acc, scratch, held)
                return (KStore(acc.buffer, acc.index, combined), *store(acc, wide=True))
            return tuple(store(acc, wide=True))
        v = self.values.visit(red.body, env)
        return (*staging, KStore(acc.buffer, acc.index, KReduce(red.op, acc, v, held)))

    def stage_stores(self, s: Statement, env: dict[int, KVal]) -> list[KStore]:
        """The stores of the elements statement ``s`` stages into shared tiles (each element
        it reads of a staged input, as read: widened); a vector group's lanes are stored by
        the group (:meth:`vector`)."""
        out: list[KStore] = []
        if s.role not in ("compute", "update"):
            return out
        staged = set(self.r.staged_by(s.name)) - set(self.r.lanes)
        assert s.tensor.op is not None
        for read in s.tensor.op.reads():
            ident = self.idents.get(read.tensor.uid, "")
            if ident not in staged:
                continue
            idx = [self.values.visit(i, env) for i in read.indices]
            src = self.r.access(ident, read.tensor.dtype, read.tensor.shape, idx)
            dst = self.r.shared(ident, read.tensor.dtype, idx)
            st = KStore(dst.buffer, dst.index, widened(src))
            if st not in out:
                out.append(st)
        return out

    def lane_target(
        self, s: Statement, tensor: str, args: Sequence[KExpr], store: bool, tile: bool = False
    ) -> KLoad:
        """The element statement ``s`` touches in ``tensor`` at lane 0 of a vector group
        (``tile``: the element it reads, in the tensor's shared tile: a staged input's)."""
        self.r.stmt = s.name
        t = s.tensor
        assert t.op is not None
        env = _env(s, args)
        if store:
            return self.r.access(tensor, t.dtype, t.shape, [env[a.uid] for a in t.op.axes], True)
        read = next(r for r in t.op.reads() if self.idents[r.tensor.uid] == tensor)
        idx = [self.values.visit(i, env) for i in read.indices]
        if tile:
            return self.r.shared(tensor, read.tensor.dtype, idx)
        return self.r.access(tensor, read.tensor.dtype, read.tensor.shape, idx)

    def vector(self, n: KVector) -> tuple[KVector, dict[str, dict[str, KLoad]]]:
        """The group's whole-word loads (one per distinct lane-0 element) and stores, and the
        lanes each statement of its body reads and writes."""
        namer, var = self.r.namer, (KIdx(KVar(n.var)),)
        loads: list[KLane] = []
        staging: list[tuple[Any, KLane]] = []
        lanes: dict[str, dict[str, KLoad]] = {}
        streams: dict[str, int] = {}
        for a in n.loads:
            target = self.lane_target(self.stmts[a.stmt], a.tensor, a.args, store=False)
            lane = next((x for x in loads if x.target == target), None)
            if lane is None:
                k = streams.get(a.tensor, 0)
                streams[a.tensor] = k + 1
                dtype = target.buffer.dtype
                # float4s; 16-bit floats and the narrow integers: one
                words = 1 if dtype in NARROW_INTS else n.width // WORDS.get(dtype, ("", 4))[1]
                words = max(1, words)  # a pair of 2 lanes: one word
                buf = KBuffer(namer.vector(a.tensor, k), register_dtype(dtype),
                              BufferScope.LOCAL, (n.width,))  # fmt: skip
                lane = KLane(target, buf, tuple(namer.quad(a.tensor, k, j) for j in range(words)))
                loads.append(lane)
            lanes.setdefault(a.stmt, {})[a.tensor] = KLoad(lane.lanes, var)
            if a.tensor in self.r.staged_by(a.stmt):
                staging.append((a, lane))
        stores = []
        for a, lane in staging:  # the staged inputs' lanes, stored into their tiles
            if all(x.lanes != lane.lanes for x in stores):
                target = self.lane_target(self.stmts[a.stmt], a.tensor, a.args, False, tile=True)
                stores.append(KLane(target, lane.lanes))
        read_back = {a.tensor for a in n.local}
        self.rounded_by_store = set()  # this group's (its statements are lowered next)
        for a in n.stores:
            dtype = register_dtype(self.stmts[a.stmt].tensor.dtype)
            buf = KBuffer(namer.vector(a.tensor, 0), dtype, BufferScope.LOCAL, (n.width,))
            lanes.setdefault(a.stmt, {})[a.tensor] = KLoad(buf, var)
            target = self.lane_target(self.stmts[a.stmt], a.tensor, a.args, store=True)
            stores.append(KLane(target, buf))
            # a global word store rounds each lane; a shared row holds what the lanes hold
            if a.tensor not in read_back and target.buffer.scope is BufferScope.GLOBAL:
                self.rounded_by_store.add(buf.name)
        for a in n.local:
            dtype = register_dtype(self.stmts[a.stmt].tensor.dtype)
            buf = KBuffer(namer.vector(a.tensor, 0), dtype, BufferScope.LOCAL, (n.width,))
            lanes.setdefault(a.stmt, {})[a.tensor] = KLoad(buf, var)
        return replace(n, lane_loads=tuple(loads), lane_stores=tuple(stores)), lanes


class _Lower(KMutator):
    def __init__(self, acc: Accesses):
        self.acc = acc
        self.lanes: dict[str, dict[str, KLoad]] = {}
        self.combine: KCombine | None = None  # the combine the statements stand in

    def visit_KCombine(self, n: KCombine) -> KNode:
        self.combine = n
        body = self.body(n.body)
        self.combine = None
        return replace(n, body=tuple(body))

    def visit_KStmt(self, n: KStmt) -> KNode:
        self.acc.r.lanes = self.lanes.get(n.stmt, {})
        stores = self.acc.statement(self.acc.stmts[n.stmt], n.args, self.combine)
        self.acc.r.lanes = {}
        return replace(n, stores=stores)

    def visit_KVector(self, n: KVector) -> KNode:
        n, self.lanes = self.acc.vector(n)
        body = self.body(n.body)
        self.lanes = {}
        return replace(n, body=tuple(body))


def lower_accesses(
    ir: KernelIR,
    statements: Sequence[Statement],
    placements: Mapping[str, Placed],
    idents: Mapping[int, str],
) -> KernelIR:
    """A new IR whose statement instances and vector groups hold their loads and stores."""
    walk = _Lower(Accesses(ir, statements, placements, idents))
    return ir.with_(body=tuple(walk.body(ir.body)))
