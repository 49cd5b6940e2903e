"""Layer 3: parallel stitching — independent kernels share one launch (APOLLO Algorithm 3).

After Layer 2, kernels with no dependence path between them on the kernel DAG (edges from the
buffers each kernel reads and writes, :func:`polyfuse.stitch.order.dependence_preds`) may run
in one launch by *block-range dispatch*: each part owns a range of ``blockIdx.x`` and runs its
own body with a local block index (emitted by :mod:`polyfuse.cuda.codegen.pack`; the generated
kernels
are read as parts and the packs applied by :mod:`polyfuse.cuda.codegen.layer3`, this module decides
on
data alone). The block is padded to the largest part:

- a *collective* part (barriers, warp shuffles, mma, async copies or shared memory) must use
  the whole padded block, since every thread of its block has to reach its barriers; it is
  refused otherwise;
- a *free* part (none of those) is folded: ``block / its threads`` of its blocks share one
  padded block (``block`` must be a multiple of its threads), so no thread idles; where a
  collective part's block is the smaller one (a GEMM of 64 threads beside an elementwise
  kernel of 256), each of the free part's blocks is split over ``its threads / block``
  padded blocks instead (its threads must be a multiple of ``block``).

Packing never creates a cycle: a group is packed only when no member reaches another on the
DAG with every earlier pack contracted (a path A→C→B forbids packing A and B). Parts may
share buffers they only read (the branches of a multi-head op); the pack's distinct bytes then
count each shared element once (isl, :func:`read_overlap` on the read footprints each kernel's
plan carries, :attr:`polyfuse.stitch.plan.KernelPlan.shared_reads`).

Everything this module reads of a kernel is data: its launch shape, parameters, distinct bytes,
plan footprints and :class:`polyfuse.stitch.facts.KernelFacts` (shared arrays, dynamic pool,
register estimate, barriers, shuffles, launch axes), which the compile cache keeps too — so a
kernel served from the cache packs exactly as one generated now. A pack whose shared memory
would not fit one block is refused with its figures (:attr:`PackDecision.data`).

The cost model (:func:`modelled_us`, all figures *modelled*, never measured) is the one of
:mod:`polyfuse.poly.costs`: each part is described by its kernel (:attr:`PartShape.desc`: the
IR work estimate its facts carry, its launch and DRAM bytes) and one launch runs them side by
side (:class:`polyfuse.poly.costs.LaunchDesc`): every part's blocks priced by their own
instruction mix, resident blocks per SM following the padded block, the shared memory the pack
declares (every part's static arrays one after the other, plus the largest dynamic pool) and
the largest register count — so a pack is never modelled faster than the measured peaks its
parts' FLOPs and bytes allow. Algorithm 3: candidates sorted by modelled cost (descending); a
group of ``k`` is packed when separate launches minus the packed launch (the gain) is
positive, otherwise ``k`` shrinks by one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import reduce

import islpy as isl

from polyfuse.base.decision import Decided, DecisionKind, Refusal, refused
from polyfuse.base.decision_data import NO_DATA, DecisionData, PackData, SmemData
from polyfuse.poly.costs import KernelDesc, LaunchDesc, Modelled, model_launch
from polyfuse.poly.costs.stream import stream_desc
from polyfuse.poly.device import DeviceSpec
from polyfuse.poly.footprint import ITEMSIZE, count_points
from polyfuse.poly.policy import ASSUMED_REGISTERS, pack_smem_refusal
from polyfuse.stitch.facts import KernelFacts, pack_facts
from polyfuse.stitch.order import dependence_preds


@dataclass(frozen=True)
class PackConfig:
    """Threshold of Layer 3 packing: the least modelled gain a pack must bring."""

    min_gain_us: float = 0.0


@dataclass(frozen=True)
class PartShape:
    """What legality and the cost model need of one kernel: its launch, its distinct global
    bytes and its facts (never its text)."""

    name: str
    grid: int
    threads: int
    bytes: int
    facts: KernelFacts
    registers: int | None = None  # ptxas's count, else the facts' estimate, else unknown
    ineligible: str | None = None  # why this kernel cannot be a part at all
    #: the cost model's description of the kernel (None: from the launch and bytes alone)
    kernel: KernelDesc | None = None

    @property
    def collective(self) -> bool:
        """Whether the part needs its whole block (barriers, shuffles, shared memory...)."""
        return self.facts.collective

    @property
    def desc(self) -> KernelDesc:
        """What the cost model prices: the kernel's description, or a stream of its bytes."""
        if self.kernel is not None:
            return self.kernel
        return stream_desc(
            self.name,
            self.grid,
            self.threads,
            self.bytes,
            0,
            registers=self.registers or ASSUMED_REGISTERS,
            shared_bytes=self.facts.shared_bytes,
            barriers=self.facts.barriers,
        )


@dataclass(frozen=True)
class PackDecision:
    """A pack made or refused by Layer 3, with its reason and modelled gain (its plan record:
    :attr:`record`)."""

    kernels: list[str]
    packed: bool
    reason: str
    gain_us: float | None = None
    name: str | None = None  # the packed kernel
    micrographs: list[list[str]] = field(default_factory=list)  # per part, when packed
    kind: str = field(default="parallel stitch", init=False)
    kinds: tuple[DecisionKind, ...] = ()  # what the reason says, typed (polyfuse.base.decision)
    #: figures of a refusal (shared memory: SmemData's ``static_bytes``, ``dynamic_bytes``)
    data: DecisionData = NO_DATA
    #: the modelled time of the packed launch, each part priced on its own blocks (a pack's
    #: kernel IR is priced as if every block ran its costliest part)
    packed_us: float | None = None

    @property
    def record(self) -> Decided:
        """This pack as the one decision record (subject: the kernels)."""
        data = PackData(self.name, self.gain_us, [list(m) for m in self.micrographs], self.data)
        return Decided(self.decision_kinds, self.reason, data, tuple(self.kernels), self.packed)

    @property
    def decision_kinds(self) -> tuple[DecisionKind, ...]:
        """Every kind of this decision: Layer 3, packed or not, and the reason's kinds."""
        packed = (DecisionKind.PACKED,) if self.packed else ()
        return (DecisionKind.PARALLEL_STITCH, *packed, *self.kinds)

    def __str__(self) -> str:
        verb = f"packed into {self.name}" if self.packed else "not packed"
        gain = f" (modelled gain {self.gain_us:.2f} us)" if self.gain_us is not None else ""
        return f"{' + '.join(self.kernels)}: {verb}{gain}: {self.reason}"


@dataclass(frozen=True)
class PackLayout:
    """Block-range dispatch of a pack: padded block, and per part (first block, blocks,
    part blocks folded into one padded block); a part with more threads than the block (fold
    1) runs each of its blocks over ``its threads / block`` padded blocks."""

    block: int
    ranges: list[tuple[int, int, int]]

    @property
    def grid(self) -> int:
        return sum(n for _, n, _ in self.ranges)


def pack_layout(parts: list[PartShape]) -> PackLayout | Refusal:
    """The dispatch layout of ``parts`` (in this order), or why they cannot share a block (a
    FORM_MISMATCH refusal about the parts)."""
    subject = tuple(p.name for p in parts)
    coll = {p.threads for p in parts if p.collective}
    if len(coll) > 1:
        names = ", ".join(f"{p.name} ({p.threads})" for p in parts if p.collective)
        why = f"launch shapes differ: parts with barriers need their own block size: {names}"
        return refused(DecisionKind.FORM_MISMATCH, why, *subject)
    block = coll.pop() if coll else max(p.threads for p in parts)
    ranges, first = [], 0
    for p in parts:
        if p.collective:
            ranges.append((first, p.grid, 1))
        elif p.threads > block and p.threads % block == 0:
            # split: one of its blocks over several padded ones (it has no barriers, so its
            # threads need not share a block; cuda/codegen/pack.py gives each its thread index)
            ranges.append((first, p.grid * (p.threads // block), 1))
        else:
            if p.threads > block or block % p.threads:
                why = (
                    f"launch shapes differ: {p.name}'s {p.threads} threads and the "
                    f"{block}-thread block of a part with barriers: neither divides the other"
                )
                return refused(DecisionKind.FORM_MISMATCH, why, *subject)
            fold = block // p.threads
            ranges.append((first, -(-p.grid // fold), fold))
        first += ranges[-1][1]
    return PackLayout(block, ranges)


def modelled_us(
    parts: list[PartShape], device: DeviceSpec, cfg: PackConfig, layout: PackLayout | None = None
) -> float:
    """Modelled time (µs) of one launch running ``parts`` (one part: the kernel alone), by the
    cost model (:func:`polyfuse.poly.costs.model_launch`)."""
    return pack_modelled(parts, device, layout).us


def pack_modelled(
    parts: list[PartShape], device: DeviceSpec, layout: PackLayout | None = None
) -> Modelled:
    """The cost model's record of one launch running ``parts`` in ``layout``."""
    if layout is None:
        (p,) = parts
        layout = PackLayout(p.threads, [(0, p.grid, 1)])
    smem = pack_facts([p.facts for p in parts]).shared_bytes
    regs = max(p.registers or ASSUMED_REGISTERS for p in parts)
    launch = LaunchDesc(
        tuple(p.desc for p in parts),
        tuple(n for _, n, _ in layout.ranges),
        layout.block,
        regs,
        smem,
    )
    return model_launch(launch, device)


def _fits(parts: list[PartShape], device: DeviceSpec) -> Refusal | None:
    """Why the parts' shared memory does not fit one block (a FOOTPRINT refusal with its
    figures), or None. The pack declares every part's static arrays one after the other and
    one dynamic pool."""
    facts = pack_facts([p.facts for p in parts])
    static, dynamic = facts.static_shared_bytes, facts.dynamic_shared_bytes
    why = pack_smem_refusal(static, dynamic, device)
    if why is None:
        return None
    names = [p.name for p in parts]
    return refused(DecisionKind.FOOTPRINT, why, *names, data=SmemData(static, dynamic))


def _conflict(
    parts: list[PartShape], accesses, shareable: list[set[str]], b: int, group: list[int]
) -> tuple[str, tuple[DecisionKind, ...]] | None:
    """Why ``b`` cannot join ``group`` through a common buffer: one that some part writes, or
    one whose overlap cannot be counted (not in both parts' ``shareable`` reads)."""
    rb, wb = accesses[b]
    for a in group:
        ra, wa = accesses[a]
        common = (ra | wa) & (rb | wb)
        if not common:
            continue
        names = ", ".join(sorted(common))
        if (wa | wb) & common:
            why = f"{parts[b].name} and {parts[a].name} both access {names}, written by one"
            return why, ()
        if not common <= shareable[a] & shareable[b]:
            why = (
                f"{parts[b].name} and {parts[a].name} both read {names}: shared buffers are "
                "not packed when a part stages them in shared memory or registers (the pack's "
                "distinct bytes could not be counted)"
            )
            return why, (DecisionKind.SHARED_BUFFER,)
    return None


def plan_packs(
    parts: list[PartShape],
    accesses: list[tuple[set[str], set[str]]],
    device: DeviceSpec,
    cfg: PackConfig | None = None,
    shareable: list[set[str]] | None = None,
) -> tuple[list[list[int]], list[PackDecision]]:
    """Algorithm 3 over the kernel DAG: the launches as groups of kernel indices (in a
    topological order of the contracted DAG; singletons stay alone) and every decision.
    ``shareable[i]``: the buffers kernel ``i`` may read together with other parts (default:
    all it reads)."""
    cfg = cfg or PackConfig()
    n = len(parts)
    shareable = shareable if shareable is not None else [set(r) for r, _ in accesses]
    preds = dependence_preds(accesses)
    cluster = list(range(n))  # representative of each kernel's pack
    members = {i: [i] for i in range(n)}
    decisions: list[PackDecision] = []
    if n < 2:
        return [[i] for i in range(n)], decisions

    def reach() -> tuple[dict[int, int], dict[int, int]]:
        """Bitmasks of the clusters each cluster reaches and is reached from, on the contracted
        DAG (iterative: folded along a topological order, so deep models need no recursion)."""
        succ: dict[int, set[int]] = {c: set() for c in members}
        indeg = dict.fromkeys(members, 0)
        for j in range(n):
            for i in preds[j]:
                ci, cj = cluster[i], cluster[j]
                if ci != cj and cj not in succ[ci]:
                    succ[ci].add(cj)
                    indeg[cj] += 1
        order = [c for c in members if indeg[c] == 0]
        for c in order:  # Kahn: the list grows while it is walked
            for s in succ[c]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    order.append(s)
        down = dict.fromkeys(members, 0)
        up = dict.fromkeys(members, 0)
        for c in reversed(order):
            m = 0
            for s in succ[c]:
                m |= (1 << s) | down[s]
            down[c] = m
        for c in order:
            for s in succ[c]:
                up[s] |= (1 << c) | up[c]
        return down, up

    for p in parts:
        if p.ineligible:
            decisions.append(PackDecision([p.name], False, f"not a candidate: {p.ineligible}"))
    cand = [i for i in range(n) if not parts[i].ineligible]
    alone = {i: modelled_us([parts[i]], device, cfg) for i in cand}
    cand.sort(key=lambda i: (-alone[i], i))
    visited: set[int] = set()
    down: dict[int, int] = {}
    up: dict[int, int] = {}
    stale = True  # reachability changes only when a pack contracts clusters
    for a in cand:
        if a in visited:
            continue
        if stale:
            down, up = reach()
            stale = False
        group, dependent = [a], []
        related = down[cluster[a]] | up[cluster[a]]  # clusters with a path to or from the group
        for b in cand:
            if b == a or b in visited:
                continue
            if related >> cluster[b] & 1:
                dependent.append(parts[b].name)
                continue
            conflict = _conflict(parts, accesses, shareable, b, group)
            if conflict:
                why, kinds = conflict
                pair = [parts[a].name, parts[b].name]
                decisions.append(PackDecision(pair, False, why, kinds=kinds))
                continue
            lay = pack_layout([parts[i] for i in (*group, b)])
            if isinstance(lay, Refusal):  # its block cannot join the group's: try the next one
                names = [parts[i].name for i in (*group, b)]
                decisions.append(PackDecision(names, False, lay.reason, kinds=(lay.kind,)))
                continue
            group.append(b)
            related |= down[cluster[b]] | up[cluster[b]]
        if dependent:
            shown = ", ".join(dependent[:6]) + (
                f" +{len(dependent) - 6} more" if dependent[6:] else ""
            )
            decisions.append(
                PackDecision(
                    [parts[a].name],
                    False,
                    f"dependence path on the kernel DAG (packing would form a cycle) to {shown}",
                    kinds=(DecisionKind.CYCLE,),
                )
            )
        m = 0
        while len(group) - m >= 2:
            k = len(group) - m
            while k >= 2:
                # members are pairwise independent, and contracting some of them cannot join
                # two others (that path would need a member reaching a contracted one)
                sub = group[m : m + k]
                lay = pack_layout([parts[i] for i in sub])
                if isinstance(lay, Refusal):  # the only refusal: launch shapes differ
                    names = [parts[i].name for i in sub]
                    decisions.append(PackDecision(names, False, lay.reason, kinds=(lay.kind,)))
                    k -= 1
                    continue
                no = _fits([parts[i] for i in sub], device)
                if no is not None:
                    names = [parts[i].name for i in sub]
                    kinds = (no.kind,)
                    decisions.append(
                        PackDecision(names, False, no.reason, kinds=kinds, data=no.data)
                    )
                    k -= 1
                    continue
                sep = sum(alone[i] for i in sub)
                packed = modelled_us([parts[i] for i in sub], device, cfg, lay)
                gain = sep - packed
                if not math.isfinite(packed) or gain <= cfg.min_gain_us:
                    why = (
                        f"cost model: no gain (separate {sep:.2f} us, packed {packed:.2f} us, "
                        f"block {lay.block}, modelled)"
                    )
                    names = [parts[i].name for i in sub]
                    cost = (DecisionKind.COST_MODEL,)
                    decisions.append(PackDecision(names, False, why, gain, kinds=cost))
                    k -= 1
                    continue
                rep = min(sub)  # every member is still a kernel alone (not yet visited)
                for i in sub:
                    del members[i]
                    cluster[i] = rep
                members[rep] = sorted(sub)
                stale = True
                why = (
                    f"cost model: separate {sep:.2f} us, packed {packed:.2f} us "
                    f"({lay.grid} blocks of {lay.block} threads, modelled)"
                )
                names = [parts[i].name for i in sub]
                cost = (DecisionKind.COST_MODEL,)
                decisions.append(PackDecision(names, True, why, gain, kinds=cost, packed_us=packed))
                visited.update(sub)
                break
            m += max(k, 1)
        visited.add(a)
    return _topological_groups(preds, cluster, members), decisions


def _topological_groups(preds, cluster: list[int], members: dict[int, list[int]]):
    """The packs in a topological order of the contracted DAG (ties: smallest kernel first)."""
    cpreds: dict[int, set[int]] = {c: set() for c in members}
    for j, ps in enumerate(preds):
        for i in ps:
            if cluster[i] != cluster[j]:
                cpreds[cluster[j]].add(cluster[i])
    out, done = [], set()
    while len(out) < len(members):
        ready = [c for c in members if c not in done and cpreds[c] <= done]
        if not ready:  # cannot happen: every pack was checked for paths first
            raise AssertionError("parallel stitching formed a cycle")
        c = min(ready, key=lambda c: min(members[c]))
        out.append(list(members[c]))
        done.add(c)
    return out


def read_overlap(footprints: list[str]) -> int:
    """Bytes of one global tensor that several parts read (their footprints, isl sets as
    :attr:`KernelPlan.shared_reads` holds them): the sum of their distinct reads minus the
    distinct reads of all together (one launch running them reads each element once)."""
    sets = [isl.Set(f) for f in footprints]
    union = reduce(lambda a, b: a.union(b), sets).coalesce()
    counts = [count_points(s) for s in [*sets, union]]
    if any(c is None for c in counts):
        return 0  # isl cannot count them (poly/footprint.COUNT_LIMITS): no overlap is claimed
    return (sum(counts[:-1]) - counts[-1]) * ITEMSIZE
