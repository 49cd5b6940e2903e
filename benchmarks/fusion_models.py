"""Whole-model fusion counts: launches, functions, layout-only kernels and global bytes of the
zoo models, beside torch.compile's (Inductor's) kernel counts for the same models.

Usage (``python benchmarks/fusion.py --models ...`` runs this too)::

    python benchmarks/fusion_models.py [--models NAMES] [--size full|tiny] [--no-inductor]
                                       [--json PATH] [--arch sm_80]

Per :mod:`polyfuse.zoo` model (all of them by default), compiled with ``polyfuse.compile``
(no disk cache, no CUDA check):

* **launches**: kernels launched per call (``fn.launches``); **functions**: distinct
  ``__global__`` functions after dedup (identical kernels share one, ``Kernel.function``).
* **layout-only**: launches whose every statement only moves data: its primitive's expression
  is a tensor read with no arithmetic (``x[f(i)]``: reshape, transpose, expand, slice), or an
  index-only ``where`` choosing between such reads (concat). Decided from the expressions of
  the primitives the kernel runs, never from op names. **layout parts**: the same test on the
  kernels before Layer 3 packed independent ones into one launch (a pack may run a layout part
  beside a GEMM).
* **global bytes**: the exact isl footprints of every kernel (``fn.global_bytes()``), split per
  tensor (``Kernel.tensor_bytes``) into **compulsory** — each graph input, weight and output
  once: the distinct bytes of it the kernels move, at most its size — and **intermediate**:
  everything else (tensors between kernels, written and read back, and the re-reads of inputs
  and weights by further kernels). ``compulsory + intermediate == global`` is checked.

Inductor: the zoo model as a PyTorch module (:func:`polyfuse.torch.zoo.torch_model`, same
definition and weights) through ``torch.compile`` (default options, ``no_grad``, FX graph cache
off) and run once on the CPU, where Inductor emits C++ kernels and calls libraries (mm, bmm,
convolution) for the rest. Counted from the generated wrapper code: **launches** = calls of
generated C++ kernels + library calls in ``call()``; **C++ kernels** = distinct generated
kernel definitions; ``torch._inductor.metrics.generated_kernel_count`` is kept in the JSON.
These are *CPU* figures (the table says "Inductor (CPU)"): a GPU build emits Triton kernels.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_JSON = HERE / "results" / "fusion_models.json"
MIB = 1 << 20


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- layout-only


def moves_data_only(e: Any) -> bool:
    """True when expression ``e`` only moves data: a tensor read (any affine, div/mod
    subscripts), or an index-only ``where`` choosing between such expressions (concat).
    A constant, a cast or any arithmetic on the values makes it a computation."""
    from polyfuse.graph.expr import Read, Select, walk

    if isinstance(e, Read):
        return True
    if isinstance(e, Select):
        index_only = not any(isinstance(n, Read) for n in walk(e.cond))
        return index_only and moves_data_only(e.a) and moves_data_only(e.b)
    return False


def kernel_prims(fn: Any) -> list[list[str]]:
    """Per kernel, the primitives it runs: those of its micrographs and the ones it recomputes
    instead of reading them back (its plan's recompute decisions)."""
    mgs = {m.name: m for m in fn.plan.micrographs}
    prims = fn.plan.graph.prims
    out = []
    for k, kp in zip(fn.kernels, fn.plan.kernel_plans, strict=True):
        names = [p for m in k.micrographs for p in mgs[m].prims]
        names += [d.data["tensor"] for d in kp.recomputes if d.data.get("tensor") in prims]
        out.append(names)
    return out


def prims_move_data_only(fn: Any, names: list[str]) -> bool:
    """True when every primitive in ``names`` only moves data (:func:`moves_data_only`)."""
    prims = fn.plan.graph.prims
    return bool(names) and all(
        prims[p].tensor.op is not None and moves_data_only(prims[p].tensor.op.body) for p in names
    )


def layout_kernels(fn: Any) -> tuple[list[str], list[str]]:
    """(launched kernels that only move data, kernels before Layer 3 packing that only move
    data — a pack's parts named ``pack/part``)."""
    mgs = {m.name: m for m in fn.plan.micrographs}
    packs = {d.name: d for d in fn.plan.packs if d.packed}
    whole, parts = [], []
    for k, names in zip(fn.kernels, kernel_prims(fn), strict=True):
        if prims_move_data_only(fn, names):
            whole.append(k.name)
        d = packs.get(k.name)
        if d is None:
            parts += [k.name] if prims_move_data_only(fn, names) else []
            continue
        for part, part_mgs in zip(d.kernels, d.micrographs, strict=True):
            if prims_move_data_only(fn, [p for m in part_mgs for p in mgs[m].prims]):
                parts.append(f"{k.name}/{part}")
    return whole, parts


# --------------------------------------------------------------------------- bytes


def byte_split(fn: Any) -> dict[str, int]:
    """The isl global bytes of ``fn`` split into compulsory and intermediate (module doc).

    Compulsory: per graph input, weight and output, the distinct bytes of it the kernels move
    (summed over kernels, at most its size): each counted once. Intermediate: all other bytes
    of ``Kernel.tensor_bytes`` — tensors between kernels, plus re-reads of boundary tensors.
    """
    size = {b.name: 4 * _prod(b.shape) for b in fn.buffers if b.role in ("input", "output")}
    moved: dict[str, int] = {}  # boundary tensor -> bytes of it all kernels move
    between = 0
    for k in fn.kernels:
        for t, (r, w) in k.tensor_bytes.items():
            if t in size:
                moved[t] = moved.get(t, 0) + r + w
            else:
                between += r + w
    compulsory = sum(min(size[t], n) for t, n in moved.items())
    rereads = sum(moved.values()) - compulsory
    return {
        "global": fn.global_bytes(),
        "compulsory": compulsory,
        "intermediate": between + rereads,
        "intermediate_tensors": between,
        "boundary_rereads": rereads,
        "boundary_sizes": fn.compulsory_bytes(),  # every boundary tensor's full size, once
    }


def _prod(shape: Any) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# --------------------------------------------------------------------------- measurements


def measure_polyfuse(name: str, size: str, arch: str) -> dict[str, Any]:
    """Compile zoo model ``name`` (shapes only, no disk cache, no CUDA check) and count."""
    import polyfuse
    from polyfuse import zoo

    m = zoo.build(name, size, weights="zeros")
    t0 = time.perf_counter()
    fn = polyfuse.compile(
        m.inputs, m.outputs, arch=arch, constants=m.constants, check_cuda=False, name=name
    )
    seconds = time.perf_counter() - t0
    whole, parts = layout_kernels(fn)
    split = byte_split(fn)
    layout_bytes = sum(k.bytes_read + k.bytes_written for k in fn.kernels if k.name in whole)
    return {
        "launches": len(fn.launches),
        "kernels": len(fn.kernels),
        "functions": len({k.function or k.name for k in fn.kernels}),
        "layout_only": len(whole),
        "layout_only_kernels": whole,
        "layout_parts": len(parts),
        "layout_part_kernels": parts,
        "layout_only_bytes": layout_bytes,
        "bytes": split,
        "bytes_consistent": split["compulsory"] + split["intermediate"] == split["global"],
        "primitives": len(fn.plan.graph.prims),
        "micrographs": len(fn.plan.micrographs),
        "compile_s": seconds,
    }


_KERNEL_DEF = re.compile(r"^(\w+) = async_compile\.cpp\w*\(", re.M)
_CALL = re.compile(r"^\s+(?:\w+ = )?([A-Za-z_][\w.]*)\(", re.M)
_LIBRARY = ("extern_kernels.", "torch.ops.", "aten.")


def count_wrapper(code: str) -> dict[str, int]:
    """Kernels in one Inductor output module: C++ kernel definitions, and in ``call()`` the
    calls of those kernels and of libraries (extern kernels, aten/torch ops)."""
    defs = set(_KERNEL_DEF.findall(code))
    at = code.find("def call(")
    body = code[at:] if at >= 0 else ""
    calls = _CALL.findall(body)
    return {
        "cpp_kernels": len(defs),
        "cpp_launches": sum(c in defs for c in calls),
        "library_launches": sum(c.startswith(_LIBRARY) for c in calls),
    }


def torch_available() -> str | None:
    """None when torch imports, else why the Inductor columns are empty."""
    try:
        import torch  # noqa: F401
    except ImportError as e:
        return f"torch is not installed ({e})"
    return None


def measure_inductor(name: str, size: str) -> dict[str, Any]:
    """torch.compile (Inductor) of the zoo model as a PyTorch module, run once on the CPU;
    its kernels counted from the generated code (:func:`count_wrapper`)."""
    import torch
    from torch._inductor import config, metrics
    from torch._inductor.utils import run_and_get_code

    from polyfuse.torch.zoo import torch_model

    module, model = torch_model(name, size)
    xs = [torch.from_numpy(a) for a in model.sample_inputs()]
    torch._dynamo.reset()
    metrics.reset()
    t0 = time.perf_counter()
    with torch.no_grad(), config.patch(fx_graph_cache=False):
        _, codes = run_and_get_code(torch.compile(module), *xs)
    seconds = time.perf_counter() - t0
    counts = [count_wrapper(c) for c in codes]
    total = {
        k: sum(c[k] for c in counts) for k in ("cpp_kernels", "cpp_launches", "library_launches")
    }
    return {
        **total,
        "launches": total["cpp_launches"] + total["library_launches"],
        "graphs": len(codes),
        "generated_kernel_count": metrics.generated_kernel_count,
        "compile_and_run_s": seconds,
        "torch": torch.__version__,
        "device": "cpu",
    }


# --------------------------------------------------------------------------- printing


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / MIB:,.1f}"


def render(results: dict[str, Any], meta: dict[str, Any]) -> str:
    """The table of every model (ours beside Inductor's on the CPU) with its notes."""
    from fusion import _table

    out = [
        f"polyfuse whole-model fusion, zoo size {meta['size']}, arch {meta['arch']} "
        "(no GPU: counts and isl bytes only)",
        "global = exact isl footprints of every kernel; compulsory = graph inputs, weights and "
        "outputs each once; intermediate = the rest. MiB = 2^20 B.",
        "layout = launches that only move data (parts: before Layer 3 packing). Inductor (CPU): "
        "launches = C++ kernel calls + library calls (mm, bmm, conv) of the generated code; "
        "cpp = distinct C++ kernels.",
    ]
    if meta.get("inductor_skipped"):
        out.append(f"Inductor: not measured ({meta['inductor_skipped']}).")
    out.append("")
    header = [
        "model",
        "launches",
        "functions",
        "layout",
        "layout parts",
        "global MiB",
        "compulsory",
        "intermediate",
        "Inductor (CPU) launches",
        "cpp",
        "compile s",
    ]
    rows = []
    for name, r in results.items():
        p, ind = r.get("polyfuse"), r.get("inductor") or {}
        if p is None:
            rows.append([name, "FAILED: " + r["error"][:60]] + ["-"] * (len(header) - 2))
            continue
        b = p["bytes"]
        rows.append(
            [
                name,
                str(p["launches"]),
                str(p["functions"]),
                str(p["layout_only"]),
                str(p["layout_parts"]),
                _mib(b["global"]),
                _mib(b["compulsory"]),
                _mib(b["intermediate"]),
                str(ind["launches"]) if "launches" in ind else ("error" if ind else "-"),
                str(ind.get("cpp_kernels", "-")),
                f"{p['compile_s']:.1f}",
            ]
        )
    out += _table(header, rows, right=set(range(1, len(header))))
    notes = []
    for name, r in results.items():
        p, ind = r.get("polyfuse"), r.get("inductor") or {}
        if p and not p["bytes_consistent"]:
            notes.append(f"{name}: compulsory + intermediate != global ({p['bytes']})")
        if ind.get("error"):
            notes.append(f"{name}: Inductor failed: {ind['error']}")
    if notes:
        out += ["", "Notes:", *[f"  - {n}" for n in notes]]
    return "\n".join(out)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from polyfuse.zoo import MODELS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--models",
        nargs="*",
        metavar="NAME",
        help="zoo models (space- or comma-separated); none or omitted: all of " + ", ".join(MODELS),
    )
    ap.add_argument("--size", choices=("full", "tiny"), default="full")
    ap.add_argument("--no-inductor", action="store_true", help="skip torch.compile's counts")
    ap.add_argument(
        "--json",
        type=Path,
        default=DEFAULT_JSON,
        metavar="PATH",
        help=f"where to write the results (default {DEFAULT_JSON.relative_to(REPO)})",
    )
    ap.add_argument("--arch", default="sm_80", help="target architecture (default sm_80)")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    names = [n for item in args.models or [] for n in item.split(",") if n] or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"unknown zoo model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    args.names = names
    return args


def main(argv: list[str] | None = None) -> int:
    """Measure every model, print the table, write the JSON; exit 1 when a model failed."""
    from tqdm import tqdm

    import polyfuse

    args = parse_args(argv)
    skipped = "--no-inductor" if args.no_inductor else torch_available()
    if skipped and not args.no_inductor:
        log(f"Inductor columns empty: {skipped}")
    meta = {
        "size": args.size,
        "arch": args.arch,
        "inductor_skipped": skipped,
        "polyfuse_version": polyfuse.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "bytes": "exact isl footprints (Kernel.tensor_bytes), split per tensor",
        "inductor": "torch.compile defaults, no_grad, CPU; counted from the generated code",
    }
    results: dict[str, Any] = {}
    failed = False
    bar = tqdm(args.names, unit="model", disable=args.quiet, file=sys.stderr)
    for name in bar:
        r: dict[str, Any] = {}
        results[name] = r
        bar.set_postfix_str(f"{name}: polyfuse")
        try:
            r["polyfuse"] = measure_polyfuse(name, args.size, args.arch)
        except Exception as e:  # noqa: BLE001 - report and go on with the next model
            r["polyfuse"], r["error"] = None, f"{type(e).__name__}: {e}"
            r["traceback"] = traceback.format_exc()
            failed = True
        failed |= bool(r["polyfuse"]) and not r["polyfuse"]["bytes_consistent"]
        if skipped:
            continue
        bar.set_postfix_str(f"{name}: Inductor")
        try:
            r["inductor"] = measure_inductor(name, args.size)
        except Exception as e:  # noqa: BLE001
            r["inductor"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    bar.close()
    print(render(results, meta))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"meta": meta, "models": results}, indent=1) + "\n")
    log(f"wrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
