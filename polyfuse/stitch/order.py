"""The kernel DAG of one graph: which kernel must run before which, from the buffers each reads
and writes.

Layer 3 (:mod:`polyfuse.stitch.parallel`) packs only kernels with no path between them on
this DAG; the compiled graph launches its kernels in :func:`dependence_order`. Both read a
kernel as ``(buffers read, buffers written)`` only, so this module needs no kernel type.
"""

from __future__ import annotations

import heapq

from polyfuse.base.errors import CallError


def dependence_preds(accesses: list[tuple[set[str], set[str]]]) -> list[set[int]]:
    """The kernel DAG's edges as predecessor sets: ``preds[j]`` holds every ``i`` that must run
    before ``j`` (``accesses`` as for :func:`dependence_order`, whose rules these are).
    Linear in the accesses: each buffer's writers are listed once."""
    n = len(accesses)
    writers: dict[str, list[int]] = {}  # buffer -> kernels writing it, in index order
    for i, (_, w) in enumerate(accesses):
        for buf in w:
            writers.setdefault(buf, []).append(i)
    preds: list[set[int]] = [set() for _ in range(n)]
    for j, (rj, wj) in enumerate(accesses):
        for buf in rj - wj:  # i produces what j only reads: i first
            preds[j].update(i for i in writers.get(buf, ()) if i != j)
        for buf in wj:  # two writers of one buffer: keep the given order
            for i in writers[buf]:
                if i >= j:
                    break
                preds[j].add(i)
    return preds


def dependence_order(accesses: list[tuple[set[str], set[str]]], names: list[str]) -> list[int]:
    """A launch order that respects every dependence through a buffer: ``accesses[i]`` is
    (buffers kernel ``i`` reads, buffers it writes). A kernel that reads or writes a buffer
    runs after every kernel that writes it without reading it (its producer); kernels that
    write the same buffer keep their given order, and so do independent kernels.
    Raises :class:`CallError` when the dependences form a cycle (no order exists).
    """
    n = len(accesses)
    preds = dependence_preds(accesses)
    succs: list[list[int]] = [[] for _ in range(n)]
    for j, ps in enumerate(preds):
        for i in ps:
            succs[i].append(j)
    # Kahn's algorithm taking the lowest ready index first: the given order where it can.
    indeg = [len(ps) for ps in preds]
    ready = [k for k in range(n) if indeg[k] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for j in succs[k]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, j)
    if len(order) < n:
        done = set(order)
        stuck = [names[k] for k in range(n) if k not in done]
        raise CallError(f"kernels {', '.join(stuck)} depend on each other in a cycle")
    return order
