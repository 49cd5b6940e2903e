"""Modelled run time of one generated kernel of a memory-bound graph (never a measurement).

A memory-bound kernel runs at the lower of two rates:

- the device's DRAM bandwidth (measured where a GPU was measured, see
  :mod:`polyfuse.poly.device`) times the efficiency of its accesses: bytes moved by 128-bit
  accesses (``Kernel.vector_bytes``, isl footprints) at the copy bandwidth, the rest at
  :attr:`TimeModel.scalar_efficiency` of it — the H100 run of 2026-11-22
  (../shared/bench/gpu/README.md) measured one-element-per-thread kernels with 4-byte
  accesses at 2.15–2.4 TB/s of the 3.01 TB/s device-to-device copy (bias_gelu_tanh 2.16,
  adam3 2.24 per kernel);
- what its loads in flight can sustain (Little's law): ``resident threads × bytes each thread
  has in flight / latency`` over the SMs its blocks occupy, a thread keeping what it reads
  (its share of the read footprint, at most :attr:`TimeModel.max_inflight` bytes) in flight.

Blocks run in waves of the resident blocks; occupancy comes from threads, registers (when
NVRTC reported them) and shared memory. Figures from this model are labelled "modelled".
"""

from __future__ import annotations

from dataclasses import dataclass

from polyfuse.cuda.kernel_ast import Kernel
from polyfuse.poly.device import DeviceSpec
from polyfuse.poly.policy import ASSUMED_REGISTERS, blocks_per_sm


@dataclass(frozen=True)
class TimeModel:
    """Constants of the kernel time model (one declared place)."""

    latency_us: float = 0.5  # DRAM load latency under load
    scalar_efficiency: float = 0.72  # 4-byte accesses: 2.16 of 3.01 TB/s (H100, 2026-11-22)
    max_inflight: int = 64  # bytes one thread keeps in flight, at most
    default_registers: int = ASSUMED_REGISTERS  # when NVRTC did not report the kernel's


def resident_blocks(k: Kernel, device: DeviceSpec, model: TimeModel) -> int:
    """Blocks of ``k`` one SM holds at once (threads, registers, shared memory)."""
    block = k.block[0]
    smem = k.shared_bytes  # static and dynamic, from the kernel's facts
    regs = k.registers or model.default_registers
    return max(1, blocks_per_sm(block, regs, smem, device))


def kernel_us(k: Kernel, device: DeviceSpec, model: TimeModel | None = None) -> float:
    """Modelled time (µs) of kernel ``k`` on ``device``, launch overhead included."""
    model = model or TimeModel()
    blocks, block = k.grid[0], k.block[0]
    per_sm = resident_blocks(k, device, model)
    resident = min(blocks, per_sm * device.sms)
    waves = -(-blocks // resident)
    threads = blocks * block
    inflight = min(model.max_inflight, k.bytes_read / max(1, threads))
    active_sms = min(device.sms, -(-resident // per_sm))
    per_sm_threads = resident * block / active_sms
    little = active_sms * per_sm_threads * max(inflight, 4.0) / model.latency_us  # bytes/us
    moved = k.bytes_read + k.bytes_written
    vector = min(1.0, k.vector_bytes / moved) if moved else 0.0
    eff = model.scalar_efficiency + (1.0 - model.scalar_efficiency) * vector
    rate = min(device.bandwidth_gbps * 1e3 * eff, little)
    wave_bytes = moved / blocks * resident
    return device.launch_us + waves * wave_bytes / rate
