"""Kernel descriptions for the cost model (:mod:`polyfuse.poly.costs`), from SASS or the IR.

Two sources for a kernel's per-thread instruction mix:

- :func:`describe_sass`: what the SASS instrument counted in the cubin
  (:class:`polyfuse.cuda.toolchain.sass.KernelSass`: every instruction slot along the costliest
  path,
  loops at their trip counts; memory instructions by width), with ptxas's registers, spills
  and shared bytes — used wherever a disassembler is installed;
- :func:`ir_work`: an estimate on the lowered kernel IR, recorded as a kernel fact
  (:attr:`polyfuse.stitch.facts.KernelFacts.work`, so the compile cache keeps it): loops at their
  constant trip counts (a bound that depends on the thread counts one trip, with a note),
  the costliest arm of each ``if``, and per statement instance the operations of its tensor
  expression as lowered (a select-to-zero around a read of a select-free tile is the bare
  read: a padded conv's update is one FFMA) — each read by where the tensor lives (global,
  shared tile, register fragment, register), each multiply feeding an add as one FFMA,
  special functions as MUFU plus the
  FP32 work NVIDIA's math library spends on them — plus the copies, barriers, vector accesses
  and combines the IR holds.

:func:`describe_kernel` picks SASS when given, else the IR estimate, and says which
(:attr:`polyfuse.poly.costs.KernelDesc.source`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

from polyfuse.cuda.codegen.kernel_ast import (
    KAssign,
    KAsyncCopy,
    KBarrier,
    KChunkCopy,
    KCombine,
    KCommit,
    KCopy,
    KDef,
    Kernel,
    KernelIR,
    KExpr,
    KFor,
    KFragmentLoad,
    KGuardedCopy,
    KIf,
    KInt,
    KLdmatrix,
    KLet,
    KMark,
    KMma,
    KNode,
    KOp,
    KRowBlocks,
    KScope,
    KSection,
    KStmt,
    KVar,
    KVector,
    KVectorStore,
    KVisitor,
    KWait,
    MemSpace,
    nodes_of,
)
from polyfuse.cuda.codegen.kernel_walk import map_children, variables
from polyfuse.graph import expr as ex
from polyfuse.graph.dtypes import info as dtype_info
from polyfuse.graph.dtypes import is_float
from polyfuse.poly.costs import KernelDesc, Mix, Modelled, Work, model_kernel
from polyfuse.poly.costs.ops import ADDRESS, ExprOps, count_ops, global_read
from polyfuse.poly.device import DeviceSpec
from polyfuse.poly.model import Statement
from polyfuse.poly.policy import ASSUMED_REGISTERS

__all__ = ["describe_kernel", "describe_kernels", "describe_sass", "ir_work", "kernel_modelled"]

WORD = 4  # bytes of a float32 element
CHUNK = 16  # bytes of one cp.async chunk
_LOOP = 3  # slots of one iteration of a loop that is not unrolled (add, compare, branch)
_UNROLL = 4  # iterations of such a loop whose loads the compiler keeps in flight together
#: slots (integer work counted once) up to which NVRTC unrolls a loop of constant trips whole,
#: unasked: LLVM's full-unroll threshold at -O3 (300 instructions); a depthwise conv's 3 x 3
#: taps are one straight block in its SASS (loops with barriers, async copies or mma keep
#: their per-iteration count: their fill phases are the model's)
AUTO_UNROLL_SLOTS = 300
ROUND16 = 2  # slots to round a float32 result to a 16-bit float and widen it back (F2FP, PRMT)


class _Walker(KVisitor[Mix]):
    """Walks a lowered kernel IR once (see :func:`ir_work`): each node's per-thread mix."""

    def __init__(
        self,
        ir: KernelIR,
        statements: dict[str, Statement],
        spaces: dict[str, str],  # tensor ident -> "global" | "shared" | "register"
        idents: dict[int, str],
        skip: frozenset[int] = frozenset(),  # ids of loops counted as no work
    ) -> None:
        self.ir, self.statements, self.spaces, self.idents = ir, statements, spaces, idents
        self.skip = skip
        self.notes: list[str] = []
        self.inflight = 0.0
        self.phases = 0.0  # iterations of the loop that fills shared tiles in sync
        # the loop being walked committed async copies, and then waited for all of them (a
        # single-stage fill; a pipelined loop waits before it issues the next k-tile's)
        self.committed = self.drained = False
        self.vector: frozenset[tuple[str, str]] = frozenset()  # (tensor, stmt) as vectors
        self.unrolled = 0  # fully unrolled loops around the node being walked
        self.buffers = {a.name: a.space for a in self.ir.allocs}
        self.tiled = {(t.tensor, s) for t in self.ir.tiles for s in t.stmts}
        self.combine: KCombine | None = None  # the combine the statements stand in
        self.fragment = {(f.tensor, s) for f in self.ir.fragments for s in f.stmts}
        # tiles whose zeros stand in for their readers' selects-to-zero (lowered as bare reads)
        self.tile_of = {t.tensor: t for t in self.ir.tiles}
        self.tile_by_read = {id(r): t.tensor for t in self.ir.tiles for r in t.reads}
        self.staged = {(t.tensor, s) for t in self.ir.staged for s in t.stmts}
        self.ctypes = {p.tensor: p.ctype for p in self.ir.params if p.tensor}

    def space(self, buffer: str) -> str:
        sp = self.buffers.get(buffer)
        if sp is None:
            return "global"
        return "shared" if sp is MemSpace.SHARED else "register"

    def body(self, nodes) -> Mix:
        total = Mix()
        for n in nodes:
            total = total + self.visit(n)
        return total

    def visit_default(self, n: Any) -> Mix:
        return Mix()  # allocations: no instructions

    def visit_KFor(self, n: KFor) -> Mix:
        if id(n) in self.skip:
            return Mix()
        trips, varying = _trips(n)
        if trips is None:
            trips = 1
            self.notes.append(f"loop {n.var}: bounds not affine, counted once")
        elif varying:
            self.notes.append(f"loop {n.var}: trips depend on the thread (counted at 0)")
        outer = self.drained, self.committed
        self.drained = self.committed = False
        whole = n.unroll and n.unroll_by <= 1 and not n.rolled
        self.unrolled += whole
        inner = self.body(n.body)
        self.unrolled -= whole
        drained = self.drained
        self.drained, self.committed = outer
        hoisted = Mix(slots=-inner.ints, ints=-inner.ints).scaled(trips - 1)
        unrolled = inner.scaled(trips) + hoisted
        if n.unroll_by > 1:  # a steady state unrolled by its stages: their fills in flight
            self.inflight = max(self.inflight, inner.global_read_bytes * min(trips, n.unroll_by))
        if n.unroll:  # integer work folds to constants or is hoisted: once for the nest
            reused = _reused_loads(n, self.buffers) if whole and not self.unrolled else Mix()
            return unrolled + reused.scaled(-1)
        plain = not (inner.bar or inner.ldgsts or inner.mma)  # no fill phases, no k-steps
        if plain and not n.rolled and not varying and unrolled.slots <= AUTO_UNROLL_SLOTS:
            # short enough for the compiler to unroll unasked (a filter's taps)
            self.inflight = max(self.inflight, unrolled.global_read_bytes)
            return unrolled
        inner = inner + Mix(slots=_LOOP, ints=_LOOP)
        # NVRTC unrolls a loop of constant trips by up to 4: its loads then overlap
        self.inflight = max(self.inflight, inner.global_read_bytes * min(trips, _UNROLL))
        if inner.bar and (inner.sts and inner.ldg and not inner.ldgsts or drained):
            self.phases = max(self.phases, float(trips))  # a synchronous tile fill
        return inner.scaled(trips)

    def visit_KIf(self, n: KIf) -> Mix:
        then, other = self.body(n.then), self.body(n.orelse)
        return Mix(slots=2) + (then if then.slots >= other.slots else other)

    def visit_KMark(self, n: KMark) -> Mix:
        return self.body(n.body)

    def visit_KCombine(self, n: KCombine) -> Mix:
        """The lanes' combine: counted with its final statement (shuffles, shared steps)."""
        outer, self.combine = self.combine, n
        m = self.body(n.body)
        self.combine = outer
        return m

    def visit_KDef(self, n: KDef) -> Mix:
        return self.body(n.body) + Mix(slots=1)

    def visit_KAsyncCopy(self, n: KAsyncCopy) -> Mix:
        return Mix(slots=1 + ADDRESS, ldgsts=n.width * WORD)

    def visit_KCopy(self, n: KCopy) -> Mix:
        src, dst = self.space(n.src), self.space(n.dst)
        b = n.width * WORD
        # one instruction per side in memory; global sides need their address computed
        # (a register fragment's shared address is a constant offset once unrolled)
        sides = (src != "register") + (dst != "register")
        glob = (src == "global") + (dst == "global")
        m = Mix(slots=sides + ADDRESS * glob + (2 if n.guard is not None else 0))
        return m + Mix(
            ldg=b if src == "global" else 0,
            lds=b if src == "shared" else 0,
            stg=b if dst == "global" else 0,
            sts=b if dst == "shared" else 0,
        )

    def visit_KVectorStore(self, n: KVectorStore) -> Mix:
        return Mix(slots=1 + ADDRESS, stg=n.width * WORD)

    def visit_KBarrier(self, n: KBarrier) -> Mix:
        return Mix(slots=1, bar=1)

    def visit_KCommit(self, n: KCommit) -> Mix:
        self.committed = True
        return Mix(slots=1)

    def visit_KWait(self, n: KWait) -> Mix:
        if n.pending == 0 and self.committed:  # the loop waits for the copies it just issued
            self.drained = True
        return Mix(slots=1)

    def visit_KMma(self, n: KMma) -> Mix:
        return Mix(slots=1, mma=1)

    # the tensor-core kernels' nodes (cuda/codegen/lower_mma.py) and the joined halves of a
    # GEMM + row-reduction kernel (cuda/codegen/lower_gemm_rows.py)
    def visit_KScope(self, n: KScope) -> Mix:
        return self.body(n.body)

    def visit_KSection(self, n: KSection) -> Mix:
        return self.body(n.body)

    def visit_KRowBlocks(self, n: KRowBlocks) -> Mix:
        return (self.body(n.body) + Mix(slots=_LOOP + 1, ints=_LOOP, bar=1)).scaled(n.repeat)

    def visit_KLet(self, n: KLet) -> Mix:
        return Mix(slots=1, ints=1) if n.value is not None else Mix()

    def visit_KAssign(self, n: KAssign) -> Mix:
        return Mix(slots=1)

    def visit_KLdmatrix(self, n: KLdmatrix) -> Mix:
        return Mix(slots=1, lds=n.count * WORD)  # count 32-bit registers per lane

    def visit_KFragmentLoad(self, n: KFragmentLoad) -> Mix:
        return Mix(slots=1, lds=WORD)

    def visit_KChunkCopy(self, n: KChunkCopy) -> Mix:
        return Mix(slots=1 + ADDRESS, ints=ADDRESS, ldgsts=CHUNK)

    def visit_KGuardedCopy(self, n: KGuardedCopy) -> Mix:
        size = dtype_info(n.dtype).itemsize
        return Mix(slots=4 + ADDRESS, ints=2 + ADDRESS, ldg=size, sts=size)

    def visit_KVector(self, n: KVector) -> Mix:
        """A group of ``width`` lanes whose listed accesses are single vector instructions."""
        outer = self.vector
        self.vector = outer | {(a.tensor, a.stmt) for a in (*n.loads, *n.stores)}
        lanes = self.body(n.body).scaled(n.width)
        self.vector = outer
        ldg = sum(n.width * self.itemsize(a.tensor) for a in n.loads)
        stg = sum(n.width * self.itemsize(a.tensor) for a in n.stores)
        loads = Mix(slots=len(n.loads) * (1 + ADDRESS), ldg=ldg)
        stores = Mix(slots=len(n.stores) * (1 + ADDRESS), stg=stg)
        self.inflight = max(self.inflight, loads.ldg)
        return lanes + loads + stores

    def visit_KStmt(self, n: KStmt) -> Mix:
        s = self.statements.get(n.stmt)
        if s is None:
            return Mix(slots=1)
        t = s.tensor
        assert t.op is not None
        ident = self.idents.get(t.uid, s.prim)
        c = ExprOps()
        red = t.op.reduce

        def on_read(r: ex.Read, c: ExprOps) -> None:
            key = (self.idents.get(r.tensor.uid, r.tensor.name), s.name)
            if key in self.fragment or key in self.vector:
                return
            space = "shared" if key in self.tiled else self.spaces.get(key[0], "global")
            if space == "shared":
                c.lds += WORD
                c.loads += 1
                c.ints += ADDRESS
            elif space == "global":
                global_read(r, c)

        if s.role == "compute":
            count_ops(self.select_free(t.op.body, s.name), c, on_read)
        elif s.role == "update" and red is not None:
            count_ops(self.select_free(red.body, s.name), c, on_read)
            if red.op == "sum":
                c.adds += 1
            elif red.op == "prod":
                c.muls += 1
            else:
                c.other += 1
        elif s.role == "final" and self.combine is not None and s.prim == self.combine.reduction:
            lanes = self.combine.lanes
            steps = max(1, lanes.bit_length() - 1)
            c.other += 2 * steps
            c.ints += steps
            if lanes > 32:  # across warps through shared memory and barriers
                c.lds += WORD
                c.loads += 2
        m = c.mix() + Mix(slots=2 if n.guard is not None else 0)
        if s.role in ("compute", "final"):
            m = m + self.store(ident, s.name)
            if is_float(t.dtype) and dtype_info(t.dtype).itemsize == 2:
                m = m + Mix(slots=ROUND16)  # rounded to the 16-bit type and widened back
        return m

    def select_free(self, e: ex.Expr, stmt: str) -> ex.Expr:
        """``e`` as statement ``stmt`` is lowered: ``where(c, x[..], 0)`` of a select-free
        tile of ``x`` is the bare read (:class:`KTile.select_free`; a padded convolution's
        update is one fused multiply-add, not its bounds test and a select)."""

        def bare(n: ex.Expr, kids: tuple[ex.Expr, ...]) -> ex.Expr | None:
            if not (
                isinstance(n, ex.Select)
                and isinstance(n.a, ex.Read)
                and isinstance(n.b, ex.Const)
                and float(n.b.value) == 0
            ):
                return None
            r = n.a
            key = self.tile_by_read.get(id(r)) or self.idents.get(r.tensor.uid, r.tensor.name)
            t = self.tile_of.get(key)
            return r if t is not None and t.select_free and stmt in t.stmts else None

        if not any(t.select_free for t in self.tile_of.values()):
            return e
        return ex.rewrite(e, bare)

    def itemsize(self, tensor: str) -> int:
        """Bytes per element of global buffer ``tensor`` (from its parameter's C type:
        ``__half``/``__nv_bfloat16``/``short`` are 2, ``double``/``long long`` 8, ``bool`` and
        ``char`` 1; the shared and register copies of 16-bit tensors hold float32)."""
        ctype = self.ctypes.get(tensor, "float")
        if "double" in ctype or "long long" in ctype:
            return 8
        if "bool" in ctype or "char" in ctype:
            return 1
        return 2 if any(t in ctype for t in ("__half", "__nv_bfloat16", "short")) else WORD

    def store(self, ident: str, stmt: str) -> Mix:
        if (ident, stmt) in self.vector or (ident, stmt) in self.staged:
            return Mix(slots=1)  # into the vector's register, written by the group
        space = self.spaces.get(ident, "global")
        if space == "global":
            return Mix(slots=1 + ADDRESS, stg=self.itemsize(ident))
        if space == "shared":
            return Mix(slots=1 + ADDRESS, sts=WORD)
        return Mix(slots=1)


class _Affine(KVisitor["dict[str, int] | None"]):
    """An index expression as {variable: coefficient, "": constant} when it is affine (a
    ``min``/``max``: its constant argument, else its first affine one — the bound a thread at
    index 0 meets); None otherwise."""

    def visit_default(self, e: Any) -> dict[str, int] | None:
        return None

    def visit_KInt(self, e: KInt) -> dict[str, int] | None:
        return {"": e.value}

    def visit_KVar(self, e: KVar) -> dict[str, int] | None:
        return {e.name: 1}

    def visit_KOp(self, e: KOp) -> dict[str, int] | None:
        args = [self.visit(a) for a in e.args]
        if e.op in ("min", "max"):
            consts = [a for a in args if a is not None and set(a) <= {""}]
            pick = consts or [a for a in args if a is not None]
            if not pick:
                return None
            key = min if e.op == "min" else max
            return key(pick, key=lambda a: a.get("", 0)) if consts else pick[0]
        if any(a is None for a in args) or len(args) != 2:
            return None
        x, y = args
        assert x is not None and y is not None
        if e.op in ("+", "-"):
            sign = 1 if e.op == "+" else -1
            out = dict(x)
            for k, v in y.items():
                out[k] = out.get(k, 0) + sign * v
            return out
        if e.op == "*":
            for c, v in ((x, y), (y, x)):
                if set(c) <= {""}:
                    return {k: c.get("", 0) * w for k, w in v.items()}
        return None


def _affine(e: KExpr) -> dict[str, int] | None:
    return _Affine().visit(e)


#: iterations of a fully unrolled nest enumerated to find its repeated shared loads (larger
#: nests are counted load by load)
REUSE_ITERATIONS = 4096


#: an unrolled loop of a nest: (variable, first value, step, trips)
_Loop = tuple[str, int, int, int]


def _unrolled(n: KFor) -> _Loop | None:
    """``n`` as a fully unrolled loop of constant bounds, or None."""
    if not n.unroll or n.unroll_by > 1 or n.rolled:
        return None
    trips, varying = _trips(n)
    init = _affine(n.init)
    if trips is None or varying or init is None or set(init) - {""}:
        return None
    return n.var, init.get("", 0), n.step, trips


class _NestLoads(KVisitor[None]):
    """The shared-memory loads into registers of a fully unrolled nest, each with the unrolled
    loops around it (loads in a loop kept rolled, or under an ``if``, are not collected), and
    whether anything in the nest may change a word it read (a shared store, an async copy, a
    barrier)."""

    def __init__(self, buffers: dict[str, MemSpace]) -> None:
        self.buffers = buffers
        self.loops: list[_Loop] = []
        self.loads: list[tuple[KCopy, list[_Loop]]] = []
        self.collect = True
        self.hazard = False

    def body(self, nodes: Sequence[KNode]) -> None:
        for m in nodes:
            self.visit(m)

    def visit_default(self, n: Any) -> None:
        map_children(n, self.walk)

    def walk(self, nodes: list[KNode]) -> list[KNode]:
        self.body(nodes)
        return nodes

    def visit_KFor(self, n: KFor) -> None:
        loop = _unrolled(n)
        outer = self.collect
        self.collect = outer and loop is not None
        self.loops += [loop] if loop is not None else []
        self.body(n.body)
        self.loops = self.loops[: len(self.loops) - (loop is not None)]
        self.collect = outer

    def visit_KIf(self, n: KIf) -> None:
        outer, self.collect = self.collect, False
        self.body(n.then)
        self.body(n.orelse)
        self.collect = outer

    def visit_KCopy(self, n: KCopy) -> None:
        if self.buffers.get(n.dst) is MemSpace.SHARED:
            self.hazard = True
        elif self.collect and self.buffers.get(n.src) is MemSpace.SHARED and n.guard is None:
            self.loads.append((n, list(self.loops)))

    def visit_KBarrier(self, n: KBarrier) -> None:
        self.hazard = True

    def visit_KAsyncCopy(self, n: KAsyncCopy) -> None:
        self.hazard = True

    def visit_KChunkCopy(self, n: KChunkCopy) -> None:
        self.hazard = True

    def visit_KGuardedCopy(self, n: KGuardedCopy) -> None:
        self.hazard = True


def _reused_loads(nest: KFor, buffers: dict[str, MemSpace]) -> Mix:
    """The shared-memory loads into registers of the fully unrolled ``nest`` that read an
    address an earlier iteration of the nest read: the compiler keeps that value in a register
    and issues no load (a convolution's input window: 3 x 3 filter taps over 2 x 4 outputs read
    24 distinct words of 72, as its SASS shows). None where the nest stores to shared memory,
    copies into it asynchronously or waits at a barrier; loads under a guard or an ``if``, or in
    a loop the nest keeps rolled, count whole."""
    walker = _NestLoads(buffers)
    walker.visit(nest)
    if walker.hazard:
        return Mix()
    seen: set[tuple[object, ...]] = set()
    saved = Mix()
    for copy, loops in walker.loads:
        form = _address(copy, {v for v, *_ in loops})
        count = math.prod(t for *_, t in loops)
        if form is None or count > REUSE_ITERATIONS:
            continue
        key, coefs = form
        ranges = [[lo + step * i for i in range(t)] for _, lo, step, t in loops]
        for point in itertools.product(*ranges):
            at = (key, sum(coefs.get(v, 0) * x for (v, *_), x in zip(loops, point, strict=True)))
            if at in seen:
                saved = saved + Mix(slots=1, lds=copy.width * WORD)
            seen.add(at)
    return saved


def _address(copy: KCopy, nest: set[str]) -> tuple[tuple[object, ...], dict[str, int]] | None:
    """``copy``'s source element as (the part the ``nest``'s variables leave unchanged, their
    coefficients in the linear address); None where a subscript depends on them non-affinely."""
    strides = [math.prod(copy.src_shape[i + 1 :]) for i in range(len(copy.src_shape))]
    if len(strides) != len(copy.src_index):
        return None
    coefs: dict[str, int] = {}
    rest: list[object] = [copy.src, copy.width]
    for dim, (e, stride) in enumerate(zip(copy.src_index, strides, strict=True)):
        a = _affine(e)
        if a is None:
            if variables(e) & nest:
                return None
            rest.append((dim, str(e)))  # the same at every iteration (a pipeline stage)
            continue
        for v, c in a.items():
            if v in nest:
                coefs[v] = coefs.get(v, 0) + c * stride
            else:
                rest.append((dim, v, c))
    return tuple(rest), coefs


def _trips(n: KFor) -> tuple[int | None, bool]:
    """Trip count of ``for (v = init; cond; v += step)`` when its bounds differ by a constant
    (after dropping what depends on the thread or block index: the count of a thread at 0),
    and whether it depends on such variables."""
    cond = n.cond
    if not isinstance(cond, KOp) or cond.op not in ("<=", "<") or len(cond.args) != 2:
        return None, False
    lo, hi = _affine(n.init), _affine(cond.args[1])
    if lo is None or hi is None or n.step <= 0:
        return None, False
    diff = {k: hi.get(k, 0) - lo.get(k, 0) for k in set(lo) | set(hi)}
    span = diff.pop("", 0)
    varying = any(diff.values())
    if cond.op == "<=":
        return max(0, span // n.step + 1), varying
    return max(0, -(-span // n.step)), varying


def ir_work(
    ir: KernelIR, statements: list[Statement], spaces: dict[str, str], idents: dict[int, str]
) -> Work:
    """The per-thread work of lowered kernel ``ir`` (see the module doc), with a tensor-core
    kernel's tail (what runs outside its k-step loops, :func:`mma_loops`). ``spaces``: where
    each tensor the kernel touches lives (``global``, ``shared`` or ``register``; a tensor not
    listed is global)."""
    by_name = {s.name: s for s in statements}
    w = _Walker(ir, by_name, spaces, idents)
    mix = w.body(list(ir.body)) + Mix(slots=8)  # block/thread index decomposition
    inflight = w.inflight or mix.global_read_bytes
    tail = None
    if mix.mma:  # no k-step loop (every k-step unrolled): the whole kernel is one phase
        skip = frozenset(id(n) for n in mma_loops(ir.body))
        tail = _Walker(ir, by_name, spaces, idents, skip).body(list(ir.body)) + Mix(slots=8)
    return Work(mix, inflight, tuple(dict.fromkeys(w.notes)), w.phases, tail)


def mma_loops(body: tuple[KNode, ...] | list[KNode]) -> list[KFor]:
    """The loops of ``body`` whose iterations are a tensor-core kernel's k-steps: the
    innermost loops (not unrolled whole: a steady state unrolled by its stages is one) that
    hold ``mma`` instructions. What a block does outside them (fills before, epilogue after;
    everything, where every k-step is unrolled) is its tail (:attr:`Work.tail`)."""

    def looped(n: KFor) -> bool:
        return (not n.unroll or n.unroll_by > 1) and bool(nodes_of(n.body, KMma))

    out: list[KFor] = []
    for n in nodes_of(body, KFor):
        if not looped(n):
            continue
        inner = [i for i in nodes_of(n.body, KFor) if looped(i)]
        if not inner:
            out.append(n)
    return out


# ------------------------------------------------------------------------ descriptions


def describe_sass(
    ks: Any,
    bytes_read: int,
    bytes_written: int,
    vector_bytes: int = 0,
    block_read_bytes: int | None = None,
    name: str | None = None,
    reread_bytes: int = 0,
) -> KernelDesc:
    """The cost model's description of one kernel the SASS instrument analysed (``ks``, a
    :class:`polyfuse.cuda.toolchain.sass.KernelSass` with its launch and ptxas resources), with the
    DRAM bytes isl counted for it."""
    r = ks.resources
    launch = ks.launch
    hot = ks.hot
    per_iter = hot.mix.cost_mix()
    sync = hot.kind == "k-tile" and per_iter.ldg > 0 and not per_iter.ldgsts and per_iter.bar
    phases = float(hot.iterations or 0) if sync else 0.0
    inflight = per_iter.global_read_bytes if hot.loop is not None else 0.0
    mix = ks.per_thread.cost_mix()
    return KernelDesc(
        name=name or ks.kernel,
        source=f"SASS {ks.arch}",
        blocks=launch.blocks,
        threads=launch.threads,
        registers=r.registers if r else ASSUMED_REGISTERS,
        shared_bytes=ks.shared_bytes,
        mix=mix,
        bytes_read=bytes_read,
        bytes_written=bytes_written,
        vector_bytes=vector_bytes,
        inflight_bytes=inflight or mix.global_read_bytes,
        block_read_bytes=block_read_bytes,
        reread_bytes=reread_bytes,
        barriers=mix.bar > 0,
        sync_phases=phases,
        spills=(r.spill_stores + r.spill_loads) if r else 0,
        notes=tuple(dict.fromkeys([*ks.notes, *hot.notes])),
        tail=_sass_tail(ks.loops, mix),
    )


def _sass_tail(loops: list[Any], mix: Mix) -> Mix | None:
    """What a thread runs outside the SASS loops whose iterations are k-steps (the innermost
    loops holding mma instructions, each at its trip count times its outer loops'): the
    kernel's tail (:attr:`KernelDesc.tail`; k-steps ptxas unrolled out of the loop stay in
    it, mma and all); None for a kernel without mma instructions."""
    if not mix.mma:
        return None
    costs = [lp.mix.cost_mix() for lp in loops]
    steps = [
        i for i, lp in enumerate(loops)
        if costs[i].mma and not any(costs[c].mma for c in lp.children)
    ]  # fmt: skip
    tail = mix  # no such loop (every k-step unrolled): the whole kernel
    for i in steps:
        trips, j = 1.0, i
        while j is not None:
            trips *= loops[j].trip.iterations or 1
            j = loops[j].parent
        tail = tail + costs[i].scaled(-trips)
    return tail if tail.slots >= 0 and tail.mma >= 0 else None


def describe_kernel(k: Kernel, sass: Any = None) -> KernelDesc:
    """The cost model's description of kernel ``k``: from its SASS analysis ``sass`` when
    given, else from the IR work estimate its facts carry (a kernel without one — written by
    hand — is described by its bytes alone, one 4-byte access per element, and says so)."""
    if sass is not None:
        return describe_sass(sass, k.bytes_read, k.bytes_written, k.vector_bytes,
                             k.block_read_bytes, name=k.name,
                             reread_bytes=k.reread_bytes)  # fmt: skip
    facts = k.facts
    blocks, threads = k.grid[0] * k.grid[1] * k.grid[2], k.block[0] * k.block[1] * k.block[2]
    regs = k.registers or (facts.registers if facts else None) or ASSUMED_REGISTERS
    work = facts.work if facts is not None else None
    notes: tuple[str, ...] = ()
    if work is None:
        per = max(1, blocks * threads)
        mix = Mix(slots=16 + 4 * (k.bytes_read + k.bytes_written) / per / WORD,
                  ldg=k.bytes_read / per, stg=k.bytes_written / per)  # fmt: skip
        work = Work(mix, mix.ldg, ("no IR work estimate: one 4-byte access per element",))
        source = "bytes estimate"
    else:
        source = "kernel IR estimate"
    notes = work.notes
    return KernelDesc(
        name=k.name,
        source=source,
        blocks=blocks,
        threads=threads,
        registers=regs,
        shared_bytes=k.shared_bytes,
        mix=work.mix,
        bytes_read=k.bytes_read,
        bytes_written=k.bytes_written,
        vector_bytes=k.vector_bytes,
        reread_bytes=k.reread_bytes,
        block_read_bytes=k.block_read_bytes,
        inflight_bytes=work.inflight_bytes,
        barriers=bool(facts and facts.barriers),
        sync_phases=work.sync_phases,
        spills=(k.spill_stores or 0) + (k.spill_loads or 0),
        parts=facts.parts if facts else 1,
        notes=notes,
        tail=work.tail,
    )


def describe_kernels(kernels: list[Kernel], source: str, arch: str) -> tuple[list[KernelDesc], str]:
    """The descriptions of a translation unit's ``kernels`` compiled for ``arch``: from their
    SASS where NVRTC and a disassembler are installed, else from their IR work estimates; and
    which of the two, in words (for printed reports)."""
    from polyfuse.base.errors import CompilerNotFound
    from polyfuse.cuda.toolchain.sass import analyse

    try:
        report = analyse(source, (arch,), kernels=kernels)
    except CompilerNotFound as e:  # DisassemblerNotFound is one
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        return [describe_kernel(k) for k in kernels], f"kernel IR estimate (no SASS: {first})"
    descs = [describe_kernel(k, ks) for k, ks in zip(kernels, report.kernels, strict=True)]
    return descs, f"SASS {arch} ({report.disassembler})"


def kernel_modelled(k: Kernel, device: DeviceSpec, sass: Any = None) -> Modelled:
    """The modelled time of kernel ``k`` on ``device`` (SASS mix when ``sass`` is given)."""
    return model_kernel(describe_kernel(k, sass), device)
