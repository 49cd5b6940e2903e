"""The scheduling debug visualizer: what polyfuse decided for a graph, and why.

``fn.visualize("report.html")`` / ``polyfuse viz MODEL -o report.html [--json out.json]`` write
one self-contained HTML page (no network); ``polyfuse explain MODEL [--op NAME]`` prints the
decisions of one op's edges. All three read the same data, :func:`extract`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from polyfuse.shapes_arg import add_shapes_argument, parse_shapes
from polyfuse.viz.extract import REASON_KINDS, extract, kinds_present
from polyfuse.viz.template import TEMPLATE

__all__ = [
    "REASON_KINDS",
    "compile_model",
    "explain",
    "extract",
    "kinds_present",
    "load_model",
    "render_html",
    "visualize",
]


def render_html(data: dict[str, Any]) -> str:
    """The report page for ``data`` (from :func:`extract`)."""
    blob = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    title = str(data["name"]).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return TEMPLATE.replace("__TITLE__", title).replace("__DATA__", blob)


def visualize(fn, path, json_path=None) -> dict[str, Any]:
    """Write the HTML report of compiled graph ``fn`` to ``path`` (and JSON to ``json_path``)."""
    data = extract(fn)
    Path(path).write_text(render_html(data), encoding="utf-8")
    if json_path:
        Path(json_path).write_text(json.dumps(data, indent=1), encoding="utf-8")
    return data


def explain(data: dict[str, Any], op: str | None = None) -> str:
    """The decisions of every edge touching ``op`` (all edges without it), as text."""
    decs = data["decisions"]
    if op is not None:
        known = {p["id"] for p in data["prims"]}
        matches = [p["id"] for p in data["prims"] if p["id"] == op]
        if not matches:
            matches = [p["id"] for p in data["prims"] if op in p["id"] or op == p["composite"]]
        if not matches:
            from polyfuse.errors import PolyfuseError

            close = ", ".join(sorted(known)[:20])
            raise PolyfuseError(f"explain: no op named '{op}'; ops are: {close}")
        sel = set(matches)
        decs = [d for d in decs if d["producer"] in sel or d["consumer"] in sel]
    else:
        sel = {p["id"] for p in data["prims"]}
    c = data["counts"]
    out = [
        f"{data['name']} ({data['arch']}): {c['primitives']} primitives, "
        f"{c['micrographs']} micrographs, {c['kernels']} kernels"
    ]
    pidx = {p["id"]: p for p in data["prims"]}
    for n in sorted(sel, key=[p["id"] for p in data["prims"]].index):
        if op is None:
            break
        p = pidx[n]
        out.append(
            f"op {n}: {p['kind']} {p['shape']}"
            + (f" [{p['composite']}]" if p["composite"] else "")
            + f" in {p['mg']}, kernel {p['kernel']}"
        )
    if not decs:
        out.append("  (no producer->consumer edges)")
    for d in decs:
        out.append(
            f"{d['producer']} -> {d['consumer']} [{d['tensor']} {d['shape']}]: "
            f"{d['outcome'].upper()} ({', '.join(d['kinds'])})"
        )
        p = d["partition"]
        rule = f" (rule {p['rule']})" if p["rule"] else ""
        out.append(f"    partition: {'fused' if p['fused'] else 'not fused'}{rule}: {p['reason']}")
        if d["stitch"]:
            out.append(f"    stitch: {d['stitch']['text']}")
        for s in d["refusals"]:
            out.append(f"    stitch refused: {s['text']}")
        if d["placement"]:
            pl = d["placement"]
            fp = f", footprint {pl['bytes']} B" if pl["bytes"] else ""
            out.append(f"    lives in: {pl['space']} ({pl['reason']}{fp})")
        for n in d["notes"]:
            out.append(f"    note: {n}")
    return "\n".join(out)


# --------------------------------------------------------------------------- models


def compile_model(
    spec: str, size: str | None = None, arch: str = "sm_80", budget=None, shapes=None
):
    """Compile MODEL, a model argument (:func:`polyfuse.models.resolve_model`: an ONNX file,
    a ``.py`` file exposing ``inputs``/``outputs`` (and optional ``constants``), a built-in
    example name, a zoo model name or ``module:function``). ``shapes`` fixes an ONNX model's
    dynamic input dims (``--shapes``)."""
    import polyfuse
    from polyfuse.errors import PolyfuseError
    from polyfuse.models import load_model as build

    try:
        m = build(spec, size or "full", shapes)
    except PolyfuseError as e:
        raise PolyfuseError(f"viz: {e}") from None
    kw: dict[str, Any] = {"arch": arch, "check_cuda": "auto"}
    if budget is not None:
        kw["budget"] = budget
    if m.constants:
        kw["constants"] = m.constants
    return polyfuse.compile(inputs=m.inputs, outputs=m.outputs, name=m.name, **kw)


load_model = compile_model  # the name this had before polyfuse.models


# --------------------------------------------------------------------------- command line


def add_subcommands(sub) -> None:
    """Register ``viz`` and ``explain`` on the ``polyfuse`` subparsers."""
    from polyfuse.driver import SUPPORTED_ARCHS

    model_help = (
        "an .onnx file, a .py file defining inputs/outputs (and optional constants), "
        "a built-in example name, a zoo model name or module:function"
    )
    v = sub.add_parser(
        "viz",
        help="write the scheduling debug report (one self-contained HTML file)",
        description="Compile MODEL and write an HTML report of every partition, schedule, "
        "stitch and kernel, and why.",
    )
    v.add_argument("model", metavar="MODEL", help=model_help)
    v.add_argument("-o", "--out", default="report.html", help="HTML file (default report.html)")
    v.add_argument("--json", metavar="PATH", help="also write the report data as JSON")
    v.add_argument("--size", help="zoo model size")
    v.add_argument("--arch", default="sm_80", choices=SUPPORTED_ARCHS)
    v.add_argument("--budget", type=int, help="isl scheduler budget (operations)")
    add_shapes_argument(v)
    v.set_defaults(func=run_viz)
    e = sub.add_parser(
        "explain",
        help="print the fusion decisions for one op's edges",
        description="Compile MODEL and print what happened to each producer->consumer edge "
        "of --op (every edge without it).",
    )
    e.add_argument("model", metavar="MODEL", help=model_help)
    e.add_argument("--op", metavar="NAME", help="primitive (or composite) name")
    e.add_argument("--size", help="zoo model size")
    e.add_argument("--arch", default="sm_80", choices=SUPPORTED_ARCHS)
    e.add_argument("--budget", type=int, help="isl scheduler budget (operations)")
    add_shapes_argument(e)
    e.set_defaults(func=run_explain)


def run_viz(args: argparse.Namespace) -> int:
    fn = compile_model(args.model, args.size, args.arch, args.budget, parse_shapes(args.shapes))
    data = visualize(fn, args.out, args.json)
    c = data["counts"]
    print(
        f"wrote {args.out}: {c['primitives']} primitives, {c['micrographs']} micrographs, "
        f"{c['kernels']} kernels, {os.path.getsize(args.out)} bytes"
        + (f"; JSON {args.json}" if args.json else ""),
        file=sys.stderr,
    )
    return 0


def run_explain(args: argparse.Namespace) -> int:
    fn = compile_model(args.model, args.size, args.arch, args.budget, parse_shapes(args.shapes))
    print(explain(extract(fn), args.op))
    return 0
