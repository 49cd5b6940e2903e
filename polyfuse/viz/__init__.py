"""The scheduling debug visualizer: what polyfuse decided for a graph, and why.

``fn.visualize("report.html")`` / ``polyfuse viz MODEL -o report.html [--json out.json]`` write
one self-contained HTML page (no network); ``polyfuse explain MODEL [--op NAME]`` prints the
decisions of one op's edges. All three read the same data, :func:`extract`.

This package only reads a compiled graph (the compiler calls it from ``fn.visualize``); the
command line that compiles a model first is :mod:`polyfuse.viz.command`.
"""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path
from typing import Any

from polyfuse.viz.extract import REASON_KINDS, extract, kinds_present
from polyfuse.viz.template import TEMPLATE

__all__ = [
    "REASON_KINDS",
    "explain",
    "extract",
    "kinds_present",
    "render_html",
    "visualize",
]


def render_html(data: dict[str, Any]) -> str:
    """The report page for ``data`` (from :func:`extract`): one self-contained HTML file.

    The data travels gzip-compressed and base64-encoded (the page inflates it with the
    browser's ``DecompressionStream``): BERT-base's 3.4 MB of JSON become about 0.35 MB.
    ``mtime=0`` keeps the page byte-identical for identical data.
    """
    raw = json.dumps(data, separators=(",", ":")).encode("utf-8")
    blob = base64.b64encode(gzip.compress(raw, compresslevel=9, mtime=0)).decode("ascii")
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
        out.append(f"      in plain words: {p['plain']}")
        if d["stitch"]:
            out.append(f"    stitch: {d['stitch']['text']}")
            out.append(f"      in plain words: {d['stitch']['plain']}")
        for s in d["refusals"]:
            out.append(f"    stitch refused: {s['text']}")
            out.append(f"      in plain words: {s['plain']}")
        if d["placement"]:
            pl = d["placement"]
            fp = f", footprint {pl['bytes']} B" if pl["bytes"] else ""
            out.append(f"    lives in: {pl['space']} ({pl['reason']}{fp})")
            out.append(f"      in plain words: {pl['plain']}")
        for n in d["notes"]:
            out.append(f"    note: {n}")
    kernels = {p["kernel"] for p in data["prims"] if p["id"] in sel}
    for k in data["kernels"]:
        if k["id"] in kernels and k["memory"]["engine"]:
            out.append(f"kernel {k['id']}: {k['memory']['plain']}")
    return "\n".join(out)
