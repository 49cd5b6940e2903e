"""The ``mma.sync`` ceiling of the GPU at hand: how fast ``mma.sync.m16n8k16`` (bf16 -> f32)
and ``m16n8k8`` (tf32) issue when nothing else runs — registers only, no loads, many
independent accumulators per warp — beside cuBLAS (torch) in the same math.

The tensor-core kernels polyfuse generates use ``mma.sync`` (Hopper's ``wgmma`` is the next
step, docs/hopper.md); this ceiling is what any ``mma.sync`` kernel can at best reach, so it
says how much of a gap to cuBLAS is the loop's and how much the instruction's.

``python benchmarks/mma_ceiling.py [--out FILE]`` on a GPU machine with CuPy (its NVRTC
compiles the kernel) and torch; prints a table and writes JSON (default
``benchmarks/results/mma_ceiling.json``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

KERNEL = r"""
extern "C" __global__ void __launch_bounds__(256) NAME(float* out, int iters) {
  unsigned a[4] = {threadIdx.x, threadIdx.x + 1, threadIdx.x + 2, threadIdx.x + 3};
  unsigned b[2] = {threadIdx.x * 3, threadIdx.x * 5};
  float c[CHAINS][4] = {};
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int j = 0; j < CHAINS; ++j)
      asm volatile(
          "mma.sync.aligned.SHAPE.row.col.f32.TYPE.TYPE.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
          "{%8,%9}, {%0,%1,%2,%3};"
          : "+f"(c[j][0]), "+f"(c[j][1]), "+f"(c[j][2]), "+f"(c[j][3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < CHAINS; ++j) s += c[j][0] + c[j][1] + c[j][2] + c[j][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
"""
#: kernel name -> (mma shape, operand type)
SHAPES = {"mma_bf16": ("m16n8k16", "bf16"), "mma_tf32": ("m16n8k8", "tf32")}
SOURCE = "".join(
    KERNEL.replace("NAME", name).replace("SHAPE", shape).replace("TYPE", kind)
    for name, (shape, kind) in SHAPES.items()
)
#: multiply-adds of one mma per warp
MACS = {"mma_bf16": 16 * 8 * 16, "mma_tf32": 16 * 8 * 8}


def measure(chains: int = 8, iters: int = 4096, blocks_per_sm: int = 4) -> dict:
    """TFLOP/s of each kernel (median of 20 timed launches) and cuBLAS's 8192³ rate."""
    import cupy as cp
    import torch

    sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    mod = cp.RawModule(code=SOURCE.replace("CHAINS", str(chains)), options=("-std=c++17",))
    grid, block = sms * blocks_per_sm, 256
    out = cp.empty(grid * block, cp.float32)
    rows = {}
    for name, macs in MACS.items():
        fn = mod.get_function(name)
        fn((grid,), (block,), (out, cp.int32(iters)))
        cp.cuda.Device().synchronize()
        times = []
        for _ in range(20):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            fn((grid,), (block,), (out, cp.int32(iters)))
            end.record()
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end))
        ms = sorted(times)[len(times) // 2]
        flops = 2.0 * macs * chains * iters * grid * block / 32
        rows[name] = {"ms": ms, "tflops": flops / ms / 1e9}
    n = 8192
    x = torch.randn(n, n, device="cuda")
    y = torch.randn(n, n, device="cuda")
    for label, tf32, dtype in (("cublas_bf16", False, torch.bfloat16), ("cublas_tf32", True, None)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        xa, ya = (x.to(dtype), y.to(dtype)) if dtype else (x, y)
        for _ in range(3):
            xa @ ya
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            xa @ ya
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / 10
        rows[label] = {"ms": ms, "tflops": 2.0 * n**3 / ms / 1e9}
    torch.backends.cuda.matmul.allow_tf32 = False
    return {
        "device": torch.cuda.get_device_name(0),
        "sms": sms,
        "chains": chains,
        "iters": iters,
        "blocks_per_sm": blocks_per_sm,
        "rows": rows,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/mma_ceiling.json"))
    args = p.parse_args()
    report = measure()
    print(f"{report['device']}: mma.sync issued back to back ({report['chains']} chains/warp)")
    print("| kernel | ms | TFLOP/s |\n|---|---|---|")
    for name, r in report["rows"].items():
        print(f"| {name} | {r['ms']:.3f} | {r['tflops']:.0f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
