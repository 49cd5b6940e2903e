"""``polyfuse fuzz``: the differential fuzzer on the command line.

Generates ``--n`` random graphs from ``--seed`` on, compiles them ``--batch`` at a time, runs
them on the emulator (threads in order and in reverse order) against the reference evaluator,
shrinks every failure to a minimal graph and prints it as a runnable script (also written to
``--out``). Exit status 0 when nothing failed, 1 when something did, 2 on bad arguments.
``--torch`` fuzzes the torch.compile backend with random PyTorch programs instead
(:mod:`.torch_programs`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from polyfuse.cli_common import add_common, non_negative_int, positive_int, write_json

from .dtypes import parse_dtypes
from .generate import FAMILIES
from .run import FuzzReport, Outcome, fuzz
from .script import to_script
from .shrink import shrink

__all__ = ["add_fuzz_parser", "run_fuzz", "run_program_fuzz"]


def add_fuzz_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``polyfuse fuzz`` on the ``polyfuse`` subparsers ``sub``."""
    p = sub.add_parser(
        "fuzz",
        help="differential fuzzing: random te graphs, emulator vs reference evaluator",
        description=(
            "Compile random te graphs (elementwise chains, broadcasts, reductions of every "
            "form, matmuls, where, sizes 1 and primes, NaN/inf inputs; and the families of "
            "past bugs: adversarial names, extreme constants, shifted and out-of-bounds reads, "
            "packed branches, GEMMs with 1-D factors, stencil chains, convolutions of every "
            "shape: one-row inputs, strides, dilations, groups, padding, long rows read again "
            "by stitched parts), run them on the CPU "
            "emulator and compare against polyfuse.reference.evaluate (with --dtypes: float16, "
            "bfloat16, float64, integer and mixed-precision graphs, each output within its "
            "dtype's tolerance). "
            "Failures are shrunk to "
            "a minimal graph and printed as a runnable Python script. Exit status 1 if any "
            "graph failed. With --torch or --onnx: random PyTorch programs through the "
            "torch.compile backend, or random ONNX models through the ONNX importer, compared "
            "with eager PyTorch or ONNX's reference evaluator."
        ),
    )
    p.add_argument("--n", type=non_negative_int, default=100, help="graphs to check (default: 100)")
    p.add_argument("--seed", type=int, default=0, help="seed of the first graph (default: 0)")
    p.add_argument(
        "--batch",
        type=positive_int,
        default=8,
        help="graphs compiled together per emulator build (default: 8)",
    )
    p.add_argument(
        "--max-elements",
        type=positive_int,
        default=4096,
        help="largest tensor, in elements (default: 4096); with --torch or --onnx, a larger "
        "value draws inputs of dims up to 513 (multi-block, elements-per-thread and long-row "
        "paths)",
    )
    p.add_argument(
        "--no-race-check",
        action="store_true",
        help="run threads only in order (default: also in reverse order between barriers)",
    )
    p.add_argument(
        "--families",
        type=_families,
        default=None,
        help="comma-separated generator families to draw from (default: all of "
        f"{', '.join(sorted(FAMILIES))})",
    )
    p.add_argument(
        "--dtypes",
        type=_dtypes,
        default=None,
        metavar="LIST|all",
        help="comma-separated dtypes graphs draw their tensors' dtypes from (float16, bfloat16, "
        "float32, float64: uniform and mixed-precision graphs with te.cast; int32, int64, bool: "
        "some graphs store one tensor in one, compared exactly), or 'all' (default: float32 "
        "only)",
    )
    p.add_argument(
        "--cache-twice-every",
        type=non_negative_int,
        default=4,
        help="compile every N-th batch twice through one compile cache, cold then warm, and "
        "require the same CUDA (0: never; default: 4)",
    )
    p.add_argument(
        "--torch",
        action="store_true",
        help="fuzz the torch.compile backend instead: random PyTorch programs of the operators "
        "it lowers, over inputs of --dtypes, compiled with backend='polyfuse' and compared with "
        "eager, every failure printed as a runnable script (needs PyTorch; --batch, "
        "--families and shrinking do not apply)",
    )
    p.add_argument(
        "--onnx",
        action="store_true",
        help="fuzz the ONNX importer instead: random ONNX models (opset 20) of the operators "
        "it imports with drawn attributes, over inputs of --dtypes, run through the ONNX "
        "backend on the emulator and compared with ONNX's reference evaluator, every failure "
        "printed as a runnable script (needs onnx; --batch, --families and shrinking do not "
        "apply)",
    )
    p.add_argument(
        "--steps",
        type=positive_int,
        default=6,
        help="with --torch or --onnx: steps (operators) per program (default: 6)",
    )
    p.add_argument("--no-shrink", action="store_true", help="report failures unshrunk")
    p.add_argument("--out", metavar="DIR", default=None, help="write each failure's script to DIR")
    add_common(p, json="the counts and every failure (seed, status, detail, script)")
    p.set_defaults(func=run_fuzz)
    return p


def _families(text: str) -> list[str]:
    names = [t for t in text.split(",") if t]
    unknown = sorted(set(names) - set(FAMILIES))
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown families {unknown or text!r}; known: {', '.join(sorted(FAMILIES))}"
        )
    return names


def _dtypes(text: str) -> tuple[str, ...]:
    try:
        return parse_dtypes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _progress(quiet: bool = False) -> Any:
    def show(done: int, o: Outcome) -> None:
        if o.failed and not quiet:
            print(f"{o.status.upper()} seed {o.spec.seed}: {o.detail}", file=sys.stderr)

    return show


def run_program_fuzz(args: argparse.Namespace) -> int:
    """``polyfuse fuzz --torch`` / ``--onnx``: check random PyTorch programs or ONNX models,
    print each failure's script and the counts; exit status 1 on a failure, 2 without the
    framework."""
    kind = "torch" if args.torch else "onnx"
    try:
        __import__(kind)
    except ImportError:
        print(f"polyfuse fuzz --{kind} needs {'PyTorch' if kind == 'torch' else 'ONNX'}: "
              f"pip install 'polyfuse[{kind}]'", file=sys.stderr)  # fmt: skip
        return 2
    if kind == "torch":
        from .torch_programs import fuzz_torch as fuzz_programs

        unit, counted = "programs", "operators run in polyfuse"
    else:
        from .onnx_programs import fuzz_onnx as fuzz_programs

        unit, counted = "models", "nodes"
    t0 = time.perf_counter()

    def show(done: int, o: Any) -> None:
        if o.failed and not args.quiet:
            print(f"{o.status.upper()} seed {o.program.seed}: {o.detail}", file=sys.stderr)

    outcomes = fuzz_programs(
        args.n, args.seed, args.dtypes, show, steps=args.steps, max_elements=args.max_elements
    )
    failures = []
    for k, o in enumerate(o for o in outcomes if o.failed):
        text = o.program.script()
        print(f"# ---- failure {k + 1}: {o.status}: {o.detail}\n{text}")
        failures.append({"seed": o.program.seed, "status": o.status, "detail": o.detail,
                         "script": text})  # fmt: skip
        if args.out:
            path = Path(args.out) / f"fuzz-{kind}-failure-{o.program.seed}.py"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    ran = sum(o.size for o in outcomes)
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "nothing run"
    print(
        f"polyfuse fuzz --{kind}: {len(outcomes)} {unit} (seeds {args.seed}.."
        f"{args.seed + args.n - 1}), {ran} {counted}, "
        f"{time.perf_counter() - t0:.1f} s: {summary}"
    )
    write_json(args, {unit: len(outcomes), "seed": args.seed, counted.split()[0]: ran,
                      "counts": counts, "failures": failures})  # fmt: skip
    return 1 if failures else 0


def run_fuzz(args: argparse.Namespace) -> int:
    """``polyfuse fuzz``: run, shrink and print failures, print the counts; exit status."""
    if args.torch or args.onnx:
        return run_program_fuzz(args)
    t0 = time.perf_counter()
    rep: FuzzReport = fuzz(
        args.n,
        args.seed,
        batch=args.batch,
        race_check=not args.no_race_check,
        max_elements=args.max_elements,
        progress=_progress(args.quiet),
        cache_twice_every=args.cache_twice_every,
        families=args.families,
        dtypes=args.dtypes,
    )
    out_dir = Path(args.out) if args.out else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    failures = []
    for k, o in enumerate(rep.failures):
        spec = o.spec
        if not args.no_shrink:
            if not args.quiet:
                print(f"shrinking failure {k + 1} (seed {spec.seed}) ...", file=sys.stderr)
            spec = shrink(spec)
        title = f"polyfuse fuzz failure ({o.status}): {o.detail.splitlines()[0][:200]}"
        text = to_script(spec, race_check="reverse order" in o.detail, title=title)
        print(f"# ---- failure {k + 1}: {o.status}: {o.detail}")
        print(text)
        failures.append(
            {"seed": o.spec.seed, "status": o.status, "detail": o.detail, "script": text}
        )
        if out_dir is not None:
            path = out_dir / f"fuzz-failure-{spec.seed}-{k + 1}.py"
            path.write_text(text, encoding="utf-8")
            print(f"# written to {path}", file=sys.stderr)
    counts = ", ".join(f"{v} {k}" for k, v in sorted(rep.counts.items()))
    print(
        f"polyfuse fuzz: {rep.graphs} graphs (seeds {args.seed}..{args.seed + args.n - 1}) in "
        f"{rep.compiles} compiles, {time.perf_counter() - t0:.1f} s: {counts or 'nothing run'}"
    )
    doc = {"graphs": rep.graphs, "seed": args.seed, "compiles": rep.compiles}
    doc["dtypes"] = list(args.dtypes or ("float32",))
    write_json(args, {**doc, "counts": rep.counts, "failures": failures})
    return 1 if rep.failures else 0
