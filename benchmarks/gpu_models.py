"""``--models``: whole zoo models compiled on the GPU machine (islpy needed there, e.g. a
carried wheel) and run beside their PyTorch twins (same weights), eager and torch.compile."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpu_artifacts import kernel_kind
from gpu_measure import _device_description, _fmt, bench, rel_err

MODELS = ("bert_base", "gpt2_small", "resnet50", "vit_b16")


def _run_model(name: str, size: str, device: Any, peers: Sequence[str]) -> dict[str, Any]:
    """One zoo model: compile, check against float64, time beside its PyTorch twin, and
    split polyfuse's time by kernel class and by kernel, beside the cost model's (per-launch
    CUDA-event times; the rest is gaps)."""
    import torch

    import polyfuse
    from polyfuse.torch.zoo import torch_model

    row: dict[str, Any] = {}
    module, model = torch_model(name, size)
    t0 = time.perf_counter()
    fn = polyfuse.compile(model.inputs, model.outputs, arch=device.arch, constants=model.constants)
    row["compile_s"] = time.perf_counter() - t0
    row["kernels"] = len(fn.kernels)
    xs = [torch.from_numpy(a).cuda() for a in model.sample_inputs()]
    module = module.cuda()
    with torch.no_grad():
        ref = [r.cpu().numpy() for r in module.double()(*[x.double() for x in xs])]
        module = module.float()
        got = fn(*xs, device="cuda")
        got = got if isinstance(got, tuple) else (got,)
        row["rel_err"] = max(rel_err(g.cpu().numpy(), r) for g, r in zip(got, ref, strict=True))
        outs = [torch.empty_like(g) for g in got]
        row["polyfuse_ms"] = bench(lambda: fn(*xs, device="cuda", out=outs))
        eager = [o.cpu().numpy() for o in module(*xs)]
        row["eager_rel_err"] = max(rel_err(e, r) for e, r in zip(eager, ref, strict=True))
        if "eager" in peers:
            row["eager_ms"] = bench(lambda: module(*xs))
        if "inductor" in peers:
            torch._dynamo.reset()
            compiled = torch.compile(module)
            compiled(*xs)
            row["inductor_ms"] = bench(lambda: compiled(*xs))
    prog = fn.device_program("cuda")
    per_launch = prog.time_launches(repeats=5)
    kernels = kernel_table(fn, prog.launches, per_launch, device.arch)
    by_kind: dict[str, float] = {}
    for k in kernels:
        kind = {"stitched": "reductions", "reduction": "reductions"}.get(k["kind"], k["kind"])
        by_kind[kind] = by_kind.get(kind, 0.0) + k["measured_ms"]
    by_kind["launch gaps"] = max(0.0, row["polyfuse_ms"] - sum(per_launch))
    row["breakdown_ms"] = by_kind
    row["kernels_ms"] = kernels
    return row


def kernel_table(
    fn: Any, launches: Sequence[Any], per_launch: Sequence[float], arch: str
) -> list[dict[str, Any]]:
    """Per kernel of ``fn``: its kind, launches, their measured milliseconds (``per_launch``,
    one per launch of ``launches``) and the cost model's for them (MODELLED, from the kernel
    IR's work estimate: the GPU machine has no disassembler), costliest measured first — what
    a model's measured / modelled gap is made of."""
    from polyfuse.cuda.codegen.kernel_cost import describe_kernel
    from polyfuse.poly.costs import model_kernel
    from polyfuse.poly.device import device_for_arch

    dev = device_for_arch(arch)
    by_name = {k.name: k for k in fn.kernels}
    rows: dict[str, dict[str, Any]] = {}
    for launch, ms in zip(launches, per_launch, strict=True):
        r = rows.get(launch.kernel)
        if r is None:
            k = by_name[launch.kernel]
            r = rows[launch.kernel] = {
                "kernel": k.name,
                "kind": kernel_kind(fn, k),
                "grid": k.grid[0] * k.grid[1] * k.grid[2],
                "block": k.block[0] * k.block[1] * k.block[2],
                "launches": 0,
                "measured_ms": 0.0,
                "modelled_ms": 0.0,
                "_us": model_kernel(describe_kernel(k), dev).us,
            }
        r["launches"] += 1
        r["measured_ms"] += ms
        r["modelled_ms"] += r["_us"] / 1e3
    for r in rows.values():
        del r["_us"]
    return sorted(rows.values(), key=lambda r: -r["measured_ms"])


def print_kernel_table(rows: Sequence[dict[str, Any]], top: int = 6) -> None:
    """Each model's costliest kernels, measured beside MODELLED."""
    print("| model | kernel | kind | grid x block | launches | measured ms | modelled ms "
          "| measured / modelled |")  # fmt: skip
    print("|---" * 8 + "|")
    for r in rows:
        for k in r.get("kernels_ms", [])[:top]:
            ratio = k["measured_ms"] / k["modelled_ms"] if k["modelled_ms"] else None
            print(
                f"| {r['model']} | {k['kernel']} | {k['kind']} | {k['grid']} x {k['block']} | "
                f"{k['launches']} | {_fmt(k['measured_ms'], 3)} | {_fmt(k['modelled_ms'], 3)} | "
                f"{_fmt(ratio, 2)} |"
            )


def run_models(size: str, out: Path, names: Sequence[str], peers: Sequence[str]) -> None:
    """Compile and run the zoo models on the GPU beside their PyTorch twins (same weights)."""
    import torch

    from polyfuse.cuda.runtime import open_device

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = open_device(0)
    print(f"device: {device}", flush=True)
    rows = []
    for name in names:
        row: dict[str, Any] = {"model": name, "size": size}
        try:
            row.update(_run_model(name, size, device, peers))
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
    print(
        "| model | kernels | polyfuse ms | eager | inductor | polyfuse / best | rel_err | "
        "GEMM-like | reductions | elementwise | launch gaps |"
    )
    print("|---" * 11 + "|")
    for r in rows:
        best = min([r[k] for k in ("eager_ms", "inductor_ms") if r.get(k)] or [math.nan])
        b = r.get("breakdown_ms", {})
        p = r.get("polyfuse_ms")
        print(
            f"| {r['model']} | {r.get('kernels', '-')} | {_fmt(p, 2)} | "
            f"{_fmt(r.get('eager_ms'), 2)} | {_fmt(r.get('inductor_ms'), 2)} | "
            f"{_fmt(p / best if p else None, 2)} | "
            f"{r.get('rel_err', math.inf):.1e} | {_fmt(b.get('gemm'), 2)} | "
            f"{_fmt(b.get('reductions'), 2)} | {_fmt(b.get('elementwise'), 2)} | "
            f"{_fmt(b.get('launch gaps'), 2)} |"
        )
        if "error" in r:
            print(f"    error: {r['error']}")
    print_kernel_table(rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"device": _device_description(), "models": rows}, indent=1, default=str)
    )
    print(f"wrote {out}")
