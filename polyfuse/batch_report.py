"""The report of a ``polyfuse zoo`` batch: the terminal table and the JSON summary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polyfuse

# --------------------------------------------------------------------------- reporting


def _fmt_s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def format_table(reports: Sequence[dict[str, Any]]) -> str:
    """The terminal table: one row per model and a total line."""
    head = (
        "model", "status", "prims", "micrographs", "kernels", "stitched", "cache",
        "kernel hits", "compile s", "this run s",
    )  # fmt: skip

    def num(v: Any) -> str:
        return "-" if v is None else str(v)

    def khits(r: dict) -> str:
        if r["kernel_cache_hits"] is None:
            return "-"
        n = r["kernel_cache_hits"] + (r["kernel_cache_misses"] or 0)
        return f"{r['kernel_cache_hits']}/{n}"

    rows = [
        (
            r["name"],
            r["status"].upper() if r["status"] != "ok" else "ok",
            num(r["primitives"]),
            num(r["micrographs"]),
            num(r["kernels"]),
            num(r["stitched_kernels"]),
            r["model_cache"],
            khits(r),
            _fmt_s(sum(r["compile_seconds"].values()) if r["compile_seconds"] else None),
            _fmt_s(r["total_seconds"]),
        )
        for r in reports
    ]
    ok = [r for r in reports if r["status"] == "ok"]
    hits = sum(r["model_cache"] == "hit" for r in reports)
    total = (
        "total",
        f"{len(ok)}/{len(reports)} ok",
        num(sum(r["primitives"] or 0 for r in ok)),
        num(sum(r["micrographs"] or 0 for r in ok)),
        num(sum(r["kernels"] or 0 for r in ok)),
        num(sum(r["stitched_kernels"] or 0 for r in ok)),
        f"{hits} hits",
        "",
        _fmt_s(sum(sum(r["compile_seconds"].values()) for r in ok)),
        _fmt_s(sum(r["total_seconds"] for r in reports)),
    )
    widths = [max(len(row[c]) for row in [head, *rows, total]) for c in range(len(head))]

    def line(row: Sequence[str]) -> str:
        pairs = enumerate(zip(row, widths, strict=True))
        cells = [v.ljust(w) if c < 2 else v.rjust(w) for c, (v, w) in pairs]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(head), rule, *map(line, rows), rule, line(total)])


def summary(reports: Sequence[dict[str, Any]], **meta: Any) -> dict[str, Any]:
    """The JSON document: run metadata, per-model reports and cache totals."""
    n = len(reports)
    hits = sum(r["model_cache"] == "hit" for r in reports)
    khits = sum(r["kernel_cache_hits"] or 0 for r in reports)
    kmiss = sum(r["kernel_cache_misses"] or 0 for r in reports)
    return {
        "polyfuse": polyfuse.__version__,
        **meta,
        "models": list(reports),
        "failed": [r["name"] for r in reports if r["status"] != "ok"],
        "cache": {
            "model_hits": hits,
            "model_hit_rate": hits / n if n else 0.0,
            "kernel_hits": khits,
            "kernel_misses": kmiss,
            "kernel_hit_rate": khits / (khits + kmiss) if khits + kmiss else 0.0,
        },
    }
