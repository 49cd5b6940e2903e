"""``polyfuse viz`` and ``polyfuse explain``: compile a model argument, then report on it.

Apart from :mod:`polyfuse.viz` (which only reads a compiled graph) because it compiles: the
compiler calls the visualizer, and this module calls the compiler.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import polyfuse
from polyfuse.cli_common import add_arch, add_common, json_to_stdout, positive_int, write_json
from polyfuse.errors import PolyfuseError
from polyfuse.models import load_model, resolve_model
from polyfuse.shapes_arg import add_shapes_argument, check_shapes_apply, parse_shapes
from polyfuse.viz import explain, extract, visualize

__all__ = ["add_subcommands", "compile_model", "run_explain", "run_viz"]


# --------------------------------------------------------------------------- models


def compile_model(
    spec: str, size: str | None = None, arch: str = "sm_80", budget=None, shapes=None
):
    """Compile MODEL, a model argument (:func:`polyfuse.models.resolve_model`: an ONNX file,
    a ``.py`` file exposing ``inputs``/``outputs`` (and optional ``constants``), a built-in
    example name, a zoo model name or ``module:function``). ``shapes`` fixes an ONNX model's
    dynamic input dims (``--shapes``)."""
    try:
        source = resolve_model(spec)
        check_shapes_apply([source], shapes or {})
        m = load_model(source, size or "full", shapes)
    except PolyfuseError as e:
        raise PolyfuseError(f"viz: {e}") from e
    kw: dict[str, Any] = {"arch": arch, "check_cuda": "auto"}
    if budget is not None:
        kw["budget"] = budget
    if m.constants:
        kw["constants"] = m.constants
    return polyfuse.compile(inputs=m.inputs, outputs=m.outputs, name=m.name, **kw)


# --------------------------------------------------------------------------- command line


_MODEL_HELP = (
    "an .onnx file, a .py file defining inputs/outputs (and optional constants), "
    "a built-in example name, a zoo model name or module:function"
)


def _model_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """MODEL and the options that say how to compile it (shared by viz and explain)."""
    p.add_argument("model", metavar="MODEL", help=_MODEL_HELP)
    add_arch(p)
    p.add_argument(
        "--budget",
        type=positive_int,
        metavar="OPS",
        help="isl scheduler budget in operations per isl call (default: the compiler's)",
    )
    add_shapes_argument(p)
    return p


def add_subcommands(sub) -> None:
    """Register ``viz`` and ``explain`` on the ``polyfuse`` subparsers."""
    v = _model_arguments(
        sub.add_parser(
            "viz",
            help="write the scheduling debug report (one self-contained HTML file)",
            description="Compile MODEL and write an HTML report of every partition, schedule, "
            "stitch and kernel, and why.",
        )
    )
    v.add_argument("-o", "--out", default="report.html", help="HTML file (default report.html)")
    add_common(v, size=True, json="the report's data too")
    v.set_defaults(func=run_viz)
    e = _model_arguments(
        sub.add_parser(
            "explain",
            help="print the fusion decisions for one op's edges",
            description="Compile MODEL and print what happened to each producer->consumer edge "
            "of --op (every edge without it).",
        )
    )
    e.add_argument(
        "--op", metavar="NAME", help="primitive (or composite) name (default: every edge)"
    )
    add_common(e, size=True)
    e.set_defaults(func=run_explain)


def run_viz(args: argparse.Namespace) -> int:
    fn = compile_model(args.model, args.size, args.arch, args.budget, parse_shapes(args.shapes))
    to_stdout = json_to_stdout(args)
    data = visualize(fn, args.out, None if to_stdout else args.json)
    if to_stdout:
        write_json(args, data)
    c = data["counts"]
    if not args.quiet:
        print(
            f"wrote {args.out}: {c['primitives']} primitives, {c['micrographs']} micrographs, "
            f"{c['kernels']} kernels, {os.path.getsize(args.out)} bytes"
            + (f"; JSON {args.json}" if args.json and not to_stdout else ""),
            file=sys.stderr,
        )
    return 0


def run_explain(args: argparse.Namespace) -> int:
    fn = compile_model(args.model, args.size, args.arch, args.budget, parse_shapes(args.shapes))
    print(explain(extract(fn), args.op))
    return 0
