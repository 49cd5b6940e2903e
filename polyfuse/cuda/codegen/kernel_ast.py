"""A small kernel AST of our own, between isl's AST and CUDA C text.

isl's AST (for/if/block/user nodes over isl expressions) is converted into the nodes of
:mod:`polyfuse.cuda.codegen.kernel_nodes` (re-exported here) so the printer never touches isl.
Lowering passes (``cuda/lower_*.py``) turn one :class:`KernelIR` into a new one — allocations,
barriers, combines, element types, loads and stores become explicit nodes — and the CUDA
printer only writes what the IR says. ``print(ir)`` shows the pseudo-code
(:mod:`polyfuse.cuda.codegen.kernel_format`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from polyfuse.cuda.codegen.kernel_expr import KExpr, KInt, KOp, KRef, KVar  # noqa: F401 (re-export)
from polyfuse.cuda.codegen.kernel_function import KFunction
from polyfuse.cuda.codegen.kernel_nodes import (  # noqa: F401 (re-export)
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
    KFragment,
    KFragmentLoad,
    KGuardedCopy,
    KIf,
    KLaneAccess,
    KLdmatrix,
    KLet,
    KMark,
    KMma,
    KNode,
    KParam,
    KRegisters,
    KRowBlocks,
    KScope,
    KSection,
    KStage,
    KStmt,
    KStream,
    KThreadGrid,
    KTile,
    KVector,
    KVectorStore,
    KWait,
    MemSpace,
    Scope,
)
from polyfuse.cuda.codegen.kernel_walk import (  # noqa: F401 (re-export)
    NODE_CLASSES,
    KMutator,
    KVisitor,
    combines,
    map_children,
    nodes_of,
    substitute,
)
from polyfuse.cuda.codegen.namer import Namer
from polyfuse.stitch.facts import KernelFacts


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
    lane_params: tuple[str, ...] = ()
    laneless: frozenset[str] = frozenset()
    reduction: bool = False  # a stitched reduction kernel (parts marked ``part:<name>``)
    dynamic_smem_bytes: int = 0
    tiles: tuple[KTile, ...] = ()  # promoted reads (shared tiles of global operands)
    staged: tuple[KStage, ...] = ()  # stores staged in registers for vector stores
    thread_grids: tuple[KThreadGrid, ...] = ()  # copy distributions, by buffer
    fragments: tuple[KFragment, ...] = ()  # promoted reads served by register fragments
    #: names every identifier the passes and the printer declare
    # (:mod:`polyfuse.cuda.codegen.namer`)
    namer: Namer = field(default_factory=Namer, compare=False, repr=False)
    min_blocks: int = 0  # launch bounds: blocks per SM ptxas must keep resident (0: none)

    @property
    def threads(self) -> int:
        n = 1
        for _, size in self.thread_dims:
            n *= size
        return n

    @property
    def combines(self) -> tuple[KCombine, ...]:
        """The lane combines standing in the body (:mod:`polyfuse.cuda.codegen.lower_combines`)."""
        return combines(self.body)

    @property
    def blocks(self) -> int:
        n = 1
        for _, size in self.grid_dims:
            n *= size
        return n

    def with_(self, **changes) -> KernelIR:
        return replace(self, **changes)

    def __str__(self) -> str:
        from polyfuse.cuda.codegen.kernel_format import format_ir

        return format_ir(self)


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
    #: global bytes later parts read again past the L1 (an input several stitched parts read,
    #: not staged: :attr:`polyfuse.poly.placement.Placement.reread`), beyond ``bytes_read``
    reread_bytes: int = 0
    #: distinct global bytes one (interior) block reads, where its threads share reads (isl:
    #: :func:`polyfuse.poly.footprint.block_read_bytes`); None: every thread's loads are its own
    #: (a GEMM's tile fills, a pack)
    block_read_bytes: int | None = None
    #: The ``__global__`` function that runs this kernel (shared by structurally identical
    #: kernels, see :mod:`polyfuse.cuda.codegen.dedup`); empty: the function is named ``name``.
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
        from polyfuse.cuda.codegen.kernel_format import format_nodes

        return head + "\n" + "\n".join(format_nodes(self.body, 1))

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
