"""Layer 2 feedback: elementwise ops that lead a reduction micrograph move into the GEMM before it
when the GEMM's epilogue saves more global bytes.

The partition's rule table merges elementwise/broadcast producers into a reduction (rule 4)
before an opaque micrograph (matmul, conv) takes elementwise consumers as its epilogue (rule
5). Where an elementwise chain sits between the two, e.g. a GEMM's bias and a residual add
before a layer norm, both merges are legal, and which one saves more traffic depends on what
the chain's output is also needed for — a fact of the kernels Layer 2 formed, not of the op
kinds. After stitching, for each opaque micrograph ``O`` whose output is read by the leading
elementwise part ``S`` of a reduction micrograph ``M`` (not row-stitched with ``O``,
:mod:`polyfuse.stitch.gemm_rows`), the global bytes of both choices are compared:

* **epilogue** (``S`` with ``O``): every tensor ``O`` hands to ``S`` is no longer read back
  (its size) nor, when nothing outside ``O`` and ``S`` reads it and it is no output,
  written (its size again);
* **reduction** (``S`` with ``M``, today's partition): every tensor ``S`` hands to the rest of
  ``M`` is not read back (its size) nor, when nothing outside ``M``'s kernel reads it and it is
  no output, written.

The epilogue is preferred only when it saves strictly more (a tie keeps the table's order).
A pre-LN transformer's residual add is the case: its sum is the residual stream, read again by
the next residual add, so it is written either way, and the layer norm joining it saves one
read where the GEMM's epilogue saves the GEMM output's round trip. A post-LN (BERT) add is a
tie: its sum is read by the layer norm only. The preference is handed back to the partition as
pairs of primitives kept apart (``S`` from the rest of ``M``), with the choice's reason (the
partition records it as a cost-model refusal); rule 5 then takes ``S`` into ``O``. Where the
partition cannot (a cycle, isl feedback), the driver keeps the first partition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from polyfuse.graph import dtypes
from polyfuse.graph.graph import Graph
from polyfuse.graph.kinds import OpKind
from polyfuse.graph.partition import Partition
from polyfuse.stitch.memory import KernelGroup


@dataclass(frozen=True)
class EpilogueChoice:
    """One leading elementwise part ``moved`` of the reduction micrograph whose last primitive
    is ``reduction`` that runs in the epilogue of the opaque micrograph holding primitive
    ``gemm`` instead, with the bytes each side saves."""

    gemm: str
    reduction: str
    moved: tuple[str, ...]
    rest: tuple[str, ...]
    epilogue_bytes: int
    reduction_bytes: int

    @property
    def reason(self) -> str:
        return (
            f"{', '.join(self.moved)} run in the epilogue of {self.gemm}: it saves "
            f"{self.epilogue_bytes} global bytes, joining the reduction {self.reduction} "
            f"{self.reduction_bytes} (Layer 2 feedback, stitch/epilogue.py)"
        )

    @property
    def pairs(self) -> set[frozenset[str]]:
        """The primitives the partition keeps apart for this choice."""
        return {frozenset((s, r)) for s in self.moved for r in self.rest}


def tensor_bytes(graph: Graph, prim: str) -> int:
    """Bytes of the tensor primitive ``prim`` produces."""
    t = graph.prims[prim].tensor
    return math.prod(t.shape) * dtypes.info(t.dtype).itemsize


def epilogue_choices(
    graph: Graph, part: Partition, groups: list[KernelGroup]
) -> list[EpilogueChoice]:
    """Every reduction micrograph's leading elementwise part that saves more global bytes in
    the epilogue of the opaque micrograph before it (module docstring)."""
    kernel_of = {
        p: i for i, g in enumerate(groups) for sm in g.parts for p in sm.model.micrograph.prims
    }
    owner = part.owner
    kinds = {m.id: m.kind for m in part.micrographs}
    members = {m.id: set(m.prims) for m in part.micrographs}
    rank = {p: i for i, p in enumerate(graph.topo_order())}
    out: list[EpilogueChoice] = []
    for m in part.micrographs:
        if m.kind != OpKind.REDUCTION:
            continue
        best: EpilogueChoice | None = None
        for s, gemm_mg in _leading_parts(graph, m.prims, owner, kinds):
            gemm_prims = members[gemm_mg]
            if any(kernel_of[p] == kernel_of[m.prims[-1]] for p in gemm_prims):
                continue  # row-stitched (rule 9): the GEMM output never reaches global memory
            if not _acyclic(graph, s, gemm_prims, rank):
                continue
            rest = [p for p in m.prims if p not in s]
            group = {p for p, k in kernel_of.items() if k == kernel_of[m.prims[-1]]}
            gain = _saved(graph, gemm_prims, s, gemm_prims | s)
            loss = _saved(graph, s, set(rest), group)
            if gain > loss and (
                best is None or gain - loss > best.epilogue_bytes - best.reduction_bytes
            ):
                moved = tuple(sorted(s, key=rank.__getitem__))
                gemm = min(gemm_prims, key=rank.__getitem__)
                best = EpilogueChoice(gemm, m.prims[-1], moved, tuple(rest), gain, loss)
        if best is not None:
            out.append(best)
    return out


def _leading_parts(
    graph: Graph, prims: list[str], owner: dict[str, int], kinds: dict[int, OpKind]
) -> list[tuple[set[str], int]]:
    """Per opaque micrograph that a reduction micrograph's non-reduction primitives read: the
    primitives that read its output and those of them they feed, when that part reads nothing
    else of the micrograph (it leaves as a whole)."""
    inside = set(prims)
    elementwise = {
        p for p in prims if graph.prims[p].kind in (OpKind.ELEMENTWISE, OpKind.BROADCAST)
    }
    sources = sorted(
        {
            owner[q]
            for p in elementwise
            for q in graph.dag.predecessors(p)
            if q not in inside and kinds[owner[q]] == OpKind.OPAQUE
        }
    )
    out = []
    for gemm in sources:
        seeds = [p for p in elementwise if any(owner[q] == gemm for q in graph.dag.predecessors(p))]
        part, stack = set(seeds), list(seeds)
        while stack:  # the elementwise primitives of the micrograph downstream of the seeds
            for c in graph.dag.successors(stack.pop()):
                if c in elementwise and c not in part:
                    part.add(c)
                    stack.append(c)
        if not any(q in inside and q not in part for p in part for q in graph.dag.predecessors(p)):
            out.append((part, gemm))
    return out


def _acyclic(graph: Graph, part: set[str], gemm: set[str], rank: dict[str, int]) -> bool:
    """Whether no input of ``part`` (outside it and the GEMM) depends on the GEMM: the part can
    join the GEMM's micrograph without a cycle. The search stays below each input's rank."""
    for p in part:
        for q in graph.dag.predecessors(p):
            if q in part or q in gemm:
                continue
            limit, seen = rank[q], set(gemm)
            stack = list(gemm)
            while stack:
                for y in graph.dag.successors(stack.pop()):
                    if y == q:
                        return False
                    if rank[y] < limit and y not in seen:
                        seen.add(y)
                        stack.append(y)
    return True


def _saved(graph: Graph, producers: set[str], consumers: set[str], together: set[str]) -> int:
    """Global bytes saved when ``producers`` and ``consumers`` share a kernel: each tensor
    between them is not read back, and not written when every reader of it is in ``together``
    and it is no graph output."""
    total = 0
    for p in producers:
        readers = set(graph.dag.successors(p))
        if not readers & consumers:
            continue
        size = tensor_bytes(graph, p)
        total += size
        if readers <= together and not graph.is_output(graph.prims[p].tensor):
            total += size
    return total
