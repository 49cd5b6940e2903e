"""polyfuse's generated kernels on a real GPU, beside PyTorch eager, torch.compile and JAX.

Compile here, run there: the lent GPU machines have torch, CuPy, JAX and NVIDIA's
cuda-bindings but no islpy (the compiler) and no network. So the benchmark has two halves:

``python benchmarks/gpu.py --prepare DIR [--arch sm_90] [--cases ...] [--scale N]``
    (any machine with polyfuse) compiles every case — the 12 suite subgraphs of
    ``benchmarks/suite.py`` and the compute cases of ``../shared/bench/gpu/README.md`` — and
    saves each as a polyfuse artifact ``DIR/<case>.pfa`` (``fn.save``: the CUDA source, the
    cubin for ``--arch`` (NVRTC), the launches, the buffer specs, ptxas resources, checksums),
    with the benchmark's own facts — FLOP and byte counts, kernel kinds, the inputs drawn
    positive — in the artifact's metadata. Inputs are not stored (full-size inputs are hundreds
    of MB): they are drawn on the GPU machine from a seed. ``DIR`` stays small (a few hundred
    KB) so it can be carried to the GPU machine.
``python benchmarks/gpu.py --run DIR [--out FILE]``
    (the GPU machine) imports only numpy, cuda-bindings (``polyfuse.load`` and polyfuse's
    runtime, :mod:`polyfuse.cuda.runtime`, which need neither islpy nor the rest of the
    compiler), torch, and JAX/triton when present. It measures the two ceilings
    (device-to-device copy bandwidth, cuBLAS FP32 rate with TF32 off), then per case: loads
    its artifact (``polyfuse.load``), draws the inputs, computes the float64 reference (the
    peer's computation in torch float64), runs polyfuse's kernels through the runtime on torch
    tensors (no copies; CUDA graph replay), checks the relative L2 error and that a second
    run is bit-identical, and times polyfuse, torch eager, torch.compile (Inductor) and JAX
    (XLA) on the same float32 inputs. Prints a table and writes JSON (default
    ``benchmarks/results/gpu.json``).
``python benchmarks/gpu.py --overhead DIR``
    (GPU machine) the per-call host overhead of the runtime on a 4-kernel graph (the
    attention example), with and without CUDA graphs, for numpy and torch arguments.
``python benchmarks/gpu.py --prepare-all DIR`` (here), then ``... --all DIR`` (the GPU machine)
    the whole GPU day in two commands (:mod:`gpu_day`): the cases, a polyfuse wheel and an
    islpy wheel prepared here; ``--run``, ``--overhead``, ``tests/test_gpu.py`` and
    ``--models`` run there under one time budget, one JSON and one table out.
``python benchmarks/gpu.py --tune [--top N]``
    (GPU machine with islpy) the cost model's top GEMM tilings of the compute cases, timed
    (:mod:`gpu_tune`): measured beside modelled µs per candidate.
``python benchmarks/gpu.py --models [--size full|tiny] [--out FILE]``
    (GPU machine *with islpy*, e.g. a carried wheel) compiles BERT-base, GPT-2 small,
    ResNet-50 and ViT-B/16 from ``polyfuse.zoo`` for the GPU's arch and runs them beside the
    same definitions in PyTorch (:mod:`polyfuse.torch.zoo`, same weights) eager and under
    torch.compile: relative error against float64, median ms, and where polyfuse's time goes
    by kernel class (GEMM-like / reductions / elementwise+layout / launch gaps).

Timing: ``triton.testing.do_bench`` (median, L2 flushed before each repetition) where triton
exists, else CUDA events around each repetition after a 256 MB L2 flush, median of the
repetitions; JAX by host clock around repeated calls with ``block_until_ready`` (its own
stream; L2 not flushed). TF32 off everywhere. ``floor_ms = max(compulsory bytes / measured
copy bandwidth, FLOPs / measured cuBLAS FP32 rate)``; ``launch_ms``: a CUDA graph of one
1-element kernel timed the same way (what every launch costs as timed; the table gives
polyfuse / (floor + launch) beside polyfuse / floor).

Tested without a GPU (tests/test_gpu_benchmark.py): artifacts prepared at a small
``--scale`` run through the runtime on a fake GPU driver (kernels in the CPU emulator) and
match the peers' float64 results, so the peers compute what polyfuse computes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_artifacts import (  # noqa: E402
    KernelInfo,
    Prepared,
    PreparedCase,
    compile_case,
    kernel_kind,
    load_cases,
    prepare,
)
from gpu_cases import CASES, COMPUTE, CONFIGURED, PEERS, SPLIT_K, SUITE, TENSOR_CORE, Ops  # noqa: E402
from gpu_measure import (  # noqa: E402
    CaseResult,
    _peer_outputs,
    bench,
    case_program,
    check_case_on_host,
    draw_inputs,
    fake_device,
    import_runtime,
    overhead,
    rel_err,
    run,
    typed,
)
from gpu_models import MODELS, run_models  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

__all__ = [
    "CASES", "COMPUTE", "CONFIGURED", "PEERS", "SPLIT_K", "SUITE", "TENSOR_CORE", "CaseResult",
    "KernelInfo", "Ops",
    "Prepared", "PreparedCase", "_peer_outputs", "bench", "case_program", "check_case_on_host",
    "compile_case", "draw_inputs", "fake_device", "import_runtime", "kernel_kind", "load_cases",
    "overhead", "prepare", "rel_err", "run", "typed",
]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--prepare", type=Path, metavar="DIR", help="compile the cases into DIR")
    mode.add_argument("--run", type=Path, metavar="DIR", help="check and time DIR on the GPU")
    mode.add_argument("--overhead", type=Path, metavar="DIR", help="host overhead per call")
    mode.add_argument("--models", action="store_true", help="whole zoo models (needs islpy)")
    mode.add_argument("--tune", action="store_true", help="time the top GEMM tilings (needs islpy)")
    mode.add_argument(
        "--prepare-all", type=Path, metavar="DIR", help="cases + wheels for a GPU day into DIR"
    )
    mode.add_argument(
        "--all", type=Path, metavar="DIR", help="the GPU day: run, overhead, tests, models"
    )
    p.add_argument("--arch", default="sm_90", help="the cubins' architecture (--prepare*)")
    p.add_argument("--cases", nargs="*", default=None, help=f"default: all of {', '.join(CASES)}")
    p.add_argument("--scale", type=int, default=1, help="divide the non-reduced sizes (tests)")
    p.add_argument("--peers", default="eager,inductor,jax", help="comma-separated peers to time")
    p.add_argument("--size", default="full", choices=("full", "tiny"), help="--models size")
    p.add_argument("--model-names", nargs="*", default=list(MODELS), help="--models subset")
    p.add_argument("--top", type=int, default=6, help="--tune: candidates per micrograph")
    p.add_argument("--python", default="3.12", help="the GPU machine's Python (--prepare-all)")
    p.add_argument("--no-wheels", action="store_true", help="--prepare-all without wheels")
    p.add_argument("--budget-s", type=float, default=540, help="--all: seconds for all steps")
    p.add_argument(
        "--steps",
        default="run,overhead,tune,tests,models",
        help="--all: comma-separated steps to run (run, overhead, tune, tests, models)",
    )
    p.add_argument(
        "--fake-driver",
        action="store_true",
        help="--run/--all on tests/fake_cuda.py's driver (CPU emulator; checks, no timings)",
    )
    p.add_argument("--out", type=Path, default=None, help="the JSON to write")
    args = p.parse_args(argv)
    peers = [s for s in args.peers.split(",") if s]
    if args.prepare:
        cases = args.cases or list(CASES)
        prepare(args.prepare, cases, args.arch, args.scale)
        print(f"wrote {len(cases)} cases and the overhead graph to {args.prepare} (*.pfa)")
    elif args.prepare_all:
        from gpu_day import prepare_all

        prepare_all(
            args.prepare_all, args.arch, args.python, args.scale, args.cases, not args.no_wheels
        )
    elif args.all:
        from gpu_day import run_all

        steps = tuple(s for s in args.steps.split(",") if s)
        day = run_all(args.all, args.out, args.budget_s, args.fake_driver, steps)
        return 0 if all(not s.status.startswith("failed") for s in day.steps) else 1
    elif args.tune:
        from gpu_tune import run_tune

        run_tune(args.out or RESULTS / "gpu_tune.json", args.arch, args.top, args.cases)
    elif args.run:
        run(args.run, args.out or RESULTS / "gpu.json", peers, args.cases, args.fake_driver)
    elif args.overhead:
        figures = overhead(args.overhead)
        if args.out:
            args.out.write_text(json.dumps(figures, indent=1))
    else:
        run_models(args.size, args.out or RESULTS / "gpu_models.json", args.model_names, peers)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
