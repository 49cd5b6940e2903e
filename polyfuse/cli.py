"""The ``polyfuse`` command.

``polyfuse demo`` compiles the built-in examples (:mod:`polyfuse.examples`), prints each plan,
runs the kernels on the CPU emulator against a numpy reference, compiles the CUDA with
NVRTC/nvcc when one is installed, writes one ``.cu`` file per example and ends with a summary
table. Exit status: 0 when every example passes, 1 when a result is wrong, 2 on a polyfuse error
(printed as one ``polyfuse: error: ...`` line) or bad command-line arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import textwrap
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

import polyfuse
from polyfuse.cli_common import (
    ArgumentParser,
    add_arch,
    add_common,
    cli_logging,
    json_stdout,
    write_json,
)
from polyfuse.errors import CompilerNotFound, PolyfuseError, RaceError
from polyfuse.examples import EXAMPLES, Example, max_error, random_inputs

__all__ = ["DemoResult", "build_parser", "main", "run_demo"]

PROG = "polyfuse"
DEFAULT_OUT = "polyfuse-demo-out"
DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-5

#: Exit statuses.
EXIT_OK, EXIT_FAIL, EXIT_ERROR = 0, 1, 2


# --------------------------------------------------------------------------- arguments


def _examples_epilog() -> str:
    width = max(len(n) for n in EXAMPLES)
    lines = [f"  {n:<{width}}  {ex.description}" for n, ex in EXAMPLES.items()]
    return (
        "examples:\n" + "\n".join(lines) + "\n\n"
        "exit status: 0 when every example passes, 1 when a result differs from numpy,\n"
        "2 on a polyfuse error or bad arguments."
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``polyfuse`` command and its subcommands."""
    parser = ArgumentParser(
        prog=PROG,
        description=(
            "polyfuse: a polyhedral fusion compiler for deep-learning graphs. Tensor "
            "expressions are partitioned into micrographs, fused and tiled by isl, and emitted "
            "as CUDA C that runs on a GPU or on the built-in CPU emulator."
        ),
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {polyfuse.__version__}")
    parser.epilog = (
        "run 'polyfuse COMMAND --help' for a command's options; every command takes -q/-v, "
        "and those with a report --json PATH ('-': stdout)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="compile the built-in examples and check them on the emulator",
        description=textwrap.fill(
            "Compile every built-in example (or those named with --only), print its plan, "
            "run it on the CPU emulator with random inputs and compare against numpy, "
            "compile the CUDA with NVRTC/nvcc for --arch when a compiler is installed, and "
            "write <out>/<example>.cu. Ends with a summary table. Progress goes to stderr.",
            width=79,
        ),
        epilog=_examples_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument(
        "--out",
        metavar="DIR",
        default=DEFAULT_OUT,
        help=f"folder for the generated .cu files (default: ./{DEFAULT_OUT})",
    )
    add_arch(demo)
    demo.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        choices=list(EXAMPLES),
        help="run only these examples (names listed below)",
    )
    demo.add_argument(
        "--race-check",
        action="store_true",
        help="also run each kernel with every block's threads in reverse order between "
        "barriers (a missing __syncthreads() then shows as a wrong result) and under the "
        "shadow-memory race detector (reports the first data race by kernel, line and threads)",
    )
    demo.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    demo.add_argument(
        "--rtol",
        type=float,
        default=DEFAULT_RTOL,
        help=f"relative tolerance vs numpy (default: {DEFAULT_RTOL:g})",
    )
    demo.add_argument(
        "--atol",
        type=float,
        default=DEFAULT_ATOL,
        help=f"absolute tolerance vs numpy (default: {DEFAULT_ATOL:g})",
    )
    add_common(demo, json="every example's result")
    demo.set_defaults(func=run_demo)
    from polyfuse.batch import add_zoo_parser

    add_zoo_parser(sub)
    from polyfuse.viz.command import add_subcommands  # viz, explain

    add_subcommands(sub)
    from polyfuse.testing.command import add_fuzz_parser

    add_fuzz_parser(sub)
    from polyfuse.tune import add_tune_parser

    add_tune_parser(sub)
    from polyfuse.sass import add_sass_parser

    add_sass_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``polyfuse`` with ``argv`` (default ``sys.argv[1:]``) and return the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, or a usage error (already printed)
        return e.code if isinstance(e.code, int) else EXIT_ERROR
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    try:
        with cli_logging(args), json_stdout(args):
            return args.func(args)
    except PolyfuseError as e:
        _error(str(e))
        _cause(args, e)
        return EXIT_ERROR
    except OSError as e:
        _error(f"{e.strerror or e}: {e.filename}" if e.filename else str(e))
        _cause(args, e)
        return EXIT_ERROR
    except KeyboardInterrupt:
        _error("interrupted")
        return 130


def _cause(args: argparse.Namespace, e: BaseException) -> None:
    """With ``-vv``, the traceback behind an error (its cause's, when it has one)."""
    if getattr(args, "verbose", 0) >= 2:
        traceback.print_exception(e.__cause__ or e, file=sys.stderr)


def _error(message: str) -> None:
    """Print one ``polyfuse: error: ...`` line on stderr."""
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)


# --------------------------------------------------------------------------- demo


@dataclass
class DemoResult:
    """What ``polyfuse demo`` found for one example."""

    name: str
    status: str = "ERROR"  # "PASS" | "FAIL" | "ERROR"
    primitives: int | None = None
    micrographs: int | None = None
    kernels: int | None = None
    max_error: float | None = None
    seconds: float = 0.0
    reason: str = ""  # one line, for FAIL and ERROR
    cuda: str = ""  # what happened to the CUDA compile, one line
    cuda_compiled: bool = False
    source_path: Path | None = None


class _Printer:
    """Report lines on stdout, progress lines on stderr; both silenced by ``--quiet``."""

    def __init__(self, quiet: bool, out: TextIO | None = None, err: TextIO | None = None):
        self.quiet = quiet
        self.out = out or sys.stdout
        self.err = err or sys.stderr

    def report(self, text: str = "") -> None:
        if not self.quiet:
            print(text, file=self.out, flush=True)

    def progress(self, text: str) -> None:
        if not self.quiet:
            print(text, file=self.err, flush=True)


def _shapes(tensors: Sequence[polyfuse.te.Tensor]) -> str:
    return ", ".join(f"{t.name}{list(t.shape)}" for t in tensors)


def _compare(
    outputs: Sequence[polyfuse.te.Tensor],
    got: np.ndarray | tuple[np.ndarray, ...],
    want: tuple[np.ndarray, ...],
    rtol: float,
    atol: float,
) -> tuple[float, str]:
    """Max absolute error over all outputs, and why the result is wrong ("" when it is right)."""
    got_t = got if isinstance(got, tuple) else (got,)
    err = max_error(got_t, want)
    if len(got_t) != len(want):
        return err, f"{len(got_t)} outputs, numpy reference has {len(want)}"
    for t, g, w in zip(outputs, got_t, want, strict=True):
        if g.shape != w.shape:
            return err, f"output '{t.name}' has shape {g.shape}, numpy reference {w.shape}"
        nan = np.isnan(g) & ~np.isnan(w)
        if nan.any():
            first = tuple(int(i) for i in np.argwhere(nan)[0])
            return err, (
                f"output '{t.name}': {int(nan.sum())} of {g.size} elements are NaN "
                f"(never written?), first at {first}"
            )
        bad = ~np.isclose(g, w, rtol=rtol, atol=atol)
        if bad.any():
            diff = np.where(bad, np.abs(g.astype(np.float64) - w), 0.0)
            at = np.unravel_index(int(np.argmax(diff)), g.shape)
            at_s = tuple(int(i) for i in at)
            return err, (
                f"output '{t.name}': {int(bad.sum())} of {g.size} elements differ from numpy "
                f"(rtol {rtol:g}, atol {atol:g}); worst at {at_s}: got {float(g[at]):.6g}, "
                f"want {float(w[at]):.6g}"
            )
    return err, ""


def _write_source(path: Path, fn: polyfuse.CompiledGraph, example: Example) -> None:
    """Write the CUDA translation unit with a comment header listing the launches."""
    head = [
        f"// polyfuse {polyfuse.__version__}: example '{example.name}' for {fn.arch}",
        f"// {example.description}",
        f"// inputs: {_shapes(fn.inputs)}",
        f"// outputs: {_shapes(fn.outputs)}",
        "// launches, in order (<<<grid, block, dynamic shared bytes>>>):",
        *(f"//   {launch}" for launch in fn.launches),
        "",
    ]
    path.write_text("\n".join(head) + fn.cuda_source.rstrip("\n") + "\n", encoding="utf-8")


def _cuda_compile(fn: polyfuse.CompiledGraph, arch: str, result: DemoResult) -> None:
    """Compile ``fn``'s CUDA for ``arch`` when a compiler exists; record what happened."""
    try:
        binary = fn.check_cuda(arch)
    except CompilerNotFound as e:
        result.cuda = f"not compiled for {arch}: {e}"
        return
    version = f" {binary.compiler_version}" if binary.compiler_version else ""
    cached = ", cached" if binary.cached else ""
    result.cuda = (
        f"compiled for {arch} with {binary.compiler}{version} "
        f"({len(binary.resources)} kernels, {binary.seconds:.2f} s{cached})"
    )
    result.cuda_compiled = True


def run_example(
    example: Example,
    *,
    arch: str = "sm_80",
    out_dir: Path | None = None,
    race_check: bool = False,
    seed: int = 0,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    printer: _Printer | None = None,
    tag: str = "",
) -> DemoResult:
    """Compile, emulate, check and CUDA-compile one example; never raises a PolyfuseError."""
    p = printer or _Printer(quiet=True)
    result = DemoResult(example.name)
    start = time.perf_counter()
    stage = "building the graph"
    try:
        inputs, outputs, reference = example.build()
        p.report(f"=== {example.name}: {example.description} ===")
        p.report(f"inputs: {_shapes(inputs)}  ->  outputs: {_shapes(outputs)}")

        stage = "compiling"
        p.progress(f"{tag}{example.name}: compiling for {arch}")
        fn = polyfuse.compile(
            inputs=inputs, outputs=outputs, arch=arch, check_cuda=False, name=example.name
        )
        result.primitives = len(fn.plan.graph.prims)
        result.micrographs = len(fn.plan.micrographs)
        result.kernels = len(fn.kernels)
        if out_dir is not None:
            result.source_path = out_dir / f"{example.name}.cu"
            _write_source(result.source_path, fn, example)
            p.report(f"wrote {result.source_path}")

        stage = "compiling CUDA"
        p.progress(f"{tag}{example.name}: compiling CUDA with NVRTC/nvcc")
        _cuda_compile(fn, arch, result)
        p.report(str(fn.plan))
        p.report(f"CUDA: {result.cuda}")

        stage = "emulating"
        arrays = random_inputs(inputs, seed)
        want = reference(*arrays)
        orders = [False, True, "shadow"] if race_check else [False]
        worst, reason = 0.0, ""
        for order in orders:
            mode = {
                False: "threads in order",
                True: "threads in reverse order",
                "shadow": "race detector",
            }[order]
            p.progress(f"{tag}{example.name}: running on the emulator ({mode})")
            t0 = time.perf_counter()
            try:
                got = fn(*arrays, device="emulate", race_check=order)
            except RaceError as e:
                p.report(f"emulator ({mode}): {e}: FAIL")
                reason = reason or str(e)
                continue
            err, why = _compare(outputs, got, want, rtol, atol)
            worst = max(worst, err)
            verdict = "PASS" if not why else "FAIL"
            p.report(
                f"emulator ({mode}, {time.perf_counter() - t0:.2f} s): max |error| vs numpy "
                f"{err:.3g} (rtol {rtol:g}, atol {atol:g}): {verdict}"
            )
            if why and not reason:
                reason = why + (f" [race check: {mode}]" if order else "")
        result.max_error = worst
        result.status = "FAIL" if reason else "PASS"
        result.reason = reason
    except PolyfuseError as e:
        result.status, result.reason = "ERROR", f"{stage}: {e}"
    except ImportError as e:  # an optional part (the emulator's host compiler glue) is missing
        result.status, result.reason = "ERROR", f"{stage}: {e}"
    except Exception as e:  # a polyfuse bug: keep going with the other examples
        result.status = "ERROR"
        result.reason = f"internal error while {stage}: {type(e).__name__}: {e} (a polyfuse bug)"
        traceback.print_exc(file=p.err)
    result.seconds = time.perf_counter() - start
    p.report()
    return result


def _fmt_error(e: float | None) -> str:
    if e is None:
        return "-"
    return "inf" if math.isinf(e) else f"{e:.2e}"


def format_table(results: Sequence[DemoResult]) -> str:
    """The summary table: one row per example and a total line."""
    head = ("example", "primitives", "micrographs", "kernels", "max error", "result", "seconds")
    num = lambda v: "-" if v is None else str(v)  # noqa: E731
    rows = [
        (
            r.name,
            num(r.primitives),
            num(r.micrographs),
            num(r.kernels),
            _fmt_error(r.max_error),
            r.status,
            f"{r.seconds:.2f}",
        )
        for r in results
    ]
    passed = sum(r.status == "PASS" for r in results)
    total = (
        "total",
        num(sum(r.primitives or 0 for r in results)),
        num(sum(r.micrographs or 0 for r in results)),
        num(sum(r.kernels or 0 for r in results)),
        _fmt_error(max((r.max_error for r in results if r.max_error is not None), default=None)),
        f"{passed}/{len(results)} PASS",
        f"{sum(r.seconds for r in results):.2f}",
    )
    widths = [max(len(row[c]) for row in [head, *rows, total]) for c in range(len(head))]
    align: list[Callable[[str, int], str]] = [str.ljust] + [str.rjust] * 4 + [str.ljust, str.rjust]

    def line(row: Sequence[str]) -> str:
        return "  ".join(f(v, w) for f, v, w in zip(align, row, widths, strict=True)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(head), rule, *map(line, rows), rule, line(total)])


def _result_json(r: DemoResult) -> dict:
    """One example's result as JSON values."""
    d = dataclasses.asdict(r)
    d["source_path"] = str(r.source_path) if r.source_path is not None else None
    return d


def run_demo(args: argparse.Namespace) -> int:
    """``polyfuse demo``: run the selected examples, print the summary, return the exit status."""
    names = list(dict.fromkeys(args.only)) if args.only else list(EXAMPLES)
    out_dir = Path(args.out).expanduser()
    out_dir.mkdir(parents=True, exist_ok=True)
    if not os.access(out_dir, os.W_OK):
        raise PermissionError(13, "output folder is not writable", str(out_dir))
    printer = _Printer(args.quiet)
    results = []
    for i, name in enumerate(names, 1):
        results.append(
            run_example(
                EXAMPLES[name],
                arch=args.arch,
                out_dir=out_dir,
                race_check=args.race_check,
                seed=args.seed,
                rtol=args.rtol,
                atol=args.atol,
                printer=printer,
                tag=f"[{i}/{len(names)}] ",
            )
        )
        r = results[-1]
        printer.progress(f"[{i}/{len(names)}] {name}: {r.status} in {r.seconds:.2f} s")

    written = [r for r in results if r.source_path is not None and r.source_path.exists()]
    files = "file" if len(written) == 1 else "files"
    print(f"CUDA sources: {len(written)} .cu {files} written to {out_dir.resolve()}")
    compiled = [r for r in results if r.cuda_compiled]
    if compiled:
        print(f"CUDA compile: {len(compiled)}/{len(results)} examples compiled for {args.arch}")
    skipped = next((r.cuda for r in results if r.cuda and not r.cuda_compiled), "")
    if skipped:
        print(f"CUDA compile: {skipped}")
    print()
    print(format_table(results))

    for r in results:
        if r.status == "FAIL":
            print(f"{PROG}: FAIL {r.name}: {r.reason}", file=sys.stderr)
        elif r.status == "ERROR":
            _error(f"{r.name}: {r.reason}")
    write_json(
        args,
        {
            "polyfuse": polyfuse.__version__,
            "arch": args.arch,
            "examples": [_result_json(r) for r in results],
        },
    )
    if any(r.status == "ERROR" for r in results):
        return EXIT_ERROR
    return EXIT_FAIL if any(r.status == "FAIL" for r in results) else EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
