"""The GEMM path's shape and tiling records, shared by the ranking and the passes.

:class:`GemmShape` is what :func:`polyfuse.poly.tiling.detect_gemm` finds in a micrograph's isl
model; :class:`GemmTiling` is a tiling of it (block, threads, k-tile, with the reasons and the
loop code the cost model priced). They live apart from :mod:`polyfuse.poly.tiling` so that
the modules the ranking uses (:mod:`polyfuse.poly.tile_fit`, which folds each candidate as the
kernel will be built) can name them without importing the ranking back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import islpy as isl

from polyfuse.base.decision import Decided, DecisionKind
from polyfuse.base.decision_data import GemmTileData
from polyfuse.graph.expr import Read
from polyfuse.poly.costs import KernelDesc
from polyfuse.poly.costs.gemm_code import LoopCode
from polyfuse.poly.model import Statement


def tile_label(bm: int, bn: int, tm: int, tn: int, kt: int) -> str:
    """A GEMM tiling (BM, BN, TM, TN, TK) in words."""
    return (
        f"block tile {bm}x{bn}, {bm // tm}x{bn // tn} threads, register micro-tile {tm}x{tn} "
        f"({tm * tn} accumulators), k-tile {kt}"
    )


@dataclass
class GemmShape:
    """What :func:`detect_gemm` found in a micrograph's isl model."""

    init: Statement
    update: Statement
    epilogue: list[Statement]  # final + elementwise consumers, in micrograph order
    data: list[tuple[int, int]]  # [lo, hi] per data dimension of the update
    red: list[tuple[int, int]]  # [lo, hi] per reduction dimension
    operands: list[tuple[str, isl.Map]]  # (tensor, access of the update) read from inputs
    reuse: list[set[int]]  # per operand: data dims it does not depend on


@dataclass
class GemmTiling:
    """Tile sizes per data dim (block, threads) and per reduction dim, with reasons."""

    block: list[int]
    threads: list[int]
    tk: list[int]
    reasons: list[str] = field(default_factory=list)
    modelled_us: float = 0.0
    #: (BM, BN, TM, TN, TK): the candidate in the form ``MappingConfig.gemm_tile`` takes
    choice: tuple[int, int, int, int, int] | None = None
    #: the loop code the ranking priced (before the kernel exists) and its description
    code: LoopCode | None = None
    estimate: KernelDesc | None = None

    @property
    def label(self) -> str:
        """The tile sizes in words (``block tile 64x64, 16x16 threads, ...``), from
        :attr:`choice`: what reasons and rejections name the tiling by."""
        assert self.choice is not None
        return tile_label(*self.choice)

    def decision(self, blocks: int, stages: int) -> Decided:
        """This tiling as a typed record for a kernel of ``blocks`` blocks whose shared tiles
        have ``stages`` stages; its reason is :attr:`label`."""
        assert self.choice is not None
        bm, bn, tm, tn, kt = self.choice
        data = GemmTileData(
            block_tile=[bm, bn],
            micro_tile=[tm, tn],
            k_tile=kt,
            threads_per_block=(bm // tm) * (bn // tn),
            blocks=blocks,
            stages=stages,
            modelled_us=self.modelled_us,
        )
        return Decided((DecisionKind.COST_MODEL, DecisionKind.GEMM_TILE), self.label, data)

    @property
    def regs(self) -> list[int]:
        return [b // t for b, t in zip(self.block, self.threads, strict=True)]

    @property
    def nthreads(self) -> int:
        return math.prod(self.threads)

    @property
    def accumulators(self) -> int:
        return math.prod(self.regs)


def access_function(acc: isl.Map) -> isl.Map:
    """The read's subscripts without the domain's bounds, valid on the padded tiles.

    Its affine hull when that is a function (affine subscripts; conv's padding guard is
    dropped, so out-of-array elements are copied as zeros); otherwise (grouped conv's channel,
    a floor division) the access gisted by its own domain.
    """
    hull = isl.Map.from_basic_map(acc.affine_hull())
    return hull if hull.is_single_valued() else acc.gist_domain(acc.domain())


@dataclass(frozen=True)
class AccessGroup:
    """The update's reads of one tensor through one access function: one promotion.

    A tensor read through two different relations (``q @ k^T`` of a merged ``qkv``: operand
    A and operand B of the same array) is two groups, each with its own footprint box and
    shared tile; the first is keyed by the tensor's name, the others ``<tensor>__<n>``.
    ``reads`` holds the update's read nodes a multi-access group serves (empty when the
    tensor has one access: every read of it is the group's)."""

    tensor: str
    key: str
    access: isl.Map
    reads: tuple[Read, ...]
    reuse: set[int]


def access_groups(shape: GemmShape) -> list[AccessGroup]:
    """The update's operands grouped by (tensor, access function), in read order; isl
    decides which accesses are equal."""
    nodes = [r for r, _ in shape.update.reads if r is not None]
    groups: list[tuple[str, isl.Map, list[Read], set[int]]] = []
    for node, (name, acc), reuse in zip(nodes, shape.operands, shape.reuse, strict=True):
        fn = access_function(acc)
        same = next((g for g in groups if g[0] == name and g[1].is_equal(fn)), None)
        if same is None:
            groups.append((name, fn, [node], set(reuse)))
        else:
            same[2].append(node)
    out, seen = [], {}
    for name, fn, reads, reuse in groups:
        n = seen[name] = seen.get(name, -1) + 1
        several = sum(1 for g in groups if g[0] == name) > 1
        key = name if n == 0 else f"{name}__{n}"
        out.append(AccessGroup(name, key, fn, tuple(reads) if several else (), reuse))
    return out


def operand_keys(shape: GemmShape) -> list[str]:
    """Per operand of ``shape`` (in order), the key of its access group (its tile's name)."""
    nodes = [r for r, _ in shape.update.reads if r is not None]
    keys = []
    groups = access_groups(shape)
    for node, (name, _) in zip(nodes, shape.operands, strict=True):
        mine = [g for g in groups if g.tensor == name]
        keys.append(next((g.key for g in mine if node in g.reads), mine[0].key))
    return keys
