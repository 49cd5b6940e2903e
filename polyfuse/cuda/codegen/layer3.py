"""Layer 3 applied to generated kernels: each kernel read as a candidate part, the packs that
:func:`polyfuse.stitch.parallel.plan_packs` decides emitted as one launch each.

The decision (Algorithm 3, the dispatch layout, the modelled gain, the shared-memory check)
is :mod:`polyfuse.stitch.parallel`'s and reads data only (:class:`PartShape`: launch shape,
bytes, :class:`polyfuse.stitch.facts.KernelFacts`, the IR work estimate); this module turns a
:class:`polyfuse.cuda.codegen.kernel_ast.Kernel` into that data (:func:`part_shape`), reads its
buffer
accesses from its parameters (:func:`kernel_accesses`) and emits the packs
(:func:`polyfuse.cuda.codegen.pack.pack_kernels`).
"""

from __future__ import annotations

from dataclasses import replace

from polyfuse.cuda.codegen.kernel_ast import Kernel
from polyfuse.cuda.codegen.kernel_cost import describe_kernel
from polyfuse.cuda.codegen.pack import pack_kernels
from polyfuse.poly.device import DeviceSpec
from polyfuse.stitch.facts import KernelFacts
from polyfuse.stitch.parallel import (
    PackConfig,
    PackDecision,
    PartShape,
    pack_layout,
    plan_packs,
    read_overlap,
)
from polyfuse.stitch.plan import KernelPlan


def part_shape(k: Kernel) -> PartShape:
    """The kernel as a candidate part (``ineligible`` says why it cannot be one), from its
    launch shape, parameters and facts."""
    facts = k.facts if k.facts is not None else KernelFacts()
    why = None
    if k.facts is None:
        why = f"{k.name}: no kernel facts (not lowered by polyfuse)"
    elif k.grid[1:] != (1, 1) or k.block[1:] != (1, 1):
        why = f"{k.name}: 2-D launch shape {k.grid}x{k.block}"
    elif facts.axes != ("x",):
        why = f"{k.name}: uses launch axes block-range dispatch does not rewrite"
    elif facts.parts > 1:
        why = f"{k.name}: already a packed launch"
    elif k.printed is None:
        why = f"{k.name}: not one printed kernel function (polyfuse.cuda.codegen.kernel_function)"
    elif k.printed.own_block_index:
        why = f"{k.name}: reads its block index itself (a GEMM + row-reduction kernel)"
    elif any(not p.ctype.endswith("*") for p in k.params):
        why = f"{k.name}: scalar parameters"
    return PartShape(
        k.name,
        k.grid[0],
        k.block[0],
        k.bytes_read + k.bytes_written,
        facts,
        k.registers or facts.registers,
        why,
        describe_kernel(k) if k.facts is not None else None,
    )


def stitch_parallel(
    kernels: list[Kernel],
    plans: list[KernelPlan],
    mapped: list,
    device: DeviceSpec,
    cfg: PackConfig | None = None,
) -> tuple[list[Kernel], list[KernelPlan], list, list[PackDecision]]:
    """Layer 3 over the kernels of one graph: the launched kernels (packs emitted by
    :func:`polyfuse.cuda.codegen.pack.pack_kernels`), their plans, layouts (None for a pack) and
    every decision. ``kernels`` come in launch order; the result is in a launch order too.
    Everything read of a kernel is data its plan and facts carry whether it was generated
    now or served by the compile cache (facts, :attr:`KernelPlan.shared_reads`), so the
    packs do not depend on the cache."""
    cfg = cfg or PackConfig()
    shapes = [part_shape(k) for k in kernels]
    accesses = kernel_accesses(kernels)
    # read from global memory, with a footprint isl can intersect
    shareable = [set(r) & set(kp.shared_reads) for (r, _), kp in zip(accesses, plans, strict=True)]
    groups, decisions = plan_packs(shapes, accesses, device, cfg, shareable)
    out_k, out_p, out_m = [], [], []
    names = {tuple(d.kernels): d for d in decisions if d.packed}
    for j, g in enumerate(groups):
        if len(g) == 1:
            (i,) = g
            out_k.append(kernels[i])
            out_p.append(plans[i])
            out_m.append(mapped[i])
            continue
        d = next(d for key, d in names.items() if set(key) == {kernels[i].name for i in g})
        g = [i for name in d.kernels for i in g if kernels[i].name == name]  # decision order
        lay = pack_layout([shapes[i] for i in g])
        assert not isinstance(lay, str)
        name = f"pk{j}_{kernels[g[0]].name}"
        at = next(n for n, x in enumerate(decisions) if x is d)
        decisions[at] = replace(d, name=name, micrographs=[list(kernels[i].micrographs) for i in g])
        packed = pack_kernels(name, [kernels[i] for i in g], lay.block, lay.ranges)
        reads = [t for i in g for t in accesses[i][0]]
        overlap = {  # each element counted once
            t: read_overlap([plans[i].shared_reads[t] for i in g if t in accesses[i][0]])
            for t in sorted({t for t in reads if reads.count(t) > 1})
        }
        per_tensor = dict(packed.tensor_bytes)
        for t, n in overlap.items():
            if t in per_tensor:
                per_tensor[t] = (per_tensor[t][0] - n, per_tensor[t][1])
        packed = replace(
            packed,
            bytes_read=packed.bytes_read - sum(overlap.values()),
            tensor_bytes=per_tensor,
        )
        out_k.append(packed)
        placements = {t: p for i in g for t, p in plans[i].placements.items()}
        cached = any(plans[i].cached for i in g)  # a cached part has no layouts to list
        out_p.append(
            KernelPlan(
                name,
                [] if cached else [p for i in g for p in plans[i].parts],
                placements,
                names=[m for i in g for m in kernels[i].micrographs],
                cached=cached,
                recomputes=[d for i in g for d in plans[i].recomputes],
                layout=[d for i in g for d in plans[i].layout],
            )
        )
        out_m.append(None)
    return out_k, out_p, out_m, decisions


def kernel_accesses(kernels: list[Kernel]) -> list[tuple[set[str], set[str]]]:
    """(buffers read, buffers written) per kernel: ``const`` pointers are read only."""
    accesses = []
    for k in kernels:
        bufs = [p for p in k.params if p.tensor]
        reads = {p.tensor for p in bufs if p.ctype.startswith("const")}
        writes = {p.tensor for p in bufs if not p.ctype.startswith("const")}
        accesses.append((reads, writes))
    return accesses
