"""A small kernel AST of our own, between isl's AST and CUDA C text.

isl's AST (for/if/block/user nodes over isl expressions) is converted into these dataclasses so
the printer never touches isl. Lowering passes (``cuda/lower_*.py``) turn one :class:`KernelIR`
into a new one — allocations, barriers, combines, element types become explicit nodes — and the
CUDA printer only writes what the IR says. ``print(ir)`` shows the pseudo-code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from polyfuse.base.visitor import R, Visitor
from polyfuse.cuda.kernel_expr import KExpr, KInt, KOp, KVar, substitute  # noqa: F401 (re-export)
from polyfuse.cuda.kernel_function import KFunction
from polyfuse.cuda.namer import Namer
from polyfuse.stitch.facts import KernelFacts


class KNode:
    """A statement-level node (every one a frozen dataclass: passes build new nodes)."""


def _tuples(node: object, *names: str) -> None:
    """Freeze the child lists ``names`` of a frozen node as tuples (callers may pass lists)."""
    for name in names:
        value = getattr(node, name)
        if not isinstance(value, tuple):
            object.__setattr__(node, name, tuple(value))


@dataclass(frozen=True)
class KStream:
    """A pointer ``name = &array[start]`` declared before a loop and advanced by ``step``
    elements after each iteration: a global address strength-reduced over the loop."""

    name: str
    array: str
    start: KExpr
    step: int


@dataclass(frozen=True)
class KFor(KNode):
    """A loop; ``unroll``: printed with ``#pragma unroll`` (constant trip count, e.g. the
    register micro-tile, whose array then lives in registers; by ``unroll_by`` iterations
    at a time when > 1); ``streams``: its pointers."""

    var: str
    init: KExpr
    cond: KExpr
    step: int
    body: tuple[KNode, ...]
    unroll: bool = False
    streams: tuple[KStream, ...] = ()
    unroll_by: int = 0

    def __post_init__(self) -> None:
        _tuples(self, "body", "streams")


@dataclass(frozen=True)
class KIf(KNode):
    cond: KExpr
    then: tuple[KNode, ...]
    orelse: tuple[KNode, ...] = ()

    def __post_init__(self) -> None:
        _tuples(self, "then", "orelse")


@dataclass(frozen=True)
class KDef(KNode):
    """``const int var = value;`` (a degenerate loop)."""

    var: str
    value: KExpr
    body: tuple[KNode, ...]

    def __post_init__(self) -> None:
        _tuples(self, "body")


@dataclass(frozen=True)
class KMark(KNode):
    """An isl mark (``part:<micrograph>`` separates the parts of a stitched kernel)."""

    name: str
    body: tuple[KNode, ...]

    def __post_init__(self) -> None:
        _tuples(self, "body")


@dataclass(frozen=True)
class KLaneAccess:
    """One statement's access to ``tensor`` at lane 0 of a vector group (``args`` of the
    statement instance with the lane variable 0): where the group's float4 accesses start."""

    tensor: str
    stmt: str
    args: tuple[KExpr, ...]


@dataclass(frozen=True)
class KVector(KNode):
    """A loop ``for var in [0, width)`` whose global accesses to ``loads`` / ``stores`` are
    whole 128-bit groups: loaded into per-lane registers before the loop body, stored after.
    (isl proved contiguity and alignment; see :mod:`polyfuse.cuda.lower_vectorize`.)"""

    var: str
    width: int
    body: tuple[KNode, ...]
    loads: tuple[KLaneAccess, ...]
    stores: tuple[KLaneAccess, ...]
    #: reads inside the loop of a tensor the group stores: they read its lane registers
    local: tuple[KLaneAccess, ...] = ()

    def __post_init__(self) -> None:
        _tuples(self, "body", "loads", "stores", "local")


@dataclass(frozen=True)
class KStmt(KNode):
    """One instance of an isl statement; ``args`` are its domain coordinates. ``guard``: the
    instance runs only where it holds (a schedule over whole tiles guarded by the domain)."""

    stmt: str
    args: tuple[KExpr, ...]
    guard: KExpr | None = None

    def __post_init__(self) -> None:
        _tuples(self, "args")


@dataclass(frozen=True)
class KParam:
    name: str
    ctype: str  # "const float*" | "float*" | "int"
    tensor: str | None = None  # buffer name for pointers


class MemSpace(StrEnum):
    """Where a buffer lives."""

    GLOBAL = "global"
    SHARED = "shared"
    REGISTER = "register"


class Scope(StrEnum):
    """Which threads a barrier or a combine spans."""

    WARP = "warp"
    BLOCK = "block"


@dataclass(frozen=True)
class KAlloc(KNode):
    """A buffer declared in the kernel.

    ``offset`` (elements) places a shared buffer in the kernel's dynamic shared memory; None
    declares it statically. ``lo`` are the per-dimension lower bounds of a shared tile (the
    tile holds ``name[i - lo]``).
    """

    name: str
    space: MemSpace
    dtype: str
    shape: tuple[int, ...]
    offset: int | None = None
    lo: tuple[KExpr, ...] = ()
    #: a register array indexed by these loop variables (the micro-tile), whatever the
    #: statement's own indices
    index_vars: tuple[str, ...] = ()
    align: int = 0  # bytes a shared buffer is aligned to (0: its element's); vector access

    @property
    def elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class KTile:
    """Reads of ``tensor`` by the statements ``stmts`` are served by the shared ``buffer``:
    its element ``[i]`` holds ``tensor[i + lo]``, where ``lo`` may depend on loop variables
    (the k-tile) and block coordinates (a promoted GEMM operand)."""

    tensor: str
    buffer: str
    lo: tuple[KExpr, ...]
    stmts: frozenset[str]
    stage: KExpr | None = None  # multi-stage buffer: the stage these reads use (first dim)
    #: ``where(c, tensor[..], 0)`` in the readers prints as the read: isl proved that where c
    #: fails the read lands outside the array, which the tile holds as zeros
    select_free: bool = False
    #: the tile's dims over the tensor's: per tile dim, a coefficient per tensor dim (a view
    #: merging contiguous dims; empty: the tensor's own dims)
    merge: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True)
class KStage:
    """Stores of ``tensor`` by the statements ``stmts`` go to the register array ``buffer``
    at index ``var`` (one vector's elements); a :class:`KVectorStore` writes it out."""

    tensor: str
    buffer: str
    var: str
    stmts: frozenset[str]


@dataclass(frozen=True)
class KFragment:
    """Reads of ``tensor`` by the statements ``stmts`` are served by the register array
    ``buffer`` at ``index`` (over the micro-tile loop variables): an operand fragment loaded
    from its shared tile once per reduction step."""

    tensor: str
    buffer: str
    index: KExpr
    stmts: frozenset[str]


@dataclass(frozen=True)
class KVectorStore(KNode):
    """``dst[dst_index .. + width) = src[0 .. width)`` as one aligned vector store (``src`` a
    register array), where ``guard`` holds; ``dst_shape``: the global array's shape."""

    dst: str
    dst_index: tuple[KExpr, ...]
    dst_shape: tuple[int, ...]
    src: str
    width: int
    guard: KExpr | None = None


@dataclass(frozen=True)
class KThreadGrid:
    """The block's threads as a grid for the copies into ``buffer``: ``coords`` (name, extent),
    outermost first, row-major over ``threadIdx.x`` (the last one fastest; the extents'
    product is the block's threads, so the first needs no modulo)."""

    buffer: str
    coords: tuple[tuple[str, int], ...]

    def values(self) -> list[tuple[str, str]]:
        """Each coordinate's name and its C expression over ``threadIdx.x``."""
        out, inner = [], 1
        for i, (name, n) in reversed(list(enumerate(self.coords))):
            e = "threadIdx.x" + (f" / {inner}" if inner > 1 else "") + (f" % {n}" if i else "")
            out.append((name, e))
            inner *= n
        return out[::-1]


@dataclass(frozen=True)
class KBarrier(KNode):
    """All threads of ``scope`` wait here; ``note`` says which dependence it orders."""

    scope: Scope
    note: str = ""


@dataclass(frozen=True)
class KCombine:
    """The lanes of a parallel reduction combined at its final statement.

    ``form`` "y": lanes are consecutive threads (warp shuffles, then ``scratch`` across warps);
    "x": ``lanes`` thread rows of ``kept`` threads each, combined in ``scratch``.
    ``reductions`` are the primitives whose lanes hold partial results.
    """

    form: str
    lanes: int
    kept: int
    scope: Scope
    scratch: str
    reductions: frozenset[str]


@dataclass(frozen=True)
class KCopy(KNode):
    """``dst[dst_index] = src[src_index]`` (a promotion copy; ``fill`` outside ``guard``).

    ``src_shape``: the global array's shape (row-major) for its linear index; the destination's
    shape is its allocation's.
    """

    dst: str
    dst_index: tuple[KExpr, ...]
    src: str
    src_index: tuple[KExpr, ...]
    guard: KExpr | None = None
    fill: float = 0.0
    src_shape: tuple[int, ...] = ()
    width: int = 1  # consecutive elements moved at once (4: one 128-bit vector)
    #: the source read as ``stream[stream_offset]`` (a :class:`KStream` over ``src`` of an
    #: enclosing loop) instead of ``src[src_index]`` (which the guard still tests)
    stream: str = ""
    stream_offset: KExpr | None = None


@dataclass(frozen=True)
class KAsyncCopy(KCopy):
    """A :class:`KCopy` issued asynchronously (``cp.async``) into commit group ``group``."""

    group: int = 0


@dataclass(frozen=True)
class KCommit(KNode):
    """The asynchronous copies issued since the last commit form one group."""


@dataclass(frozen=True)
class KWait(KNode):
    """Wait until at most ``pending`` asynchronous copy groups are in flight."""

    pending: int = 0


@dataclass(frozen=True)
class KMma(KNode):
    """``acc += a @ b`` on an ``m x n x k`` tensor-core tile (fragments by buffer name)."""

    acc: str
    a: str
    b: str
    shape: tuple[int, int, int]


@dataclass(frozen=True)
class KernelIR:
    """One kernel between the schedule and the CUDA text; passes return new instances.

    ``grid_dims`` / ``thread_dims`` decompose ``blockIdx.x`` / ``threadIdx.x`` into named
    coordinates (slowest first). ``lane_params`` are the reduction lanes: statements in
    ``laneless`` store to global memory from lane 0 only.
    """

    name: str
    grid_dims: tuple[tuple[str, int], ...]
    thread_dims: tuple[tuple[str, int], ...]
    body: tuple[KNode, ...]
    micrographs: tuple[str, ...]
    params: tuple[KParam, ...] = ()
    allocs: tuple[KAlloc, ...] = ()
    combine: KCombine | None = None
    lane_params: tuple[str, ...] = ()
    laneless: frozenset[str] = frozenset()
    reduction: bool = False  # a stitched reduction kernel (parts marked ``part:<name>``)
    dynamic_smem_bytes: int = 0
    tiles: tuple[KTile, ...] = ()  # promoted reads (shared tiles of global operands)
    staged: tuple[KStage, ...] = ()  # stores staged in registers for vector stores
    thread_grids: tuple[KThreadGrid, ...] = ()  # copy distributions, by buffer
    fragments: tuple[KFragment, ...] = ()  # promoted reads served by register fragments
    #: names every identifier the passes and the printer declare (:mod:`polyfuse.cuda.namer`)
    namer: Namer = field(default_factory=Namer, compare=False, repr=False)
    min_blocks: int = 0  # launch bounds: blocks per SM ptxas must keep resident (0: none)

    @property
    def threads(self) -> int:
        n = 1
        for _, size in self.thread_dims:
            n *= size
        return n

    @property
    def blocks(self) -> int:
        n = 1
        for _, size in self.grid_dims:
            n *= size
        return n

    def with_(self, **changes) -> KernelIR:
        return replace(self, **changes)

    def __str__(self) -> str:
        head = [
            f"kernel {self.name} grid={self.blocks} block={self.threads} "
            f"micrographs={list(self.micrographs)}",
        ]
        head += [f"  param {p.ctype} {p.name}" for p in self.params]
        head += [
            f"  grid {', '.join(f'{c} = {e}' for c, e in g.values())} (copies to {g.buffer})"
            for g in self.thread_grids
        ]
        head += _fmt(list(self.allocs), 1)
        head += [
            f"  tile {t.buffer}[i] = {t.tensor}[i + ({', '.join(map(str, t.lo))})] "
            f"for {sorted(t.stmts)}"
            for t in self.tiles
        ]
        head += [
            f"  fragment {f.buffer}[{f.index}] = {f.tensor} for {sorted(f.stmts)}"
            for f in self.fragments
        ]
        if self.combine:
            c = self.combine
            head.append(
                f"  combine {c.form} lanes={c.lanes} kept={c.kept} {c.scope.value} "
                f"scratch={c.scratch} of {sorted(c.reductions)}"
            )
        return "\n".join(head + _fmt(list(self.body), 1))


@dataclass
class Kernel:
    """One ``__global__`` function with its launch shape and the facts lowering recorded
    (:class:`polyfuse.stitch.facts.KernelFacts`; None only for a kernel written by hand).
    ``registers``, ``static_shared_bytes`` and the spills are what the CUDA compiler
    reported, once it ran."""

    name: str
    params: list[KParam]
    body: list[KNode]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    micrographs: list[str]
    facts: KernelFacts | None = None
    source: str = ""
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    static_shared_bytes: int | None = None
    bytes_read: int = 0  # distinct global bytes (isl footprint)
    bytes_written: int = 0
    #: those bytes per global tensor: (read, written); they sum to bytes_read, bytes_written
    tensor_bytes: dict[str, tuple[int, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    vector_bytes: int = 0  # of those bytes, moved by 128-bit accesses (isl footprints)
    #: The ``__global__`` function that runs this kernel (shared by structurally identical
    #: kernels, see :mod:`polyfuse.cuda.dedup`); empty: the function is named ``name``.
    function: str = ""
    #: its printed function (None: a pack, whose body is a KDispatch, or written by hand) ...
    printed: KFunction | None = None
    canonical: KFunction | None = None  # ... with canonical names: cached, hashed by dedup

    @property
    def shared_bytes(self) -> int:
        """Shared memory one block uses: static ``__shared__`` arrays plus the dynamic pool."""
        return self.facts.shared_bytes if self.facts is not None else 0

    @property
    def dynamic_shared_bytes(self) -> int:
        """The dynamic shared memory its launch passes."""
        return self.facts.dynamic_shared_bytes if self.facts is not None else 0

    def __str__(self) -> str:
        head = (
            f"kernel {self.name} grid={self.grid} block={self.block} "
            f"smem={self.shared_bytes} micrographs={self.micrographs}"
        )
        return head + "\n" + "\n".join(_fmt(self.body, 1))

    def __repr__(self) -> str:
        """One line (:meth:`describe` has everything)."""
        mgs = ", ".join(self.micrographs[:3]) + (", ..." if len(self.micrographs) > 3 else "")
        regs = f", {self.registers} regs" if self.registers is not None else ""
        return (
            f"<Kernel {self.name}: grid {self.grid}, block {self.block}, "
            f"{self.shared_bytes} B shared{regs}, micrographs [{mgs}]>"
        )

    def describe(self) -> str:
        """Launch shape and resources, facts, notes, kernel IR, CUDA source."""
        facts = f"facts: {self.facts}" if self.facts is not None else ""
        parts = [repr(self), facts, *(f"note: {n}" for n in self.notes), str(self), self.source]
        return "\n".join(p for p in parts if p)


#: Every kernel-IR node class (statements and integer expressions), for visitor dispatch.
NODE_CLASSES: tuple[type, ...] = (
    KInt,
    KVar,
    KOp,
    KFor,
    KIf,
    KDef,
    KMark,
    KVector,
    KStmt,
    KAlloc,
    KVectorStore,
    KBarrier,
    KCopy,
    KAsyncCopy,
    KCommit,
    KWait,
    KMma,
)

#: Node class with child lists → constructor from (old node, child-list walk).
_REBUILD: dict[type, Callable[[Any, Callable[[list[KNode]], list[KNode]]], KNode]] = {
    KMark: lambda n, walk: KMark(n.name, walk(n.body)),
    KFor: lambda n, walk: replace(n, body=walk(n.body)),
    KIf: lambda n, walk: KIf(n.cond, walk(n.then), walk(n.orelse)),
    KDef: lambda n, walk: KDef(n.var, n.value, walk(n.body)),
    KVector: lambda n, walk: replace(n, body=tuple(walk(n.body))),
}


def map_children(n: KNode, walk: Callable[[list[KNode]], list[KNode]]) -> KNode:
    """A copy of ``n`` whose child lists went through ``walk`` (a node without children as is):
    the one place a pass's tree walk needs to know which nodes nest."""
    rebuild = _REBUILD.get(type(n))
    return n if rebuild is None else rebuild(n, walk)


class KVisitor(Visitor[R]):
    """Base of every walker of kernel IR: ``visit(n, *args)`` calls ``visit_<Node>(n, *args)``
    (:class:`polyfuse.base.visitor.Visitor` over :data:`NODE_CLASSES`; exact-class dispatch, so
    :class:`KAsyncCopy` needs its own rule apart from :class:`KCopy`)."""

    node_classes = NODE_CLASSES


class KMutator(KVisitor["KNode | list[KNode]"]):
    """A pass's tree rewrite: ``visit_<Node>`` returns a node or a list of nodes (several or
    none in its place); by default a node is rebuilt with its child lists rewritten
    (:func:`map_children`). :meth:`body` rewrites a list of nodes."""

    def visit_default(self, n: Any, *args: Any) -> KNode | list[KNode]:
        return map_children(n, lambda nodes: self.body(nodes, *args))

    def body(self, nodes: list[KNode] | tuple[KNode, ...], *args: Any) -> list[KNode]:
        out: list[KNode] = []
        for n in nodes:
            r = self.visit(n, *args)
            if isinstance(r, list):
                out += r
            else:
                out.append(r)
        return out


class _Format(KVisitor[list[str]]):
    """The pseudo-code lines of ``print(ir)``, one visit per node at indentation ``depth``."""

    def lines(self, nodes: list[KNode], depth: int) -> list[str]:
        return [line for n in nodes for line in self.visit(n, depth)]

    def visit_default(self, n: Any, depth: int) -> list[str]:
        # a node defined above this module (a Layer 3 dispatch) formats itself
        return n.format_lines(depth, self.lines) if hasattr(n, "format_lines") else []

    def visit_KFor(self, n: KFor, depth: int) -> list[str]:
        unroll = f"  // unrolled{f' by {n.unroll_by}' if n.unroll_by else ''}" if n.unroll else ""
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
        return [head] + self.lines(n.body, depth + 1)

    def visit_KStmt(self, n: KStmt, depth: int) -> list[str]:
        guard = f" if {n.guard}" if n.guard is not None else ""
        return [f"{'  ' * depth}{n.stmt}({', '.join(map(str, n.args))}){guard}"]

    def visit_KAlloc(self, n: KAlloc, depth: int) -> list[str]:
        where = "static" if n.offset is None else f"dynamic+{n.offset}"
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
        return [f"{'  ' * depth}mma{n.shape} {n.acc} += {n.a} @ {n.b}"]


def _fmt(nodes: list[KNode], depth: int) -> list[str]:
    return _Format().lines(nodes, depth)


def _copy(n: KCopy) -> str:
    vec = f"x{n.width}" if n.width > 1 else ""
    dst = f"{n.dst}[{', '.join(map(str, n.dst_index))}]{vec}"
    src = f"{n.src}[{', '.join(map(str, n.src_index))}]"
    if n.stream:
        src = f"{n.stream}[{n.stream_offset}] ({src})"
    return f"{dst} = {src}" + (f" if {n.guard} else {n.fill}" if n.guard is not None else "")
