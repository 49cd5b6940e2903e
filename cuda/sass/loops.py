"""Loops of a SASS function: natural loops, their nesting, trip counts and the hot loop.

Loops (the classic construction): a back edge is a CFG edge ``u → h`` whose head ``h``
dominates ``u``; its natural loop is ``h`` with every block that reaches ``u`` without passing
through ``h``. Back edges with the same head form one loop; a loop nests in the smallest loop
whose blocks contain its own.

Trip counts are read off each loop's counter (:mod:`.trips`); unknown ones say why.

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

from polyfuse.cuda.sass.mix import InstrMix, classify
from polyfuse.cuda.sass.parse import SassFunction
from polyfuse.cuda.sass.trips import TripCount, trip_count

__all__ = ["HotLoop", "Loop", "TripCount", "body_mix", "dominators", "find_loops", "hot_loop"]

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
    #: slots of one iteration, nested loops at their trip counts (see :func:`loop_mix`)
    mix: InstrMix = field(default_factory=InstrMix)

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
    return loops


@dataclass
class HotLoop:
    """The loop whose iterations dominate a kernel (see the module doc).

    ``kind``: ``"k-tile"``, ``"main"`` or ``"body"`` (no loop); ``mix``: the slots of one
    iteration (nested loops multiplied by their trip counts; branches inside counted as if
    every path ran); ``iterations``: per thread (trip counts of it and of the loops around it;
    None when one is unknown); ``inner``: the kk loop nested in a k-tile loop, if any, with
    ``inner_mix`` one of its iterations."""

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
    """Slots of one iteration of ``loops[i]``: its own blocks once, each nested loop's
    iteration times its trip count (an unknown trip count counts once, with a note)."""
    lp = loops[i]
    inner = set().union(*(loops[c].blocks for c in lp.children)) if lp.children else set()
    mix = InstrMix.of(ins for b in sorted(lp.blocks - inner) for ins in fn.blocks[b].instructions)
    for c in lp.children:
        n = loops[c].trip.iterations
        if n is None:
            n = 1
            if notes is not None:
                notes.append(f"loop @0x{loops[c].header:04x}: trip count unknown, counted once")
        mix = mix + loop_mix(fn, loops, c, notes).scaled(n)
    return mix


def body_mix(fn: SassFunction, loops: list[Loop], notes: list[str] | None = None) -> InstrMix:
    """Slots one thread executes in ``fn``: outside loops once, each outermost loop's
    iteration times its trip count (unknown: once, with a note)."""
    in_loops = set().union(*(lp.blocks for lp in loops)) if loops else set()
    mix = InstrMix.of(
        ins for b in fn.blocks if b.reachable and b.index not in in_loops for ins in b.instructions
    )
    for i, lp in enumerate(loops):
        if lp.parent is None:
            n = lp.trip.iterations
            if n is None:
                n = 1
                if notes is not None:
                    notes.append(f"loop @0x{lp.header:04x}: trip count unknown, counted once")
            mix = mix + loop_mix(fn, loops, i, notes).scaled(n)
    return mix


def _has(fn: SassFunction, lp: Loop, pred) -> bool:
    return any(pred(ins) for b in lp.blocks for ins in fn.blocks[b].instructions)


def _fp_work(mix: InstrMix) -> float:
    return sum(mix[c] for c in _FP)


def hot_loop(fn: SassFunction, loops: list[Loop] | None = None) -> HotLoop:
    """The hot loop of ``fn`` and one iteration's instruction mix (see the module doc)."""
    loops = find_loops(fn) if loops is None else loops
    notes: list[str] = []
    if not loops:
        return HotLoop("body", None, body_mix(fn, loops), 1)
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
