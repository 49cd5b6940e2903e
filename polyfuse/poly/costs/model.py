"""The cost model: the modelled time of one kernel launch from its typed description.

A launch takes ``launch_us`` plus the time its resources keep it busy (every figure
*modelled*, never measured): the ``overlap_p``-norm of the times each resource needs — the
longest of them, plus a little when others come close (they do not overlap perfectly):

SM-local resources, on the busiest SM: blocks are spread evenly, so one SM runs
``ceil(blocks / SMs)`` of them (wave quantisation; a pack's blocks are priced by their part):

- **issue**: every instruction slot, ``schedulers`` warp instructions per clock per SM, at the
  efficiency the resident warps allow (``min(1, warps per scheduler / issue_warps)``, the
  warps that keep one scheduler busy; occupancy from :func:`polyfuse.poly.device.occupancy`);
- **FP32 pipe**: FFMA/FMUL/FADD at ``lanes / 32`` warp instructions per clock per SM;
- **tensor pipe**: ``mma.sync`` instructions at the SM's tensor-core rate
  (:attr:`polyfuse.poly.device.DeviceSpec.mma_per_second`: the A100 datasheet's, the H100's
  measured for ``mma.sync``), so no tensorized kernel runs faster than its tensor cores;
- **shared memory**: the bytes of LDS/STS and of the shared side of cp.async, 128 B (one
  wavefront, no bank conflicts) per clock per SM;
- **L1**: the bytes global loads, stores and spills request (a warp's 32 lanes x width; a
  request that uses part of a 128-byte line costs the line, where the description knows it),
  through the same 128 B per clock;

device-wide resources:

- **FP32 peak**: the FLOPs at the *measured* cuBLAS FP32 rate where the device was measured
  (:attr:`polyfuse.poly.device.DeviceSpec.throughput_tflops`): the model never runs FP32 work
  faster than that;
- **DRAM**: the distinct bytes isl counted at the *measured* copy bandwidth, bytes moved by
  32-bit accesses at ``scalar_efficiency`` of it;
- **L2**: the bytes the SMs fetch from L2 at :attr:`DeviceSpec.l2_gbps`: a block whose
  distinct reads (``block_read_bytes``: a GEMM's tiles, or what isl counts one block of any
  other kernel reading, :func:`polyfuse.poly.footprint.block_read_bytes`) exceed the L1 left
  beside its resident blocks' shared memory streams them (every block fetches its own); a
  smaller footprint is reused from L1 by the SM's other blocks, so L2 sees the DRAM bytes —
  except the bytes 16-byte ``cp.async`` fills (``block_bypass_bytes``: ``cp.async.cg``, which
  bypasses the L1), which every block fetches from L2 whatever the L1 holds; without a
  footprint (a lowered GEMM, a pack), every requested global load (the mix's) is an L2
  fetch — exact for tiled kernels, whose loads are tile fills;
- **DRAM latency** (Little's law): the resident threads keep ``inflight_bytes`` each in flight
  for ``latency_us``; with one block per SM and barriers between its phases, the SM's loads
  and stores do not overlap (each phase at its own rate, the rounds one after another); the
  reads include ``reread_bytes``, an input that later parts read again past the L1 (from L2,
  at the same in-flight-bound rate: a phase of its own);
- **fill latency**: a block whose loop iterations wait at a barrier for their own synchronous
  loads (``sync_phases``: single-stage shared tiles) spends ``latency_us`` plus its own
  compute per iteration; the SM runs its blocks in rounds of the resident ones;
- **block phases**: a tensor-core kernel's blocks start together and step through the same
  phases: the first fill waits ``latency_us``, the k-step loop runs at the longer of its
  issue and its mma instructions, then the tail (``KernelDesc.tail``: fills and epilogue
  outside the loop) issues with no mma beside it, or its stores drain at the SM's share of
  the DRAM rate, whichever is longer — the resident blocks' phases one after another, the
  SM's rounds too. It refines the tensor pipe's bound, so the norm below counts
  the two once (the tensor pipe's time leaves it where block phases are priced).

The constants and their sources: :mod:`polyfuse.poly.costs.constants`. A timed call of several
launches adds ``call_us`` once (:func:`call_us`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from polyfuse.base.decision import prefixed
from polyfuse.poly.costs.constants import CONSTANTS, CostConstants
from polyfuse.poly.costs.desc import KernelDesc, LaunchDesc, Mix
from polyfuse.poly.device import DeviceSpec, Occupancy, occupancy

#: The bounds a launch can be bound by, in report order.
BOUNDS = (
    "issue",
    "FP32 pipe",
    "tensor pipe",
    "shared memory",
    "L1",
    "FP32 peak",
    "DRAM",
    "L2",
    "DRAM latency",
    "fill latency",
    "block phases",
)
#: The bounds priced at a measured device figure (where the device was measured).
MEASURED_BOUNDS = ("FP32 peak", "DRAM")


@dataclass
class Modelled:
    """The modelled time of one launch (a model, not a measurement)."""

    us: float
    bound: str  # one of BOUNDS, or "does not fit" (one block exceeds the SM)
    bounds_us: dict[str, float]
    occupancy: Occupancy
    waves: float  # blocks / (resident blocks per SM x SMs)
    source: str  # where the instruction mix came from
    launch_us: float
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        us = f"{self.us:.1f}" if self.us >= 10 else f"{self.us:.3g}"
        return (
            f"modelled {us} us ({self.bound}-bound, {self.occupancy}, {self.waves:.2f} waves; "
            f"mix: {self.source})"
        )

    def to_json(self) -> dict:
        return {
            "modelled_us": round(self.us, 3),
            "bound": self.bound,
            "bounds_us": {k: round(v, 3) for k, v in self.bounds_us.items()},
            "blocks_per_sm": self.occupancy.blocks_per_sm,
            "limiter": self.occupancy.limiter,
            "waves": round(self.waves, 3),
            "source": self.source,
            "notes": list(self.notes),
        }


def model_kernel(
    desc: KernelDesc, device: DeviceSpec, consts: CostConstants = CONSTANTS
) -> Modelled:
    """The modelled time of ``desc`` launched alone on ``device``."""
    return model_launch(LaunchDesc.single(desc), device, consts)


def model_launch(
    launch: LaunchDesc, device: DeviceSpec, consts: CostConstants = CONSTANTS
) -> Modelled:
    """The modelled time of one launch running ``launch.parts`` (see the module doc)."""
    occ = occupancy(device, launch.threads, max(1, launch.registers), launch.shared_bytes)
    source = "; ".join(dict.fromkeys(p.source for p in launch.parts))
    n = launch.grid
    if occ.blocks_per_sm == 0 or n == 0:
        why = "one block does not fit an SM" if n else "no blocks"
        return Modelled(math.inf, "does not fit", {}, occ, 0.0, source, consts.launch_us, [why])
    sms, clock = device.sms, device.sustained_clock_mhz * 1e6
    per_sm = -(-n // sms)  # blocks the busiest SM runs
    warps = -(-launch.threads // 32)
    resident = min(occ.blocks_per_sm, per_sm)
    per_scheduler = resident * warps / device.schedulers_per_sm
    issue_eff = min(1.0, per_scheduler / consts.issue_warps)
    b = _sm_bounds_s(launch, occ, device, issue_eff)
    flops = sum(nb * launch.threads * p.mix.flops for p, nb in launch.pairs())
    b["FP32 peak"] = flops / (device.throughput_tflops * 1e12)
    moved = sum(p.dram_bytes for p in launch.parts)
    vector = min(moved, sum(p.vector_bytes for p in launch.parts))
    share = vector / moved if moved else 0.0
    eff = consts.scalar_efficiency + (1 - consts.scalar_efficiency) * share
    dram = device.bandwidth_gbps * 1e9 * eff  # bytes per second
    b["DRAM"] = moved / dram
    l1_free = device.l1_bytes_per_sm - resident * launch.shared_bytes
    b["L2"] = sum(_l2_bytes(p, nb, launch.threads, l1_free) for p, nb in launch.pairs()) / (
        device.l2_gbps * 1e9
    )
    b["DRAM latency"] = _latency_s(launch, occ, device, consts, dram)
    rounds = -(-per_sm // occ.blocks_per_sm)
    b["fill latency"] = rounds * max(
        (_fill_chain_s(p, warps, device, clock, consts) for p in launch.parts), default=0.0
    )
    share = dram / min(n, sms)  # one SM's share of the DRAM rate
    b["block phases"] = rounds * max(
        (_phases_s(p, resident, warps, device, issue_eff, share, consts) for p in launch.parts),
        default=0.0,
    )
    us = {k: v * 1e6 for k, v in b.items()}
    bound = max(BOUNDS, key=lambda k: us[k])
    # block phases hold the tensor pipe's time and what cannot overlap it: counted once
    counted = [v for k, v in us.items() if not (k == "tensor pipe" and us["block phases"])]
    busy = _overlap(counted, consts.overlap_p)
    waves = n / (occ.blocks_per_sm * sms)
    notes = [prefixed(note, f"{p.name}: ") for p in launch.parts for note in p.notes]
    if issue_eff < 1:  # a modelled figure, no choice: a plain note
        notes.append(
            f"{per_scheduler:.2g} warps per scheduler: issue at {issue_eff:.0%} "
            f"(latency not hidden below {consts.issue_warps:g})"
        )
    total = consts.launch_us + busy
    return Modelled(total, bound, us, occ, waves, source, consts.launch_us, notes)


def _sm_bounds_s(
    launch: LaunchDesc, occ: Occupancy, device: DeviceSpec, issue_eff: float = 1.0
) -> dict[str, float]:
    """Seconds the busiest SM's issue slots, FP32 and tensor pipes, shared memory and L1 need
    (blocks spread evenly: it runs ``ceil(blocks / SMs)`` of them)."""
    sms, clock = device.sms, device.sustained_clock_mhz * 1e6
    n = launch.grid
    per_sm = -(-n // sms)
    quant = per_sm * sms / n  # the busiest SM's share over the even one
    warps = -(-launch.threads // 32)

    def per_sm_sum(attr) -> float:
        """Per-thread ``attr`` summed over one SM's share of warps (x32 lanes: bytes)."""
        return quant * sum(nb * warps * attr(p.mix) for p, nb in launch.pairs()) / sms

    sram = device.smem_bytes_per_clock * clock
    return {
        "issue": per_sm_sum(lambda m: m.slots) / (device.schedulers_per_sm * issue_eff * clock),
        "FP32 pipe": per_sm_sum(lambda m: m.fp32) / (device.fp32_lanes_per_sm / 32 * clock),
        "tensor pipe": per_sm_sum(lambda m: m.mma) / device.mma_per_second,
        "shared memory": per_sm_sum(lambda m: m.shared_bytes * 32) / sram,
        "L1": per_sm_sum(lambda m: (m.global_bytes + m.l1) * 32) / sram,
    }


def sm_bounds_us(
    mix: Mix, blocks: int, threads: int, occ: Occupancy, device: DeviceSpec
) -> dict[str, float]:
    """Microseconds the busiest SM's issue slots, FP32 pipe, shared memory and L1 need for
    ``blocks`` blocks of ``threads`` threads each executing ``mix`` (every warp issuing each
    clock: the SASS instrument's issue-bound estimate,
    :func:`polyfuse.cuda.toolchain.sass.estimate`)."""
    d = KernelDesc("estimate", "", blocks, threads, 1, 0, mix)
    return {k: v * 1e6 for k, v in _sm_bounds_s(LaunchDesc.single(d), occ, device).items()}


def _fill_chain_s(
    p: KernelDesc, warps: int, device: DeviceSpec, clock: float, consts: CostConstants
) -> float:
    """Seconds one block of ``p`` takes when each of its synchronous fill phases waits a
    load latency and then computes alone: its warps' issue on at most all schedulers, or its
    mma instructions on the SM's tensor cores, whichever is longer."""
    if p.sync_phases <= 0:
        return 0.0
    issue = p.mix.slots / p.sync_phases * warps / min(warps, device.schedulers_per_sm) / clock
    tensor = p.mix.mma / p.sync_phases * warps / device.mma_per_second
    return p.sync_phases * (consts.latency_us * 1e-6 + max(issue, tensor))


def _phases_s(
    p: KernelDesc,
    resident: int,
    warps: int,
    device: DeviceSpec,
    issue_eff: float,
    share: float,
    consts: CostConstants,
) -> float:
    """Seconds one round of ``resident`` blocks of tensor-core kernel ``p`` takes when they
    step through its phases together (see the module doc): the tail as long as its issue or
    the blocks' stores at the SM's ``share`` of the DRAM rate (bytes per second); 0 for a
    kernel without a tail."""
    if p.tail is None or p.mix.mma <= 0:
        return 0.0
    clock = device.sustained_clock_mhz * 1e6
    lanes = resident * warps  # warps on the SM, each running the phase
    issue = device.schedulers_per_sm * issue_eff * clock
    fp32 = device.fp32_lanes_per_sm / 32 * clock
    loop = p.mix + p.tail.scaled(-1)
    # every mma on the tensor pipe in the loop's phase (SASS may leave a few unrolled k-steps
    # outside the loop: their mma too)
    step = max(lanes * loop.slots / issue, lanes * p.mix.mma / device.mma_per_second)
    stores = resident * p.bytes_written / max(1, p.blocks) / share
    tail = max(lanes * p.tail.slots / issue, lanes * p.tail.fp32 / fp32, stores)
    return consts.latency_us * 1e-6 + step + tail


def _overlap(times: list[float], p: float) -> float:
    """The time of resources that overlap imperfectly: the ``p``-norm of their times (the
    largest when ``p`` is infinite; a little more when others come close to it)."""
    top = max(times)
    if top <= 0 or math.isinf(p):
        return top
    return top * sum((t / top) ** p for t in times) ** (1 / p)


def _l2_bytes(p: KernelDesc, blocks: int, threads: int, l1_free: int) -> float:
    """Bytes the SMs fetch from L2 for ``blocks`` blocks of part ``p`` (see the module doc)."""
    if p.block_read_bytes is not None:
        bypass = min(p.block_bypass_bytes, p.block_read_bytes)
        cached = p.block_read_bytes - bypass  # through the L1
        if cached > max(0, l1_free):
            return blocks * p.block_read_bytes
        share = cached / p.block_read_bytes if p.block_read_bytes else 1.0
        return blocks * bypass + share * p.bytes_read * blocks / max(1, p.blocks)
    return blocks * threads * p.mix.global_read_bytes


def _latency_s(
    launch: LaunchDesc, occ: Occupancy, device: DeviceSpec, consts: CostConstants, dram: float
) -> float:
    """Seconds the reads take when only the loads in flight bound them (Little's law)."""
    n, sms = launch.grid, device.sms
    reads = sum(p.bytes_read + p.reread_bytes for p in launch.parts)
    writes = sum(p.bytes_written for p in launch.parts)
    inflight = max((p.inflight_bytes for p in launch.parts), default=0.0)
    if not reads or inflight <= 0:
        return 0.0
    lat = consts.latency_us * 1e-6
    per_block = launch.threads * inflight / lat  # bytes per second one block keeps reading
    if occ.blocks_per_sm == 1 and any(p.barriers for p in launch.parts):
        # one block per SM, its read and write phases apart: rounds one after another
        active = min(n, sms)
        share = dram / active  # one SM's share of the DRAM rate
        rounds = -(-n // sms)
        read = min(share, per_block)
        return rounds * (reads / n / read + writes / n / share)
    resident = min(n, occ.blocks_per_sm * sms)
    return reads / (resident * per_block)


def call_us(launches: list[Modelled], consts: CostConstants = CONSTANTS) -> float:
    """Modelled time of one timed call running ``launches`` one after another."""
    return consts.call_us + sum(m.us for m in launches)


def peak_floor_us(desc: KernelDesc, device: DeviceSpec) -> float:
    """The time the measured peaks alone allow ``desc``: its FLOPs at the measured FP32 rate,
    its mma instructions at every SM's tensor-core rate and its DRAM bytes at the measured
    copy bandwidth (the model never goes below it)."""
    return max(
        1e6 * desc.flops / (device.throughput_tflops * 1e12),
        mma_floor_us(desc, device),
        1e6 * desc.dram_bytes / (device.bandwidth_gbps * 1e9),
    )


def mma_floor_us(desc: KernelDesc, device: DeviceSpec) -> float:
    """The time ``desc``'s ``mma.sync`` instructions take at every SM's tensor-core rate (0
    without tensor cores)."""
    warps = desc.blocks * -(-desc.threads // 32)
    return 1e6 * warps * desc.mix.mma / (device.mma_per_second * device.sms)
