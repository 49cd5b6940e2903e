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

import re

from polyfuse.cuda.kernel_ast import Kernel, KMark, KParam
from polyfuse.cuda.namer import part_function, rename_identifiers
from polyfuse.stitch.facts import pack_facts

_HEAD = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\([\d, ]+\) )?(\w+)\(')


def _device_function(k: Kernel, fn: str, free: bool) -> str:
    """``k``'s source as ``__device__ void fn(params..., pf_block, pf_thread)``."""
    m = _HEAD.search(k.source)
    assert m is not None, k.name
    close = k.source.index(") {", m.end())
    head = f"__device__ __forceinline__ void {fn}({k.source[m.end() : close]}, "
    head += "const int pf_block, const int pf_thread) {"
    body = k.source[close + 3 :].replace("blockIdx.x", "pf_block")
    if free:
        body = body.replace("threadIdx.x", "pf_thread")
    return k.source[: m.start()] + head + body


def pack_kernels(
    name: str, parts: list[Kernel], block: int, ranges: list[tuple[int, int, int]]
) -> Kernel:
    """One kernel running ``parts``: part ``i`` owns blocks ``[first, first + blocks)`` of
    ``ranges[i] = (first, blocks, fold)``; ``fold > 1`` packs that many of its blocks
    (``block // fold`` threads each) into one; ``fold == 1`` with fewer threads than ``block``
    guards the extra threads off, with more (a multiple) splits each of its blocks over
    several (only for parts without barriers)."""
    facts = [k.facts for k in parts if k.facts is not None]
    assert len(facts) == len(parts), "the parts are lowered kernels (with facts)"
    funcs, calls, params = [], [], []
    for i, (k, (first, blocks, fold)) in enumerate(zip(parts, ranges, strict=True)):
        threads = k.block[0]
        free = threads != block or fold > 1
        fn = part_function(name, i)  # derived from the kernel's name: renaming it renames these
        funcs.append(_device_function(k, fn, free))
        args = ", ".join(p.name for p in k.params)
        cond = f"pf_b < {first + blocks}"
        if threads > block:  # split: part block pf_b / split, threads past block * part
            split = threads // block
            call = [
                f"    const int pf_v = (pf_b - {first}) / {split};",
                f"    {fn}({args}, pf_v, ((pf_b - {first}) % {split}) * {block} + "
                "(int)threadIdx.x);",
            ]
        elif free:
            call = [
                f"    const int pf_v = (pf_b - {first}) * {fold} + (int)threadIdx.x / {threads};",
                f"    if (pf_v < {k.grid[0]}) {fn}({args}, pf_v, (int)threadIdx.x % {threads});",
            ]
        else:
            call = [f"    {fn}({args}, pf_b - {first}, (int)threadIdx.x);"]
        kw = "if" if not calls else "} else if"
        calls += [f"  {kw} ({cond}) {{  // {k.name}: {k.grid[0]} blocks of {threads}"] + call
        seen = {p.name for p in params}  # a buffer several parts read is passed once
        params += [KParam(p.name, p.ctype, p.tensor) for p in k.params if p.name not in seen]
    sig = ", ".join(f"{p.ctype} __restrict__ {p.name}" for p in params)
    lines = [f'extern "C" __global__ void __launch_bounds__({block}) {name}({sig}) {{']
    lines += ["  const int pf_b = blockIdx.x;"] + calls + ["  }", "}"]
    source = "\n".join(funcs) + "\n" + "\n".join(lines) + "\n"
    grid = sum(n for _, n, _ in ranges)
    notes = [
        f"parallel stitch: blocks [{f}, {f + n}) run {k.name}"
        + (f" ({fold} of its {k.block[0]}-thread blocks per block)" if fold > 1 else "")
        for k, (f, n, fold) in zip(parts, ranges, strict=True)
    ]
    notes += [f"{k.name}: {n}" for k in parts for n in k.notes]
    return Kernel(
        name,
        params,
        [KMark(f"pack:{k.name}", k.body) for k in parts],
        (grid, 1, 1),
        (block, 1, 1),
        [m for k in parts for m in k.micrographs],
        facts=pack_facts(facts),
        source=source,
        bytes_read=sum(k.bytes_read for k in parts),
        bytes_written=sum(k.bytes_written for k in parts),
        tensor_bytes=_summed([k.tensor_bytes for k in parts]),
        notes=notes,
        vector_bytes=sum(k.vector_bytes for k in parts),
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
    return [m.name[5:] for m in packed.body if isinstance(m, KMark) and m.name.startswith("pack:")]


def canonical_pack(packed: Kernel, parts: list[Kernel], part_canonical: list[str]) -> str:
    """``packed``'s body in canonical form, for :mod:`polyfuse.cuda.dedup`: the dispatcher
    with its kernel, part and buffer names replaced by positions, which parameter each part
    reads, and each part's own canonical body. Two packs with equal forms compute the same
    thing on different buffers (the twelve layers of a transformer pack alike)."""
    names = {packed.name: "pfKERNEL"}
    for i, k in enumerate(parts):
        names[part_function(packed.name, i)] = names[k.name] = f"pfPART{i}"
    index = {p.name: j for j, p in enumerate(packed.params)}
    names.update({name: f"pfT{j}" for name, j in index.items()})
    dispatcher = packed.source[packed.source.rindex('extern "C" __global__') :]
    canon = rename_identifiers(dispatcher, names)
    sharing = [[index[p.name] for p in k.params] for k in parts]
    return "\n".join([canon, repr(sharing), *part_canonical])
