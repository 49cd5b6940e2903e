"""GPU device table used by the cost model (published specifications, no measurements).

Figures are from NVIDIA's V100/A100/H100 datasheets and the CUDA C Programming Guide's
compute-capability tables: SM count, shared memory per block (default and opt-in) and per SM,
registers per SM, maximum threads per block and per SM, DRAM bandwidth and FP32 throughput.
"""

from __future__ import annotations

from dataclasses import dataclass


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

    def __str__(self) -> str:
        return f"{self.name} ({self.arch}, {self.sms} SMs, {self.dram_gbps:.0f} GB/s)"


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
)

BY_ARCH = {"sm_70": V100, "sm_75": V100, "sm_80": A100, "sm_86": A100, "sm_89": A100, "sm_90": H100}


def device_for_arch(arch: str) -> DeviceSpec:
    """The table entry the cost model uses for ``arch`` (the nearest listed device)."""
    return BY_ARCH.get(arch, A100)
