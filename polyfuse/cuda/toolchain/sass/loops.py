"""Loops of a SASS function: natural loops, their nesting, trip counts and the hot loop.

Loops (the classic construction): a back edge is a CFG edge ``u → h`` whose head ``h``
dominates ``u``; its natural loop is ``h`` with every block that reaches ``u`` without passing
through ``h``. Back edges with the same head form one loop; a loop nests in the smallest loop
whose blocks contain its own.

Trip counts are read off each loop's counter (:mod:`.trips`); unknown ones say why.

Counts per iteration follow the costliest path through the loop body (:func:`path_mix`): the
body without its back edges, each nested loop collapsed into one node weighing its own
iteration times its trip count, is a DAG; the heaviest path from the header to a latch is
what one iteration issues when its branches are uniform (a warp runs one arm of an
``if``/``else``; the ``@!P0 BRA`` around a guarded prefetch is taken through when the body is
the heavier side). A diverging warp runs both arms: :attr:`Loop.static` counts every
instruction once, as an upper bound.

The hot loop (:func:`hot_loop`), by kernel shape:

* **GEMM-like** (a loop holds a barrier and floating-point work): the innermost loop that
  contains a ``BAR`` and FP work — the k-tile loop; when a loop without barriers with FP work
  is nested in it, that is reported beside it as the ``kk`` loop (fully unrolled kk: none);
* **memory-bound with loops**: the outermost loop with the most instructions per thread
  (trip counts applied, unknown ones as 1) — the grid-stride or main loop;
* **no loop**: the whole reachable body.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from polyfuse.cuda.toolchain.sass.mix import InstrMix, classify
from polyfuse.cuda.toolchain.sass.parse import SassFunction
from polyfuse.cuda.toolchain.sass.trips import TripCount, trip_count

__all__ = [
    "HmmaLoop",
    "HotLoop",
    "Loop",
    "TripCount",
    "body_mix",
    "dominators",
    "find_loops",
    "hmma_loop",
    "hot_loop",
    "loop_mix",
    "path_mix",
    "static_mix",
]

_FP = ("FFMA", "FMUL", "FADD", "HMMA")


@dataclass
class Loop:
    """One natural loop: ``header`` address, ``blocks`` (indices), ``latches`` (addresses of
    its back-edge branches), nesting (``parent``: index into the function's loop list,
    ``children``), ``depth`` (1: outermost)."""

    header: int
    blocks: frozenset[int]
    latches: tuple[int, ...]
    parent: int | None = None
    children: list[int] = field(default_factory=list)
    depth: int = 1
    trip: TripCount = TripCount(None, "not analysed")
    #: slots of one iteration along its costliest path, nested loops at their trip counts
    mix: InstrMix = field(default_factory=InstrMix)
    #: slots of one iteration if every instruction of the body ran (both arms of branches)
    static: InstrMix = field(default_factory=InstrMix)

    def __str__(self) -> str:
        return (
            f"loop @0x{self.header:04x} depth {self.depth}, {len(self.blocks)} blocks, "
            f"trip {self.trip}"
        )


def dominators(fn: SassFunction) -> dict[int, set[int]]:
    """Block index → the blocks that dominate it (reachable blocks only)."""
    blocks = [b for b in fn.blocks if b.reachable]
    if not blocks:
        return {}
    preds: dict[int, list[int]] = {b.index: [] for b in blocks}
    for b in blocks:
        for s in b.successors:
            if s in preds:
                preds[s].append(b.index)
    every = {b.index for b in blocks}
    dom = {i: set(every) for i in every}
    entry = blocks[0].index
    dom[entry] = {entry}
    changed = True
    while changed:
        changed = False
        for b in blocks[1:]:
            ps = [dom[p] for p in preds[b.index]]
            new = set.intersection(*ps) if ps else set()
            new = new | {b.index}
            if new != dom[b.index]:
                dom[b.index] = new
                changed = True
    return dom


def find_loops(fn: SassFunction) -> list[Loop]:
    """The natural loops of ``fn``, outermost first, with nesting and trip counts."""
    dom = dominators(fn)
    preds: dict[int, list[int]] = {i: [] for i in dom}
    for i in dom:
        for s in fn.blocks[i].successors:
            if s in preds:
                preds[s].append(i)
    by_head: dict[int, tuple[set[int], list[int]]] = {}
    for u in dom:
        for h in fn.blocks[u].successors:
            if h in dom and h in dom[u]:  # back edge u -> h
                body = {h, u}
                stack = [u] if u != h else []
                while stack:
                    for p in preds[stack.pop()]:
                        if p not in body:
                            body.add(p)
                            stack.append(p)
                blocks, latches = by_head.setdefault(h, (set(), []))
                blocks |= body
                latches.append(fn.blocks[u].end)
    loops = [
        Loop(fn.blocks[h].start, frozenset(b), tuple(sorted(lat)))
        for h, (b, lat) in by_head.items()
    ]
    loops.sort(key=lambda lp: (-len(lp.blocks), lp.header))
    for i, lp in enumerate(loops):
        outer = [j for j in range(i) if lp.blocks < loops[j].blocks]
        if outer:
            lp.parent = min(outer, key=lambda j: len(loops[j].blocks))
            loops[lp.parent].children.append(i)
    for lp in loops:
        lp.depth = 1 if lp.parent is None else loops[lp.parent].depth + 1
    for lp in loops:
        lp.trip = trip_count(fn, lp.header, lp.blocks, lp.latches, dom)
    for i, lp in enumerate(loops):
        lp.mix = loop_mix(fn, loops, i)
        lp.static = static_mix(fn, loops, i)
    return loops


@dataclass
class HotLoop:
    """The loop whose iterations dominate a kernel (see the module doc).

    ``kind``: ``"k-tile"``, ``"main"`` or ``"body"`` (no loop); ``mix``: the slots of one
    iteration along its costliest path (nested loops multiplied by their trip counts; one arm
    of each branch, :func:`path_mix`); ``iterations``: per thread (trip counts of it and of the
    loops around it; None when one is unknown); ``inner``: the kk loop nested in a k-tile
    loop, if any, with ``inner_mix`` one of its iterations."""

    kind: str
    loop: Loop | None
    mix: InstrMix
    iterations: int | None
    inner: Loop | None = None
    inner_mix: InstrMix | None = None
    notes: list[str] = field(default_factory=list)


def loop_mix(
    fn: SassFunction, loops: list[Loop], i: int, notes: list[str] | None = None
) -> InstrMix:
    """Slots of one iteration of ``loops[i]`` along its costliest path (:func:`path_mix`);
    nested loops at their trip counts (an unknown one counts once, with a note)."""
    lp = loops[i]
    head = fn.block_of(lp.header).index
    return path_mix(fn, loops, lp.blocks, lp.children, head, head, notes)


def static_mix(fn: SassFunction, loops: list[Loop], i: int) -> InstrMix:
    """Slots of one iteration of ``loops[i]`` if every instruction of its body ran once
    (both arms of every branch), nested loops at their trip counts (unknown: once)."""
    lp = loops[i]
    inner = set().union(*(loops[c].blocks for c in lp.children)) if lp.children else set()
    mix = InstrMix.of(ins for b in sorted(lp.blocks - inner) for ins in fn.blocks[b].instructions)
    for c in lp.children:
        mix = mix + static_mix(fn, loops, c).scaled(loops[c].trip.iterations or 1)
    return mix


def body_mix(fn: SassFunction, loops: list[Loop], notes: list[str] | None = None) -> InstrMix:
    """Slots one thread executes in ``fn`` along its costliest path from the entry to an exit,
    each outermost loop at its trip count (unknown: once, with a note)."""
    reachable = frozenset(b.index for b in fn.blocks if b.reachable)
    tops = [i for i, lp in enumerate(loops) if lp.parent is None]
    return path_mix(fn, loops, reachable, tops, 0, None, notes)


def path_mix(
    fn: SassFunction,
    loops: list[Loop],
    blocks: frozenset[int],
    children: list[int],
    source: int,
    header: int | None,
    notes: list[str] | None = None,
) -> InstrMix:
    """The slots along the costliest path through a region of ``fn``: its ``blocks``, with
    each loop of ``children`` one node (an iteration's costliest path times its trip count),
    from block ``source`` to a block that goes back to ``header`` (a loop's latch) or, for
    ``header`` None, to an exit. Both arms of a branch are not added up: a uniform branch
    runs one of them (a warp that diverges runs both; that is not modelled)."""
    owner: dict[int, tuple[str, int]] = {}
    for c in children:
        owner.update({b: ("loop", c) for b in loops[c].blocks})

    def node(b: int) -> tuple[str, int]:
        return owner.get(b, ("block", b))

    edges: dict[tuple[str, int], set[tuple[str, int]]] = {}
    ends: set[tuple[str, int]] = set()
    for b in blocks:
        nb = node(b)
        edges.setdefault(nb, set())
        succ = [t for t in fn.blocks[b].successors if t in blocks]
        if header is not None and header in fn.blocks[b].successors:
            ends.add(nb)  # a latch
        if header is None and not fn.blocks[b].successors:
            ends.add(nb)  # an exit
        for t in succ:
            if t != header and node(t) != nb:
                edges[nb].add(node(t))
    weight: dict[tuple[str, int], InstrMix] = {}

    def w(n: tuple[str, int]) -> InstrMix:
        if n not in weight:
            if n[0] == "block":
                weight[n] = InstrMix.of(fn.blocks[n[1]].instructions)
            else:
                lp = loops[n[1]]
                trips = lp.trip.iterations
                if trips is None:
                    trips = 1
                    if notes is not None:
                        notes.append(f"loop @0x{lp.header:04x}: trip count unknown, counted once")
                weight[n] = loop_mix(fn, loops, n[1], notes).scaled(trips)
        return weight[n]

    order = _topological(node(source), edges)
    if order is None:  # not reducible to a DAG: every instruction once
        if notes is not None:
            notes.append("irreducible control flow: every instruction counted once")
        return InstrMix.of(i for b in sorted(blocks) for i in fn.blocks[b].instructions)
    best: dict[tuple[str, int], tuple[float, tuple[str, int] | None]] = {}
    for n in order:
        here = best.get(n, (0.0, None))[0] + w(n).total
        best[n] = (here, best.get(n, (0.0, None))[1])
        for m in edges[n]:
            if m not in best or best[m][0] < here:
                best[m] = (here, n)
    # best[n][0] holds the path cost up to and including n only after n was visited
    done = {n: best[n] for n in order}
    ends &= set(order)
    last = max(ends or set(order), key=lambda n: done[n][0])
    mix = InstrMix()
    cur: tuple[str, int] | None = last
    while cur is not None:
        mix = mix + w(cur)
        cur = done[cur][1]
    return mix


def _topological(
    start: tuple[str, int], edges: dict[tuple[str, int], set[tuple[str, int]]]
) -> list[tuple[str, int]] | None:
    """The nodes reachable from ``start`` in topological order, or None on a cycle."""
    seen = {start}
    stack = [start]
    while stack:
        for m in edges[stack.pop()]:
            if m not in seen:
                seen.add(m)
                stack.append(m)
    indeg = dict.fromkeys(seen, 0)
    for n in seen:
        for m in edges[n]:
            indeg[m] += 1
    ready = [n for n in seen if indeg[n] == 0]
    order = []
    while ready:
        n = ready.pop()
        order.append(n)
        for m in edges[n]:
            indeg[m] -= 1
            if indeg[m] == 0:
                ready.append(m)
    return order if len(order) == len(seen) else None


def _has(fn: SassFunction, lp: Loop, pred) -> bool:
    return any(pred(ins) for b in lp.blocks for ins in fn.blocks[b].instructions)


def _fp_work(mix: InstrMix) -> float:
    return sum(mix[c] for c in _FP)


def hot_loop(fn: SassFunction, loops: list[Loop] | None = None) -> HotLoop:
    """The hot loop of ``fn`` and one iteration's instruction mix (see the module doc)."""
    loops = find_loops(fn) if loops is None else loops
    notes: list[str] = []
    if not loops:
        return HotLoop("body", None, body_mix(fn, loops, notes), 1, notes=notes)
    mixes = [lp.mix for lp in loops]
    barrier = [
        i
        for i, lp in enumerate(loops)
        if _has(fn, lp, lambda ins: classify(ins) == "BAR") and _fp_work(mixes[i]) > 0
    ]
    if barrier:
        depth = max(loops[i].depth for i in barrier)
        best = max(
            (i for i in barrier if loops[i].depth == depth), key=lambda i: _fp_work(mixes[i])
        )
        kind = "k-tile"
        inner = [
            i
            for i, lp in enumerate(loops)
            if lp.blocks < loops[best].blocks
            and not _has(fn, lp, lambda ins: classify(ins) == "BAR")
            and _fp_work(mixes[i]) > 0
        ]
    else:
        tops = [i for i, lp in enumerate(loops) if lp.parent is None]
        best = max(tops, key=lambda i: (mixes[i].total * (loops[i].trip.iterations or 1), -i))
        kind, inner = "main", []
    iterations: int | None = 1
    j: int | None = best
    while j is not None:
        n = loops[j].trip.iterations
        iterations = None if n is None or iterations is None else iterations * n
        j = loops[j].parent
    mix = loop_mix(fn, loops, best, notes)
    kk = max(inner, key=lambda i: (_fp_work(mixes[i]), -loops[i].depth)) if inner else None
    return HotLoop(
        kind,
        loops[best],
        mix,
        iterations,
        loops[kk] if kk is not None else None,
        mixes[kk] if kk is not None else None,
        notes,
    )


#: the warp-level tensor-core mma opcodes (16-bit and tf32; bytes)
TENSOR_MMA = ("HMMA", "IMMA")


@dataclass(frozen=True)
class HmmaLoop:
    """One iteration of a tensor-core kernel's k-tile loop, every instruction of its blocks
    counted once (issue 23's "HMMA per non-HMMA" figure): HMMA (and IMMA, the byte
    operands' mma), LDSM, LDGSTS and the rest (``other``: every other instruction, the LDSM
    and LDGSTS included); ``ktiles``: the k-tiles one iteration runs (its ``cp.async`` commit
    groups, one per k-tile: S where the steady state is unrolled by its stages; 1 without
    any)."""

    hmma: int
    ldsm: int
    ldgsts: int
    other: int
    ktiles: int = 1

    @property
    def per_hmma(self) -> float:
        """Non-HMMA instructions per HMMA."""
        return self.other / self.hmma

    def per_ktile(self) -> HmmaLoop:
        """The counts of one k-tile (``other`` rounded up where the iteration's k-tiles do not
        share it evenly)."""
        u = self.ktiles
        return HmmaLoop(self.hmma // u, self.ldsm // u, self.ldgsts // u, -(-self.other // u))


def hmma_loop(fn: SassFunction, loops: list[Loop] | None = None) -> HmmaLoop | None:
    """The first loop of ``fn`` in block order that holds HMMA (a tensor-core kernel's k-tile
    loop steady state: its prologue and guarded tail are outside it, or unrolled), or None."""
    loops = find_loops(fn) if loops is None else loops
    for lp in sorted(loops, key=lambda lp: min(lp.blocks)):
        ops = [i.opcode for b in lp.blocks for i in fn.blocks[b].instructions]
        hmma = sum(o.startswith(TENSOR_MMA) for o in ops)
        if hmma:
            ldsm = sum(o.startswith("LDSM") for o in ops)
            ldgsts = sum(o.startswith("LDGSTS") for o in ops)
            commits = sum(o.startswith("LDGDEPBAR") for o in ops)
            return HmmaLoop(hmma, ldsm, ldgsts, len(ops) - hmma, max(1, commits))
    return None
