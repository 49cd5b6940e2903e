"""Block-range dispatch: several independent kernels printed as one ``__global__`` (Layer 3).

Each part's ``__global__`` becomes a ``__device__`` function taking its local block index
(``pf_block``, replacing ``blockIdx.x``) and, for a part without barriers, its local thread
index (``pf_thread``, replacing ``threadIdx.x``). The dispatch kernel gives part ``i`` the
``blockIdx.x`` range ``[first, first + blocks)``; the branch condition is uniform per block,
so a part's barriers are reached by every thread of its blocks. A barrier-free part whose
block is smaller than the padded one runs ``fold`` of its blocks side by side in one padded
block; threads past its last block do nothing. One whose block is larger than the padded
one (a multiple of it) runs each of its blocks over ``threads / block`` padded blocks, each
giving its threads their index in the part's block. Which parts and which layout come from
:mod:`polyfuse.stitch.parallel`.
"""

from __future__ import annotations

from polyfuse.base.decision import DecisionKind, noted, prefixed
from polyfuse.cuda.codegen.kernel_ast import Kernel, KParam
from polyfuse.cuda.codegen.kernel_dispatch import KDispatch, KPart, dispatch_of, print_dispatch
from polyfuse.stitch.facts import pack_facts


def dispatch_node(parts: list[Kernel], block: int, ranges: list[tuple[int, int, int]]) -> KDispatch:
    """The dispatch of ``parts`` in one launch of ``block`` threads: part ``i`` owns blocks
    ``[first, first + blocks)`` of ``ranges[i] = (first, blocks, fold)``. A part gets a local
    thread index when its block is folded, split or narrower than the padded one (only parts
    without barriers, shuffles or shared memory are laid out so, see
    :func:`polyfuse.stitch.parallel.pack_layout`)."""
    params: list[KParam] = []
    index: dict[str, int] = {}  # a buffer several parts read is passed once
    out = []
    for k, (first, blocks, fold) in zip(parts, ranges, strict=True):
        assert k.facts is not None and k.printed is not None, f"{k.name}: not a lowered kernel"
        threads = k.block[0]
        local = threads != block or fold > 1
        assert not (local and k.facts.collective), f"{k.name}: its threads act together"
        assert not (local and k.printed.own_thread_index), f"{k.name} reads threadIdx.x"
        for p in k.params:
            if p.name not in index:
                index[p.name] = len(params)
                params.append(KParam(p.name, p.ctype, p.tensor))
        args = tuple(index[p.name] for p in k.params)
        part = KPart(
            k.name,
            k.printed,
            k.canonical,
            first,
            blocks,
            fold,
            k.grid[0],
            threads,
            local,
            args,
            tuple(k.body),
        )
        out.append(part)
    return KDispatch(block, tuple(params), tuple(out))


def pack_kernels(
    name: str, parts: list[Kernel], block: int, ranges: list[tuple[int, int, int]]
) -> Kernel:
    """One kernel running ``parts`` (:func:`dispatch_node`): its body is the dispatch node,
    its source the node printed (:func:`polyfuse.cuda.codegen.kernel_dispatch.print_dispatch`)."""
    facts = [k.facts for k in parts if k.facts is not None]
    assert len(facts) == len(parts), "the parts are lowered kernels (with facts)"
    d = dispatch_node(parts, block, ranges)
    grid = sum(n for _, n, _ in ranges)
    notes: list[str] = [
        noted(
            DecisionKind.PACKED,
            f"parallel stitch: blocks [{f}, {f + n}) run {k.name}"
            + (f" ({fold} of its {k.block[0]}-thread blocks per block)" if fold > 1 else ""),
            k.name,
        )
        for k, (f, n, fold) in zip(parts, ranges, strict=True)
    ]
    notes += [prefixed(n, f"{k.name}: ") for k in parts for n in k.notes]
    return Kernel(
        name,
        list(d.params),
        [d],
        (grid, 1, 1),
        (block, 1, 1),
        [m for k in parts for m in k.micrographs],
        facts=pack_facts(facts),
        source=print_dispatch(d, name),
        bytes_read=sum(k.bytes_read for k in parts),
        bytes_written=sum(k.bytes_written for k in parts),
        tensor_bytes=_summed([k.tensor_bytes for k in parts]),
        notes=notes,
        vector_bytes=sum(k.vector_bytes for k in parts),
        reread_bytes=sum(k.reread_bytes for k in parts),
    )


def _summed(per_part: list[dict[str, tuple[int, int]]]) -> dict[str, tuple[int, int]]:
    """Per tensor, the parts' (read, written) bytes added up."""
    out: dict[str, tuple[int, int]] = {}
    for tb in per_part:
        for t, (r, w) in tb.items():
            r0, w0 = out.get(t, (0, 0))
            out[t] = (r0 + r, w0 + w)
    return out


def pack_parts(packed: Kernel) -> list[str]:
    """The names of the kernels ``packed`` runs, in dispatch order ([] for a plain kernel)."""
    d = dispatch_of(packed)
    return [] if d is None else [p.kernel for p in d.parts]
