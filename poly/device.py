"""GPU device table used by the cost model: datasheet figures, and measured ones where known.

Datasheet figures are from NVIDIA's V100/A100/H100 datasheets and the CUDA C Programming
Guide's compute-capability tables: SM count, shared memory per block (default and opt-in) and
per SM, registers per SM, maximum threads per block and per SM, DRAM bandwidth and FP32
throughput. A :class:`Measured` record beside them holds what a run on a real GPU of that kind
measured (with its date and source); the cost model uses :attr:`DeviceSpec.bandwidth_gbps` /
:attr:`DeviceSpec.throughput_tflops`, which prefer the measured value, and
:attr:`DeviceSpec.figures` says which one it used.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    launch_us: float = 3.0  # typical kernel launch overhead
    measured: Measured | None = None

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

    def __str__(self) -> str:
        src = "measured" if self.measured else "datasheet"
        return f"{self.name} ({self.arch}, {self.sms} SMs, {self.bandwidth_gbps:.0f} GB/s {src})"


V100 = DeviceSpec(
    "V100-SXM2-16GB", "sm_70", 80, 48 * 1024, 96 * 1024, 96 * 1024, 65536, 1024, 2048, 900.0, 15.7
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
)

BY_ARCH = {"sm_70": V100, "sm_75": V100, "sm_80": A100, "sm_86": A100, "sm_89": A100, "sm_90": H100}


def device_for_arch(arch: str) -> DeviceSpec:
    """The table entry the cost model uses for ``arch`` (the nearest listed device)."""
    return BY_ARCH.get(arch, A100)
