"""``polyfuse sass``: the SASS instrument on a model, an example or a ``.cu`` file.

A model argument (:func:`polyfuse.models.resolve_model`: an example, a zoo model, an ``.onnx``
or ``.py`` file, ``module:function``) is compiled by polyfuse for each arch (the tiling
decisions depend on it) and its kernels analysed with their launch shapes and kernel IR (the
float4 check included); a ``.cu`` file is compiled as it is and every ``__global__`` function
analysed (``--grid``/``--block`` give the launch shape the estimate needs). Prints one block per
kernel and the table of :func:`polyfuse.cuda.toolchain.sass.format_table`; ``--json`` writes
:meth:`SassReport.to_dict`. Needs NVRTC (or nvcc) and the disassembler (``pip install
'polyfuse[sass]'``): without them, one ``polyfuse: error:`` line says what to install.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import polyfuse
from polyfuse.cli_common import add_common, json_to_stdout, write_json
from polyfuse.cuda.toolchain.compiler import SUPPORTED_ARCHS
from polyfuse.cuda.toolchain.sass import (
    DEFAULT_ARCHS,
    Launch,
    SassReport,
    analyse,
    find_disassembler,
)
from polyfuse.cuda.toolchain.sass.records import format_table
from polyfuse.errors import PolyfuseError
from polyfuse.models import load_model

__all__ = ["SassCommandError", "add_sass_parser", "run_sass", "sass_report"]


class SassCommandError(PolyfuseError):
    """``polyfuse sass`` was given a bad option."""


def _archs(text: str) -> list[str]:
    archs = [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in archs if a not in SUPPORTED_ARCHS]
    if bad or not archs:
        raise SassCommandError(
            f"sass: unknown arch '{','.join(bad) or text}'; use a comma-separated list of "
            f"{', '.join(SUPPORTED_ARCHS)}"
        )
    return archs


def _dims(text: str | None, what: str) -> tuple[int, int, int] | None:
    if text is None:
        return None
    try:
        dims = [int(x) for x in text.lower().replace("x", ",").split(",") if x.strip()]
    except ValueError:
        dims = []
    if not 1 <= len(dims) <= 3 or min(dims) < 1:
        raise SassCommandError(f"sass: --{what} '{text}' must be 1 to 3 positive integers (X,Y,Z)")
    return tuple(dims + [1] * (3 - len(dims)))  # type: ignore[return-value]


def sass_report(
    spec: str,
    archs: list[str],
    *,
    size: str | None = None,
    grid: tuple[int, int, int] | None = None,
    block: tuple[int, int, int] | None = None,
) -> SassReport:
    """The instrument's report of a model argument or a ``.cu`` file over ``archs``."""
    dis = find_disassembler()  # before compiling anything: fail fast, saying what to install
    if spec.endswith(".cu"):
        if not os.path.isfile(spec):
            raise SassCommandError(f"sass: no such file '{spec}'")
        if (grid is None) != (block is None):
            raise SassCommandError("sass: give both --grid and --block (or neither)")
        launch = Launch(grid, block) if grid is not None and block is not None else None
        source = Path(spec).read_text()
        return analyse(source, archs, launch=launch, name=Path(spec).stem, disassembler=dis)
    if grid is not None or block is not None:
        raise SassCommandError("sass: --grid/--block apply to .cu files (models know theirs)")
    m = load_model(spec, size or "full")
    kernels = []
    compilers: dict[str, str] = {}
    for arch in archs:
        kw = {"constants": m.constants} if m.constants else {}
        fn = polyfuse.compile(m.inputs, m.outputs, arch, check_cuda=False, name=m.name, **kw)
        rep = analyse(fn.cuda_source, (arch,), kernels=fn.kernels, name=m.name, disassembler=dis)
        kernels += rep.kernels
        compilers.update(rep.compiler)
    return SassReport(m.name, kernels, str(dis), compilers)


def add_sass_parser(sub) -> None:
    """Register ``polyfuse sass`` on the ``polyfuse`` subparsers."""
    p = sub.add_parser(
        "sass",
        help="count what each kernel's hot loop executes, from its SASS (no GPU needed)",
        description="Compile MODEL (or a .cu file) for each arch with NVRTC, disassemble the "
        "cubin and print, per kernel, the hot loop's instructions per iteration (FFMA share, "
        "shared and global accesses by width, barriers, integer and branch instructions), "
        "registers, spills, shared memory, blocks per SM and their limiter, and an issue-bound "
        "time estimate (modelled) with its assumptions.",
    )
    p.add_argument(
        "model",
        metavar="MODEL",
        help="a built-in example, a zoo model, an .onnx or .py file, module:function, "
        "or a .cu file",
    )
    p.add_argument(
        "--arch",
        default=",".join(DEFAULT_ARCHS),
        help=f"comma-separated archs (default {','.join(DEFAULT_ARCHS)})",
    )
    p.add_argument("--grid", help="a .cu file's launch grid X[,Y,Z] (for the estimate)")
    p.add_argument("--block", help="a .cu file's block X[,Y,Z] (for occupancy and the estimate)")
    p.add_argument("--table", action="store_true", help="print only the table")
    add_common(p, size=True, json="the report")
    p.set_defaults(func=run_sass)


def run_sass(args: argparse.Namespace) -> int:
    rep = sass_report(
        args.model,
        _archs(args.arch),
        size=args.size,
        grid=_dims(args.grid, "grid"),
        block=_dims(args.block, "block"),
    )
    print(format_table(rep.kernels) if args.table else rep)
    write_json(args, rep.to_dict())
    if args.json and not json_to_stdout(args) and not args.quiet:
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
