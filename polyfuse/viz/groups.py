"""Repeated blocks of kernels (a transformer's layers), found in the report data.

A report of 200 kernels is readable only if its repeated layers fold into one card each. The
layers are found from what the kernels compute, never from their names: a kernel's
*signature* is its launch shape and, per micrograph, per primitive, its op kind, composite tag,
shape and read access kinds. In plan order the kernels are a sequence of signatures; ``r >= 2``
consecutive copies of a block of ``p >= 2`` signatures form a tandem repeat. The repeat that
covers the most kernels is taken first (ties: the shorter block, then the earlier start); the
kernels before and after it are searched again. Where a copy starts is chosen so that the
fewest tensors cross the boundary between consecutive copies (a layer's narrow waist), ties
going to the earliest start.

Each copy becomes a *segment* the page can collapse into one card; the kernels in no repeat
form plain segments between them, foldable too once the report has repeats (so that a big
report opens as a column of cards). A segment's label is the common prefix, in whole name
components, of the weights it reads (``layer3``, ``stage2_block1``) when there is one — a
hint for people, the grouping never depends on it.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

#: Smallest block and number of copies that make a repeat worth folding.
MIN_PERIOD, MIN_COUNT = 2, 2
#: A repeat must cover at least this many kernels.
MIN_COVER = 6
#: What separates the components of a weight's name.
_SEPARATORS = "_.-/:"
#: Reports with more kernels than this open with their segments folded into cards.
COLLAPSE_AT_LOAD_KERNELS = 40


@dataclass(frozen=True)
class Repeat:
    """``count`` copies of a block of ``period`` kernels starting at kernel ``start``."""

    start: int
    period: int
    count: int

    @property
    def end(self) -> int:
        return self.start + self.period * self.count


def kernel_signatures(data: dict[str, Any]) -> list[tuple]:
    """Per kernel of ``data`` (in order), what it computes without names."""
    by_mg: dict[str, list[dict[str, Any]]] = {}
    for p in data["prims"]:
        by_mg.setdefault(p["mg"], []).append(p)
    out = []
    for k in data["kernels"]:
        parts = tuple(
            tuple(
                (
                    p["kind"],
                    p["composite"],
                    tuple(p["shape"]),
                    tuple(r["access"] for r in p["reads"]),
                )
                for p in by_mg.get(m, [])
            )
            for m in k["micrographs"]
        )
        out.append((tuple(k["grid"]), tuple(k["block"]), parts))
    return out


def _best_run(seq: Sequence[Hashable], lo: int, hi: int) -> tuple[Repeat, int] | None:
    """The tandem repeat in ``seq[lo:hi]`` covering most items (see the module docstring),
    with the length of the periodic stretch it was found in."""
    best: tuple[Repeat, int] | None = None
    best_key: tuple[int, int, int] | None = None
    for p in range(MIN_PERIOD, (hi - lo) // MIN_COUNT + 1):
        run = 0
        for i in range(lo, hi - p + 1):
            if i < hi - p and seq[i] == seq[i + p]:
                run += 1
                continue
            if run:  # seq[i - run : i + p] has period p
                s, count = i - run, (run + p) // p
                key = (p * count, -p, -s)
                if (
                    count >= MIN_COUNT
                    and p * count >= MIN_COVER
                    and (best_key is None or key > best_key)
                ):
                    best, best_key = (Repeat(s, p, count), run + p), key
            run = 0
    return best


def _phase(rep: Repeat, length: int, edges: list[tuple[int, int, str]]) -> Repeat:
    """The copies of a periodic stretch of ``length`` kernels from ``rep.start``, started
    where the fewest tensors cross between consecutive copies (then: most copies, earliest)."""
    best, best_key = rep, None
    for ph in range(rep.period):
        count = (length - ph) // rep.period
        if count < MIN_COUNT:
            break
        cand = Repeat(rep.start + ph, rep.period, count)
        cuts = [cand.start + j * rep.period for j in range(1, count)]
        crossing = sum(len({t for a, b, t in edges if a < c <= b}) for c in cuts) / len(cuts)
        key = (crossing, -count, ph)
        if best_key is None or key < best_key:
            best, best_key = cand, key
    return best


def find_repeats(seq: Sequence[Hashable], edges: list[tuple[int, int, str]] = ()) -> list[Repeat]:
    """Disjoint tandem repeats of ``seq``, largest first then recursively around it.

    ``edges`` (producer index, consumer index, tensor) choose where each copy starts.
    """
    out: list[Repeat] = []
    todo = [(0, len(seq))]
    while todo:
        lo, hi = todo.pop()
        found = _best_run(seq, lo, hi)
        if found is None:
            continue
        rep = _phase(*found, list(edges))
        out.append(rep)
        todo += [(lo, rep.start), (rep.end, hi)]
    return sorted(out, key=lambda r: r.start)


def _label(data: dict[str, Any], kernels: list[str]) -> str:
    """The common prefix of the constant inputs these kernels read ("layer3"), or ""."""
    const = {i["id"] for i in data["inputs"] if i["constant"]}
    kset = set(kernels)
    kernel_of = {p["id"]: p["kernel"] for p in data["prims"]}
    names = sorted(
        {e["src"] for e in data["input_edges"] if e["src"] in const and kernel_of[e["dst"]] in kset}
    )
    if len(names) < 2:
        return ""
    prefix = os.path.commonprefix(names)
    if any(n[len(prefix) : len(prefix) + 1] not in _SEPARATORS for n in names):
        cut = max(prefix.rfind(c) for c in _SEPARATORS)  # whole components only
        prefix = prefix[:cut] if cut >= 0 else ""
    prefix = prefix.rstrip(_SEPARATORS)
    return prefix if len(prefix) >= 2 else ""


def segments(data: dict[str, Any]) -> dict[str, Any]:
    """The report's segments (repeat copies and the plain runs between them) and repeats."""
    kernels = [k["id"] for k in data["kernels"]]
    index = {k: i for i, k in enumerate(kernels)}
    kernel_of = {p["id"]: p["kernel"] for p in data["prims"]}
    edges = sorted(
        {
            (index[kernel_of[d["producer"]]], index[kernel_of[d["consumer"]]], d["tensor"])
            for d in data["decisions"]
            if kernel_of[d["producer"]] != kernel_of[d["consumer"]]
        }
    )
    reps = find_repeats(kernel_signatures(data), edges)
    segs: list[dict[str, Any]] = []
    repeats: list[dict[str, Any]] = []

    def plain(lo: int, hi: int) -> None:
        if hi > lo:
            ks = kernels[lo:hi]
            segs.append(
                {
                    "id": f"s{len(segs)}",
                    "kernels": ks,
                    "repeat": None,
                    "foldable": bool(reps),
                    "label": _label(data, ks),
                }
            )

    at = 0
    for r, rep in enumerate(reps):
        plain(at, rep.start)
        ids = []
        for c in range(rep.count):
            lo = rep.start + c * rep.period
            ks = kernels[lo : lo + rep.period]
            ids.append(f"s{len(segs)}")
            segs.append(
                {
                    "id": ids[-1],
                    "kernels": ks,
                    "repeat": r,
                    "copy": c,
                    "count": rep.count,
                    "foldable": True,
                    "label": _label(data, ks),
                }
            )
        repeats.append({"id": r, "period": rep.period, "count": rep.count, "segments": ids})
        at = rep.end
    plain(at, len(kernels))
    folded = sum(r["period"] * r["count"] for r in repeats)
    return {
        "segments": segs,
        "repeats": repeats,
        "collapse_at_load": bool(repeats) and len(kernels) > COLLAPSE_AT_LOAD_KERNELS,
        "folded_kernels": folded,
    }
