"""The kernel IR's statement nodes (their walkers: :mod:`polyfuse.cuda.codegen.kernel_walk`).

Every node is a frozen dataclass whose child lists are tuples: a pass builds new nodes
(``dataclasses.replace`` or :func:`~polyfuse.cuda.codegen.kernel_walk.map_children`) and never
edits one in place.
:mod:`polyfuse.cuda.codegen.kernel_ast` adds the kernel (:class:`KernelIR`) and re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from polyfuse.cuda.codegen.kernel_access import KLane, KPairStore, KStore
from polyfuse.cuda.codegen.kernel_expr import KExpr, KRef


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
    at a time when > 1); ``rolled``: printed with ``#pragma unroll 1`` (kept rolled where
    unrolling would raise the register pressure); ``streams``: its pointers."""

    var: str
    init: KExpr
    cond: KExpr
    step: int
    body: tuple[KNode, ...]
    unroll: bool = False
    streams: tuple[KStream, ...] = ()
    unroll_by: int = 0
    rolled: bool = False

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
    (isl proved contiguity and alignment; see :mod:`polyfuse.cuda.codegen.lower_vectorize`.)"""

    var: str
    width: int
    body: tuple[KNode, ...]
    loads: tuple[KLaneAccess, ...]
    stores: tuple[KLaneAccess, ...]
    #: reads inside the loop of a tensor the group stores: they read its lane registers
    local: tuple[KLaneAccess, ...] = ()
    #: after :mod:`polyfuse.cuda.codegen.lower_accesses`: the whole-word loads (one per distinct
    #: element) and stores of the group
    lane_loads: tuple[KLane, ...] = ()
    lane_stores: tuple[KLane, ...] = ()
    #: after :mod:`polyfuse.cuda.codegen.lower_half2`: every stored lane array computed in
    #: native 16-bit pairs (the body is then not run; empty: lane by lane in float registers)
    native: tuple[KPairStore, ...] = ()

    def __post_init__(self) -> None:
        _tuples(self, "body", "loads", "stores", "local", "native")


@dataclass(frozen=True)
class KStmt(KNode):
    """One instance of an isl statement; ``args`` are its domain coordinates. ``guard``: the
    instance runs only where it holds (a schedule over whole tiles guarded by the domain)."""

    stmt: str
    args: tuple[KExpr, ...]
    guard: KExpr | None = None
    #: after :mod:`polyfuse.cuda.codegen.lower_accesses`: its stores (loads inside their values)
    stores: tuple[KStore, ...] = ()

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
    #: a shared buffer sliced from the static byte pool of this name at byte ``offset``
    #: (a GEMM + row-reduction kernel's halves, :mod:`polyfuse.cuda.codegen.lower_gemm_rows`)
    pool: str = ""

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
    #: the readers' read nodes (te ``Read``) this tile serves when the tensor is read
    #: through several accesses, each with its own tile (empty: all reads of ``tensor``);
    #: ``tensor`` is then the tile's key, not always the array's name
    reads: tuple[object, ...] = ()


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
class KCombine(KNode):
    """The lanes of a parallel reduction combine their partial results of ``reduction`` here,
    around ``body`` (the reduction's final statement, whose accumulator store becomes the
    total, a :class:`polyfuse.cuda.codegen.kernel_access.KAllReduce`). Every thread of the
    block reaches it (placed by :mod:`polyfuse.cuda.codegen.lower_combines`).

    ``form`` "y": lanes are consecutive threads (warp shuffles, then ``scratch`` across warps);
    "x": ``lanes`` thread rows of ``kept`` threads each, combined in ``scratch``; ``scope``:
    the threads a combine spans.
    """

    form: str
    lanes: int
    kept: int
    scope: Scope
    scratch: str
    reduction: str
    body: tuple[KNode, ...]

    def __post_init__(self) -> None:
        _tuples(self, "body")


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
    """The asynchronous copies issued since the last commit form one group (``note``: a
    comment saying which)."""

    note: str = ""


@dataclass(frozen=True)
class KWait(KNode):
    """Wait until at most ``pending`` asynchronous copy groups are in flight (``note``: a
    comment saying what has landed)."""

    pending: int = 0
    note: str = ""


@dataclass(frozen=True)
class KScope(KNode):
    """``body`` in a C scope of its own (its declarations stay apart from its siblings'),
    ``note`` saying what it runs."""

    note: str
    body: tuple[KNode, ...]

    def __post_init__(self) -> None:
        _tuples(self, "body")


@dataclass(frozen=True)
class KSection(KNode):
    """A lowered kernel run as a part of another kernel (a GEMM + row-reduction kernel's
    halves, :mod:`polyfuse.cuda.codegen.lower_gemm_rows`): its block coordinates
    ``grid_dims`` split from the linear block index ``block``, its thread coordinates
    ``thread_dims`` from the thread index, its allocations (shared ones slices of the
    enclosing kernel's pool) after their copy thread grids, then its ``body``."""

    block: KExpr
    grid_dims: tuple[tuple[str, int], ...]
    thread_dims: tuple[tuple[str, int], ...]
    allocs: tuple[KAlloc, ...]
    thread_grids: tuple[KThreadGrid, ...]
    body: tuple[KNode, ...]

    def __post_init__(self) -> None:
        _tuples(self, "grid_dims", "thread_dims", "allocs", "thread_grids", "body")


#: the linear index of the reduction block a :class:`KRowBlocks` body runs as
ROW_BLOCK = "pf_rb"


@dataclass(frozen=True)
class KRowBlocks(KNode):
    """``body`` run for each of the ``repeat`` reduction blocks one GEMM block covers, with
    :data:`ROW_BLOCK` the reduction block's linear index: the GEMM's block grid
    ``gemm_grid`` and the reduction's ``rows_grid`` (slowest first) correspond along their
    last (rows) coordinate, ``repeat`` reduction blocks per GEMM block
    (:func:`polyfuse.stitch.gemm_rows.block_correspondence`, checked by isl). The bounds are
    uniform per block, so the body's barriers stay convergent; a block barrier ends each
    iteration (the next rows reuse the reduction's shared arrays)."""

    gemm_grid: tuple[int, ...]
    rows_grid: tuple[int, ...]
    repeat: int
    body: tuple[KNode, ...]

    def __post_init__(self) -> None:
        _tuples(self, "gemm_grid", "rows_grid", "body")


@dataclass(frozen=True)
class KLet(KNode):
    """``[const] ctype name = value;``: a scalar or pointer the kernel declares (no value: a
    declaration only). The tensor-core lowering's index arithmetic is made of these
    (:mod:`polyfuse.cuda.codegen.lower_mma`)."""

    name: str
    value: KExpr | None
    ctype: str = "int"
    const: bool = True


@dataclass(frozen=True)
class KAssign(KNode):
    """``target = value;`` (``op`` "+=": ``target += value;``) on a declared scalar, pointer
    or register element."""

    target: KRef
    value: KExpr
    op: str = "="


@dataclass(frozen=True)
class KRegisters(KNode):
    """``ctype name[d0][d1]...;``: a thread's register array (mma operand fragments,
    accumulators) of ``scope`` (:class:`polyfuse.cuda.codegen.kernel_access.BufferScope`
    value: "fragment" for operand fragments, "local" for accumulators)."""

    name: str
    ctype: str
    shape: tuple[int, ...]
    scope: str = "local"
    note: str = ""  # printed as a comment


@dataclass(frozen=True)
class KLdmatrix(KNode):
    """``ldmatrix.sync.aligned.x{count}[.trans]``: ``count`` 8x8 16-bit matrices from the
    shared element ``src`` (the lane's row address) into fragment registers ``dst`` (a
    register array's row: ``count`` 32-bit registers)."""

    dst: KRef
    src: KRef
    count: int
    trans: bool = False


@dataclass(frozen=True)
class KFragmentLoad(KNode):
    """``dst = bits of src``: one 32-bit fragment register loaded from a shared float (a tf32
    operand stored k-outside, which ``ldmatrix`` cannot transpose)."""

    dst: KRef
    src: KRef


@dataclass(frozen=True)
class KMma(KNode):
    """``acc += a @ b`` on an ``m x n x k`` tensor-core tile by ``intrinsic`` (the prelude's
    ``mma.sync`` wrapper): the accumulator row ``acc`` (4 floats), A fragment ``a`` and the
    first B register ``b``."""

    intrinsic: str
    shape: tuple[int, int, int]
    acc: KRef
    a: KRef
    b: KRef


@dataclass(frozen=True)
class KChunkCopy(KNode):
    """``cp.async`` of one 16-byte chunk from global ``src`` to shared ``dst``: ``src_bytes``
    of it read, the rest zero-filled (0: nothing read; ``src`` must still be an address in
    the array). Committed by the next :class:`KCommit`."""

    dst: KRef
    src: KRef
    src_bytes: KExpr


@dataclass(frozen=True)
class KGuardedCopy(KNode):
    """``dst = guard ? src : 0`` of one ``dtype`` element, loaded under a predicate into the
    register ``temp`` first (so the load is predicated, not the store): a scalar shared-tile
    fill."""

    dst: KRef
    src: KRef
    guard: KExpr | None
    dtype: str
    temp: str
