"""The typed data of decisions: one small frozen dataclass per decision family.

A :class:`polyfuse.base.decision.Decided` record holds one of these as ``data`` instead of an
untyped dict. Field names are the keys the plan's JSON (the visualizer, the compile cache)
has always used, so :meth:`DecisionData.as_dict` gives the same JSON as before, and
``data["key"]`` reads a field by that name (a read-only mapping view for programs that index);
a record equals its JSON dict.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar


@dataclass(frozen=True, eq=False)
class DecisionData:
    """Base of every decision family's data. ``OPTIONAL`` fields are left out of
    :meth:`as_dict` (and of the mapping view) while None: a family whose records carry a
    figure only sometimes."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset()

    def as_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict (nested records as dicts), in declaration order."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None and f.name in self.OPTIONAL:
                continue
            out[f.name] = v.as_dict() if isinstance(v, DecisionData) else v
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DecisionData:
        """The record a dict written by :meth:`as_dict` (or an older plain dict) holds."""
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise TypeError(f"{cls.__name__} has no field(s) {sorted(unknown)}")
        return cls(**d)

    def __eq__(self, other: object) -> bool:
        """Equal to a record of the same family with equal fields, or to its JSON dict."""
        if isinstance(other, dict):
            return self.as_dict() == other
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in fields(self))

    def __hash__(self) -> int:  # by value, through the JSON text (fields may be lists)
        return hash((type(self).__name__, repr(self.as_dict())))

    def keys(self) -> list[str]:
        return list(self.as_dict())

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __getitem__(self, key: str) -> Any:
        if key not in self.keys():
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default


@dataclass(frozen=True, eq=False)
class NoData(DecisionData):
    """A decision whose kinds, subject and reason say everything."""


NO_DATA = NoData()


@dataclass(frozen=True, eq=False)
class EdgeData(DecisionData):
    """A partition edge (graph/partition.py): the tensor it carries and the rule that fused."""

    tensor: str
    rule: int | None


@dataclass(frozen=True, eq=False)
class RowStitchData(DecisionData):
    """A GEMM + row-reduction stitch's cost-model figures (stitch/row_cost.py): both tiles
    (BM, BN, TM, TN, TK), their modelled times, bounds, blocks, waves and outputs per SM, and
    what keeping the intermediate on chip saves."""

    tile: list[int]
    rows_tile_us: float
    rows_bound: str
    rows_blocks: int
    rows_waves: float
    rows_sm_outputs: int
    best_tile: list[int]
    best_tile_us: float
    best_bound: str
    best_blocks: int
    best_waves: float
    best_sm_outputs: int
    extra_us: float
    saved_bytes: int
    dram_us: float
    launch_us: float
    saved_us: float
    gain_us: float
    shared_bytes: int | None = None  # the joined kernel's shared pool, when stitched
    #: True: both tiles are tensorized, (BM, BN, warps M, warps N, k-tile) (stitch/mma_rows.py)
    tensor_cores: bool | None = None

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"shared_bytes", "tensor_cores"})


@dataclass(frozen=True, eq=False)
class StitchData(DecisionData):
    """A Layer 2 stitch (stitch/memory.py, stitch/gemm_rows.py): its rule, the tensors it
    keeps on chip and, for a GEMM + row stitch, the cost model's figures."""

    rule: int | None
    tensors: list[str]
    figures: DecisionData = NO_DATA


@dataclass(frozen=True, eq=False)
class SmemData(DecisionData):
    """Shared memory of a refused pack (stitch/parallel.py): static and dynamic bytes."""

    static_bytes: int
    dynamic_bytes: int


@dataclass(frozen=True, eq=False)
class PackData(DecisionData):
    """A Layer 3 pack (stitch/parallel.py): the packed kernel, its modelled gain, the
    micrographs per part, and the figures of a refusal."""

    name: str | None
    gain_us: float | None
    micrographs: list[list[str]]
    figures: DecisionData = NO_DATA


@dataclass(frozen=True, eq=False)
class PlacementData(DecisionData):
    """A tensor's memory space in one kernel (poly/placement.py)."""

    kernel: str
    tensor: str
    space: str
    register_copy: bool
    smem_floats: int
    spill_why: str


@dataclass(frozen=True, eq=False)
class RecomputeData(DecisionData):
    """A tensor recomputed in its readers instead of spilled (stitch/recompute.py)."""

    tensor: str
    readers: list[str]


@dataclass(frozen=True, eq=False)
class ReductionLayoutData(DecisionData):
    """A reduction kernel's launch shape (poly/cost.py)."""

    form: str
    kept_tile: int
    lanes: int
    threads_per_block: int
    blocks: int
    reason: str


@dataclass(frozen=True, eq=False)
class GemmTileData(DecisionData):
    """A GEMM's tiles (poly/gemm_shape.py): block and micro tiles, k tile, launch, stages and
    the modelled time."""

    block_tile: list[int]
    micro_tile: list[int]
    k_tile: int
    threads_per_block: int
    blocks: int
    stages: int
    modelled_us: float | None


@dataclass(frozen=True, eq=False)
class GemmLoopData(DecisionData):
    """How a GEMM's loops are emitted (poly/gemm_loops.py, poly/gemm_codegen.py): ``what``
    (unroll, unroll by, keep loop, unroll copies, peel, strength reduction, launch bounds,
    select free, padding) and the figures that choice has; the others stay None."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset(
        {
            "loops", "steps", "factor", "fma", "tensor", "copies", "loop", "threads",
            "min_blocks", "register_cap", "waste", "explained",
        }
    )  # fmt: skip

    what: str
    loops: list[str] | None = None
    steps: int | None = None
    factor: int | None = None
    fma: int | None = None
    tensor: str | None = None
    copies: int | None = None
    loop: str | None = None
    threads: int | None = None
    min_blocks: int | None = None
    register_cap: int | None = None
    waste: float | None = None
    explained: bool | None = None


@dataclass(frozen=True, eq=False)
class SplitData(DecisionData):
    """A reduction split across blocks or not (poly/split.py): chunks (1: one stage) and the
    modelled times (one stage, split) when the model ran."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"modelled_us"})

    tensor: str
    form: str
    chunks: int
    modelled_us: Sequence[float] | None = None


@dataclass(frozen=True, eq=False)
class CoarsenData(DecisionData):
    """Elements per thread (poly/coarsen.py): the factor, the tensors with float4 accesses,
    why the others stay scalar, and whether a scalar tail remains."""

    factor: int
    vector: list[str]
    scalar: dict[str, str]
    tail: bool


@dataclass(frozen=True, eq=False)
class TensorCoreData(DecisionData):
    """A GEMM tensorized on warp-level MMA (poly/tensorize.py): the intrinsic, the block tile
    (M, N, K), the warp grid, the shared-memory stages, how the tiles are filled and laid out."""

    what: str
    intrinsic: str
    block: list[int]
    warps: list[int]
    stages: int = 1
    fill: str = "scalar"  # "cp.async 16 B" | "scalar"
    #: per operand (A, then B): "<tensor>: <its shared layout>" (swizzled or padded rows)
    layouts: list[str] = field(default_factory=list)
    #: per operand: bytes of its shared tile in one stage
    tile_bytes: list[int] = field(default_factory=list)
    #: register fragment buffers (2: double-buffered across the k-steps)
    fragment_buffers: int = 1
    #: the steady k-tile loop unrolled by its shared stages
    stage_unroll: bool = False


@dataclass(frozen=True, eq=False)
class FragmentData(DecisionData):
    """A GEMM operand held in a register fragment per ``kk`` step (poly/fragments.py): its
    elements per thread and the reads of it they serve."""

    tensor: str
    elements: int
    reads: int


@dataclass(frozen=True, eq=False)
class TileBoxData(DecisionData):
    """A promoted tile's box (poly/tile_box.py, a GEMM_LOOP decision: how its copies are
    emitted): the array, the box before and after (dims it covers whole merged into one;
    widened to start on a vector boundary)."""

    tensor: str
    what: str  # "merged dims" | "aligned"
    before: list[int]
    after: list[int]


#: the family a plain dict belongs to, by the first of its decision's kinds listed here
BY_KIND: dict[str, type[DecisionData]] = {
    "gemm tile": GemmTileData,
    "gemm loop": GemmLoopData,
    "reduction layout": ReductionLayoutData,
    "elements per thread": CoarsenData,
    "split reduction": SplitData,
}


#: every family by class name (the compile cache stores the name beside the fields)
DATA_TYPES: dict[str, type[DecisionData]] = {
    c.__name__: c
    for c in (
        NoData, EdgeData, RowStitchData, StitchData, SmemData, PackData, PlacementData,
        RecomputeData, ReductionLayoutData, GemmTileData, GemmLoopData, SplitData, CoarsenData,
        TensorCoreData, FragmentData, TileBoxData,
    )
}  # fmt: skip


def typed_data(kinds: Sequence[str], d: dict[str, Any], type_name: str = "") -> DecisionData:
    """The typed record for a decision of ``kinds`` whose data is the plain dict ``d``: of
    family ``type_name`` when given (the compile cache's JSON), else by the kinds (a plain
    dict written by hand or by an older cache entry; every stage builds its typed record
    itself). An empty dict is :data:`NO_DATA`; a dict no family claims raises TypeError."""
    if type_name:
        return DATA_TYPES[type_name].from_dict(d)
    if not d:
        return NO_DATA
    for k in kinds:
        if k in BY_KIND:
            return BY_KIND[k].from_dict(d)
    raise TypeError(f"no typed decision data for kinds {list(kinds)}: {sorted(d)}")
