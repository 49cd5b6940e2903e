"""GPU device table used by the cost model: datasheet figures, and measured ones where known.

Datasheet figures are from NVIDIA's V100/A100/H100 datasheets and the CUDA C Programming
Guide's compute-capability tables: SM count, shared memory per block (default and opt-in) and
per SM, registers per SM, maximum threads per block and per SM, DRAM bandwidth and FP32
throughput. A :class:`Measured` record beside them holds what a run on a real GPU of that kind
measured (with its date and source); the cost model uses :attr:`DeviceSpec.bandwidth_gbps` /
:attr:`DeviceSpec.throughput_tflops`, which prefer the measured value, and
:attr:`DeviceSpec.figures` says which one it used.

Memory-hierarchy figures for the cost model (:mod:`polyfuse.poly.costs`): the L1 / shared SRAM
per SM (datasheets) and the L2 -> SM bandwidth (:attr:`DeviceSpec.l2_gbps`: the whitepapers'
bytes per clock at the boost clock for V100/A100; fitted on the measured H100 day for H100).

Issue figures (the SASS instrument's issue-bound estimate, :mod:`polyfuse.cuda.toolchain.sass`):
every
SM of sm_70..sm_90 has four schedulers issuing one warp instruction per clock each
(Volta/Ampere/Hopper whitepapers); FP32 lanes per SM (64 on V100/A100, 128 on H100: one warp
FFMA per clock per scheduler on H100, one per two clocks before); shared memory moves 128 bytes
per clock per SM. The clock is the datasheet boost clock, or, where a GPU was measured, the
clock at which the measured cuBLAS SGEMM rate is issue-bound with an FFMA share of
:data:`SGEMM_FFMA_SHARE` (:attr:`DeviceSpec.sustained_clock_mhz`). :func:`occupancy` is the CUDA
occupancy calculator's arithmetic (``cuda_occupancy.h``): registers allocated per warp in
units of 256 within four sub-partitions, shared memory per block rounded up to 128 bytes plus
the 1 KB the driver reserves per block (sm_80 and later), warps and blocks per SM.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Assumed FFMA share of cuBLAS's FP32 SGEMM hot loop (85-90 % for a cuBLAS-class loop; issue
#: 20): with the measured SGEMM rate it gives the clock an issue-bound loop runs at.
SGEMM_FFMA_SHARE = 0.88


@dataclass(frozen=True)
class Measured:
    """Figures measured on a real GPU of a table entry's kind (not datasheet values)."""

    dram_gbps: float  # device-to-device copy, bytes read + written per second / 1e9
    fp32_tflops: float  # cuBLAS FP32 SGEMM 8192^3, TF32 off
    date: str
    source: str


@dataclass(frozen=True)
class DeviceSpec:
    """What the cost model needs to know about a GPU."""

    name: str
    arch: str
    sms: int
    smem_per_block: int  # bytes, without opting in
    smem_per_block_optin: int  # bytes, with cudaFuncAttributeMaxDynamicSharedMemorySize
    smem_per_sm: int
    regs_per_sm: int
    max_threads_per_block: int
    max_threads_per_sm: int
    dram_gbps: float  # GB/s
    fp32_tflops: float
    measured: Measured | None = None
    boost_clock_mhz: float = 1410.0  # datasheet boost clock
    fp32_lanes_per_sm: int = 64  # FP32 FMA lanes per SM (whitepaper)
    schedulers_per_sm: int = 4  # warp schedulers, one warp instruction per clock each
    max_blocks_per_sm: int = 32  # resident blocks per SM (compute-capability table)
    max_regs_per_thread: int = 255
    regs_per_block: int = 65536
    reg_alloc_unit: int = 256  # registers are allocated per warp in units of this
    smem_alloc_unit: int = 128  # bytes: shared memory is allocated per block in units of this
    smem_reserved_per_block: int = 1024  # bytes the driver reserves per block (sm_80+)
    smem_bytes_per_clock: int = 128  # shared-memory bandwidth per SM (32 banks x 4 B)
    l1_bytes_per_sm: int = 192 * 1024  # L1 + shared memory SRAM per SM (datasheet)
    #: L2 -> SM bandwidth (GB/s) the cost model uses; see each table entry for its source
    l2_gbps: float = 7219.0
    #: dense 16-bit ``mma.sync`` TFLOP/s of the whole device, the tensor pipe's ceiling (tf32's
    #: m16n8k8 and int8's m16n8k32 take as long per instruction as m16n8k16): the A100
    #: datasheet's 312; see the H100 entry for its measured figure
    mma_tflops: float = 312.0

    @property
    def mma_per_second(self) -> float:
        """Warp ``mma.sync`` instructions (:data:`MMA_FMA_PER_INSTRUCTION` multiply-adds each)
        one SM's tensor cores retire per second, at :attr:`mma_tflops`."""
        return self.mma_tflops * 1e12 / (2 * MMA_FMA_PER_INSTRUCTION) / self.sms

    @property
    def bandwidth_gbps(self) -> float:
        """DRAM bandwidth the cost model uses: measured where a GPU was measured."""
        return self.measured.dram_gbps if self.measured else self.dram_gbps

    @property
    def throughput_tflops(self) -> float:
        """FP32 throughput the cost model uses: measured where a GPU was measured."""
        return self.measured.fp32_tflops if self.measured else self.fp32_tflops

    @property
    def figures(self) -> str:
        """Which figures the cost model uses, for plans and benchmark tables."""
        if self.measured is None:
            return f"datasheet ({self.dram_gbps:.0f} GB/s, {self.fp32_tflops} TFLOP/s)"
        m = self.measured
        return (
            f"measured {m.date} ({m.dram_gbps:.0f} GB/s copy, {m.fp32_tflops} TFLOP/s cuBLAS "
            f"FP32; {m.source}); datasheet {self.dram_gbps:.0f} GB/s, {self.fp32_tflops} TFLOP/s"
        )

    @property
    def max_warps_per_sm(self) -> int:
        return self.max_threads_per_sm // 32

    @property
    def sustained_clock_mhz(self) -> float:
        """The clock the issue-bound estimate uses: where a GPU was measured, the clock at which
        its measured SGEMM rate is what a loop of :data:`SGEMM_FFMA_SHARE` FFMA issues (bounded
        by the FP32 lanes); the datasheet boost clock otherwise."""
        if self.measured is None:
            return self.boost_clock_mhz
        ffma_per_clock = min(
            SGEMM_FFMA_SHARE * self.schedulers_per_sm, self.fp32_lanes_per_sm / 32
        )  # warp FFMA per clock per SM
        flops_per_clock = self.sms * ffma_per_clock * 32 * 2
        return self.measured.fp32_tflops * 1e6 / flops_per_clock

    @property
    def issue_per_second(self) -> float:
        """Warp instructions one SM issues per second (all schedulers, sustained clock)."""
        return self.schedulers_per_sm * self.sustained_clock_mhz * 1e6

    @property
    def ffma_per_second(self) -> float:
        """Warp FP32 instructions (FFMA/FMUL/FADD) one SM's FP32 lanes retire per second."""
        return self.fp32_lanes_per_sm / 32 * self.sustained_clock_mhz * 1e6

    @property
    def issue_figures(self) -> str:
        """Where the clock of the issue-bound estimate comes from, for printed assumptions."""
        clock = self.sustained_clock_mhz
        if self.measured is None:
            return f"datasheet boost clock {clock:.0f} MHz"
        return (
            f"{clock:.0f} MHz sustained: measured cuBLAS SGEMM {self.measured.fp32_tflops} "
            f"TFLOP/s ({self.measured.date}) issued at an assumed {SGEMM_FFMA_SHARE:.0%} FFMA "
            f"share (datasheet boost {self.boost_clock_mhz:.0f} MHz)"
        )

    def __str__(self) -> str:
        src = "measured" if self.measured else "datasheet"
        return f"{self.name} ({self.arch}, {self.sms} SMs, {self.bandwidth_gbps:.0f} GB/s {src})"


V100 = DeviceSpec(
    "V100-SXM2-16GB",
    "sm_70",
    80,
    48 * 1024,
    96 * 1024,
    96 * 1024,
    65536,
    1024,
    2048,
    900.0,
    15.7,
    boost_clock_mhz=1530.0,  # datasheet
    smem_alloc_unit=256,  # sm_70 (occupancy calculator)
    smem_reserved_per_block=0,
    l1_bytes_per_sm=128 * 1024,  # datasheet
    l2_gbps=3133.0,  # whitepaper: 2048 B/clock x 1.53 GHz
)
A100 = DeviceSpec(
    "A100-SXM4-40GB",
    "sm_80",
    108,
    48 * 1024,
    163 * 1024,
    164 * 1024,
    65536,
    1024,
    2048,
    1555.0,
    19.5,
    boost_clock_mhz=1410.0,  # datasheet (108 SMs x 64 lanes x 2 x 1.41 GHz = 19.5 TFLOP/s)
    l1_bytes_per_sm=192 * 1024,  # datasheet
    l2_gbps=7219.0,  # whitepaper: 5120 B/clock x 1.41 GHz
)
H100 = DeviceSpec(
    "H100-SXM5-80GB",
    "sm_90",
    132,
    48 * 1024,
    227 * 1024,
    228 * 1024,
    65536,
    1024,
    2048,
    3350.0,
    67.0,
    measured=Measured(
        3010.0,
        51.7,
        "2026-11-22",
        "shared/bench/gpu/h100-2026-11-22.json: H100 80GB HBM3, device-to-device copy and "
        "cuBLAS FP32 8192^3 in the same run",
    ),
    boost_clock_mhz=1980.0,  # datasheet (132 SMs x 128 lanes x 2 x 1.98 GHz = 67 TFLOP/s)
    fp32_lanes_per_sm=128,
    l1_bytes_per_sm=256 * 1024,  # datasheet
    # fitted on the H100 day of 2026-11-22 (poly/costs/constants.py): matmul 4096^3 and FFN
    # up with one output per thread stream each block's weight columns from L2 at 8.75 TB/s
    l2_gbps=8750.0,
    # measured (benchmarks/mma_ceiling.py, 2026-11-26, measured/h100-2026-11-26-mma-ceiling
    # .json): independent mma.sync.m16n8k16 bf16 chains on every SM, 641 TFLOP/s (cuBLAS's
    # wgmma 785 in the same run; the datasheet's 989 are wgmma's at boost)
    mma_tflops=289.0,
)

#: multiply-adds of one warp ``mma.sync.m16n8k16`` (16 x 8 x 16)
MMA_FMA_PER_INSTRUCTION = 2048

BY_ARCH = {"sm_70": V100, "sm_75": V100, "sm_80": A100, "sm_86": A100, "sm_89": A100, "sm_90": H100}


def device_for_arch(arch: str) -> DeviceSpec:
    """The table entry the cost model uses for ``arch`` (the nearest listed device)."""
    return BY_ARCH.get(arch, A100)


@dataclass(frozen=True)
class Occupancy:
    """Resident blocks per SM of one kernel and what limits them.

    ``limits`` holds the blocks per SM each resource alone allows (``registers``, ``shared
    memory``, ``threads`` (warps), ``block limit``); ``limiter`` names the smallest (several
    joined by ``=`` when they tie). ``blocks_per_sm`` is 0 when one block does not fit.
    """

    blocks_per_sm: int
    limiter: str
    warps_per_sm: int
    max_warps_per_sm: int
    limits: dict[str, int]

    @property
    def fraction(self) -> float:
        """Resident warps over the SM's maximum."""
        return self.warps_per_sm / self.max_warps_per_sm

    def __str__(self) -> str:
        return (
            f"{self.blocks_per_sm} blocks/SM ({self.warps_per_sm}/{self.max_warps_per_sm} warps, "
            f"limit: {self.limiter})"
        )


def occupancy(device: DeviceSpec, threads: int, registers: int, smem: int) -> Occupancy:
    """Blocks of ``threads`` threads, ``registers`` per thread and ``smem`` bytes of shared
    memory (static + dynamic) that one SM of ``device`` holds (the occupancy calculator's
    arithmetic; see the module doc)."""
    warps = -(-threads // 32)
    limits: dict[str, int] = {}
    reg_warp = -(-max(1, registers) * 32 // device.reg_alloc_unit) * device.reg_alloc_unit
    if registers > device.max_regs_per_thread or registers * 32 * warps > device.regs_per_block:
        limits["registers"] = 0
    else:
        partitions = device.schedulers_per_sm
        per_partition = device.regs_per_sm // partitions // reg_warp
        limits["registers"] = per_partition * partitions // warps
    need = smem + device.smem_reserved_per_block  # the reserve is taken even without smem
    if need:
        need = -(-need // device.smem_alloc_unit) * device.smem_alloc_unit
        limits["shared memory"] = device.smem_per_sm // need
    fits = threads <= device.max_threads_per_block
    limits["threads"] = device.max_warps_per_sm // warps if fits else 0
    limits["block limit"] = device.max_blocks_per_sm
    blocks = max(0, min(limits.values()))
    limiter = "=".join(k for k, v in limits.items() if v == blocks)
    return Occupancy(blocks, limiter, blocks * warps, device.max_warps_per_sm, limits)
