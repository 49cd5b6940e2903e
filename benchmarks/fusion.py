"""Fusion benchmark: kernels and global-memory bytes of the twelve suite subgraphs.

Usage::

    python benchmarks/fusion.py [--only NAMES] [--emulate-scale N] [--no-emulate]
                                [--json PATH] [--peers PATH] [--arch sm_80] [--seed S]
    python benchmarks/fusion.py --models [NAMES] [--size full|tiny] [--no-inductor] ...

``--models`` measures whole zoo models instead (launches, functions, layout-only kernels,
compulsory and intermediate bytes, Inductor's kernel counts): :mod:`fusion_models`.

For every subgraph of :mod:`suite` at full size: primitives, micrographs, kernels, exact global
bytes (isl footprints of every kernel, ``fn.global_bytes()``), compulsory bytes, their ratio and
the wall time of ``polyfuse.compile``. Unless ``--no-emulate``, the subgraph is also built at
1/N of its non-reduced size, run on the CPU emulator with random inputs, checked against the
numpy reference, and the emulator's byte count is compared with isl's at that size. The peers'
kernel counts and traffic (``<repo>/../shared/bench/peers.json``) are printed beside ours.

Nothing here is timed on a GPU; the only times are compile times on this machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import suite  # noqa: E402

import polyfuse  # noqa: E402

PEERS = ("inductor", "xla_cpu", "xla_cpu_no_ynnpack")
PEER_SHORT = {"inductor": "inductor", "xla_cpu": "xla_cpu", "xla_cpu_no_ynnpack": "xla_noynn"}
DEFAULT_PEERS = REPO.parent / "shared" / "bench" / "peers.json"
DEFAULT_JSON = HERE / "results" / "fusion.json"
RTOL = 1e-4
ATOL = 2e-5  # float32 sums of ~1e4 terms (batch-norm statistics) round at this level


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- measurements


def _compile(name: str, scale: int, arch: str) -> tuple[Any, Any, float]:
    inputs, outputs, ref = suite.build(name, scale)
    t0 = time.perf_counter()
    fn = polyfuse.compile(inputs=inputs, outputs=outputs, arch=arch, name=name)
    return fn, ref, time.perf_counter() - t0


def _not_fused(fn: Any) -> list[str]:
    """The plan's refused producer→consumer edges (why there is more than one kernel)."""
    return [str(d) for d in fn.plan.partition.decisions if not d.fused]


def _cuda_check(fn: Any, arch: str) -> dict[str, Any] | None:
    """The NVRTC/nvcc step of ``polyfuse.compile`` (check_cuda="auto"), if a compiler ran."""
    b = fn.cuda_binaries.get(arch)
    if b is None:
        return None
    return {"compiler": b.compiler, "seconds": b.seconds, "cached": b.cached}


def measure_full(name: str, arch: str) -> dict[str, Any]:
    fn, _, seconds = _compile(name, 1, arch)
    return {
        "inputs": [[t.name, list(t.shape)] for t in fn.inputs],
        "outputs": [[t.name, list(t.shape)] for t in fn.outputs],
        "primitives": len(fn.plan.graph.prims),
        "micrographs": len(fn.plan.micrographs),
        "kernels": len(fn.kernels),
        "global_bytes": fn.global_bytes(),
        "compulsory_bytes": fn.compulsory_bytes(),
        "ratio": fn.global_bytes() / fn.compulsory_bytes(),
        "compile_s": seconds,
        "compile_stage_s": dict(fn.plan.seconds),
        "cuda_check": _cuda_check(fn, arch),
        "kernel_list": [
            {
                "name": k.name,
                "grid": list(k.grid),
                "block": list(k.block),
                "micrographs": list(k.micrographs),
                "bytes_read": k.bytes_read,
                "bytes_written": k.bytes_written,
                "registers": k.registers,
            }
            for k in fn.kernels
        ],
        "micrograph_list": [str(m) for m in fn.plan.micrographs],
        "not_fused": _not_fused(fn),
        "feedback": [str(e) for e in fn.plan.feedback],
    }


def load_emulator() -> str | None:
    """None when the emulator imports, else why it cannot be used."""
    try:
        import polyfuse.cuda.emulator  # noqa: F401
    except ImportError as e:
        return f"polyfuse.cuda.emulator cannot be imported ({e})"
    return None


def measure_emulated(name: str, scale: int, arch: str, seed: int) -> dict[str, Any]:
    """Run at 1/scale on the emulator; check outputs and emulator bytes against isl bytes."""
    fn, ref, seconds = _compile(name, scale, arch)
    arrays = suite.random_inputs(name, fn.inputs, seed)
    t0 = time.perf_counter()
    got = fn(*arrays, device="emulate")
    run_s = time.perf_counter() - t0
    got = got if isinstance(got, tuple) else (got,)
    want = ref(*arrays)
    outputs = []
    ok = True
    for t, g, w in zip(fn.outputs, got, want, strict=True):
        g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64).reshape(g.shape)
        err = np.abs(g64 - w64)
        scaled = err / (ATOL + RTOL * np.abs(w64))
        finite = bool(np.isfinite(g64).all())
        worst = float(np.nanmax(scaled)) if scaled.size else 0.0
        this_ok = finite and worst <= 1.0
        ok &= this_ok
        outputs.append(
            {
                "name": t.name,
                "shape": list(t.shape),
                "ok": this_ok,
                "finite": finite,
                "max_abs_err": float(np.nanmax(err)) if err.size else 0.0,
                "max_err_over_tol": worst,
            }
        )
    per_kernel = []
    for k, tr in zip(fn.kernels, fn.last_traffic, strict=False):
        per_kernel.append(
            {
                "kernel": k.name,
                "isl_read": k.bytes_read,
                "isl_written": k.bytes_written,
                "emulator_read": tr.bytes_read,
                "emulator_written": tr.bytes_written,
                "emulator_requested": tr.bytes_requested,
                "match": (k.bytes_read, k.bytes_written) == (tr.bytes_read, tr.bytes_written),
            }
        )
    isl_bytes, emu_bytes = fn.global_bytes(), fn.traffic_bytes()
    bytes_match = (
        isl_bytes == emu_bytes
        and len(fn.last_traffic) == len(fn.kernels)
        and all(p["match"] for p in per_kernel)
    )
    return {
        "scale": scale,
        "inputs": [[t.name, list(t.shape)] for t in fn.inputs],
        "kernels": len(fn.kernels),
        "outputs_ok": ok,
        "outputs": outputs,
        "isl_bytes": isl_bytes,
        "emulator_bytes": emu_bytes,
        "requested_bytes": fn.requested_bytes(),
        "compulsory_bytes": fn.compulsory_bytes(),
        "bytes_match": bytes_match,
        "per_kernel": per_kernel,
        "compile_s": seconds,
        "emulate_s": run_s,
    }


# --------------------------------------------------------------------------- peers


def load_peers(path: Path) -> tuple[dict[str, Any], str | None]:
    if not path.is_file():
        return {}, f"peers file {path} not found; peer columns are empty"
    try:
        data = json.loads(path.read_text())
        return data.get("subgraphs", {}), None
    except (OSError, ValueError) as e:
        return {}, f"peers file {path} unreadable ({e}); peer columns are empty"


def peer_row(peers: dict[str, Any], name: str) -> dict[str, Any] | None:
    p = peers.get(name)
    if p is None:
        return None
    row: dict[str, Any] = {
        "primitives": p.get("primitives"),
        "compulsory_bytes": p.get("compulsory_bytes"),
        "unfused_bytes": p.get("unfused_bytes"),
    }
    for peer in PEERS:
        q = p.get(peer) or {}
        row[peer] = {"kernels": q.get("kernels"), "traffic_bytes": q.get("traffic_bytes")}
    return row


# --------------------------------------------------------------------------- printing


def _fmt(v: Any, spec: str = "") -> str:
    return "-" if v is None else format(v, spec)


def _table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(header), line(["-" * w for w in widths]), *[line(r) for r in rows]]


def render(results: dict[str, Any], meta: dict[str, Any]) -> str:
    out: list[str] = []
    scale = meta["emulate_scale"]
    out.append(
        f"polyfuse fusion benchmark, arch {meta['arch']} (no GPU: no kernel times are measured)"
    )
    out.append(
        "Bytes are exact isl footprints (distinct global bytes read + written by every kernel, "
        "fn.global_bytes()) at FULL size;"
    )
    out.append("compulsory = inputs read once + outputs written once; ratio = global / compulsory.")
    if meta["emulate"]:
        out.append(
            f"Emulator check ran at 1/{scale} scale (non-reduced dims divided by {scale}): "
            f"outputs vs numpy (rtol {RTOL:g}, atol {ATOL:g}), emulator-counted bytes vs isl "
            "bytes at that scale (distinct; requested = every load and store, repeats "
            "included)."
        )
    else:
        out.append(f"Emulator check: not run ({meta['emulate_skipped']}).")
    out.append("")

    # Table 1: ours at full size, with the emulator check.
    header = [
        "subgraph",
        "prims",
        "mgs",
        "kernels",
        "global B (isl)",
        "compulsory B",
        "ratio",
        "compile s",
        f"emulate 1/{scale}",
    ]
    rows = []
    for name, r in results.items():
        f = r.get("full")
        if f is None:
            rows.append([name, "-", "-", "-", "-", "-", "-", "-", f"COMPILE FAILED: {r['error']}"])
            continue
        rows.append(
            [
                name,
                str(f["primitives"]),
                str(f["micrographs"]),
                str(f["kernels"]),
                str(f["global_bytes"]),
                str(f["compulsory_bytes"]),
                f"{f['ratio']:.2f}",
                f"{f['compile_s']:.2f}",
                _emu_cell(r.get("emulated"), meta),
            ]
        )
    total = sum(r["full"]["compile_s"] for r in results.values() if r.get("full"))
    out += _table(header, rows, right={1, 2, 3, 4, 5, 6, 7})
    out.append(f"total compile time at full size: {total:.2f} s")
    checks = [r["full"]["cuda_check"] for r in results.values() if r.get("full")]
    ran = [c for c in checks if c]
    if ran:
        cached = sum(c["cached"] for c in ran)
        out.append(
            f"compile s = wall time of polyfuse.compile, including its CUDA check "
            f"({ran[0]['compiler']}, {sum(c['seconds'] for c in ran):.2f} s in all; "
            f"{cached} of {len(ran)} from the disk cache, POLYFUSE_CACHE=off for cold times)"
        )
    elif checks:
        out.append("compile s = wall time of polyfuse.compile (no CUDA compiler found: no check)")
    out.append("")

    # Table 2: beside the peers.
    out.append(
        "Kernels and traffic beside the peers (peers.json: CPU back ends, static traffic "
        "estimates; ours = exact isl bytes). Traffic as MB (1e6 B) and x compulsory."
    )
    if meta.get("peers_note"):
        out.append(f"  note: {meta['peers_note']}")
    header = [
        "subgraph",
        "prims ours/peers",
        "kernels ours",
        *[PEER_SHORT[p] for p in PEERS],
        "traffic ours",
        *[PEER_SHORT[p] for p in PEERS],
    ]
    rows = []
    for name, r in results.items():
        f, p = r.get("full"), r.get("peers")
        comp = (p or {}).get("compulsory_bytes") or (f or {}).get("compulsory_bytes")

        def traffic(b: int | None, comp: int | None = comp) -> str:
            if b is None:
                return "-"
            return f"{b / 1e6:.1f} ({b / comp:.2f}x)" if comp else f"{b / 1e6:.1f}"

        row = [
            name,
            f"{_fmt((f or {}).get('primitives'))}/{_fmt((p or {}).get('primitives'))}",
            _fmt((f or {}).get("kernels")),
        ]
        row += [_fmt(((p or {}).get(q) or {}).get("kernels")) for q in PEERS]
        row.append(traffic((f or {}).get("global_bytes")))
        row += [traffic(((p or {}).get(q) or {}).get("traffic_bytes")) for q in PEERS]
        rows.append(row)
    out += _table(header, rows, right=set(range(1, len(header))))
    out.append("")

    # Notes: compulsory cross-check, kernel counts above the peers' minimum, mismatches.
    notes = []
    for name, r in results.items():
        f, p, e = r.get("full"), r.get("peers"), r.get("emulated")
        if f and p and p.get("compulsory_bytes") not in (None, f["compulsory_bytes"]):
            notes.append(
                f"{name}: compulsory bytes differ from peers.json ({f['compulsory_bytes']} vs "
                f"{p['compulsory_bytes']}): the graph is not the one the peers measured"
            )
        if f and p:
            ks = [p[q]["kernels"] for q in PEERS if p[q]["kernels"] is not None]
            if ks and f["kernels"] > min(ks):
                notes.append(
                    f"{name}: {f['kernels']} kernels > peers' minimum {min(ks)}; "
                    f"not fused in the plan: " + "; ".join(f["not_fused"])
                )
        if e and not e.get("skipped") and not e.get("error"):
            if not e["bytes_match"]:
                notes.append(
                    f"{name}: MISMATCH at 1/{e['scale']}: emulator counted "
                    f"{e['emulator_bytes']} B, isl {e['isl_bytes']} B; per kernel: "
                    + ", ".join(
                        f"{k['kernel']} isl {k['isl_read']}+{k['isl_written']} emu "
                        f"{k['emulator_read']}+{k['emulator_written']}"
                        for k in e["per_kernel"]
                        if not k["match"]
                    )
                )
            if not e["outputs_ok"]:
                bad = [o for o in e["outputs"] if not o["ok"]]
                notes.append(
                    f"{name}: WRONG RESULTS at 1/{e['scale']}: "
                    + ", ".join(
                        f"{o['name']} max abs err {o['max_abs_err']:.3g} "
                        f"({o['max_err_over_tol']:.3g}x tolerance, finite={o['finite']})"
                        for o in bad
                    )
                )
        if e and e.get("error"):
            notes.append(f"{name}: emulator run failed at 1/{e['scale']}: {e['error']}")
    if notes:
        out.append("Notes:")
        out += [f"  - {n}" for n in notes]
    return "\n".join(out)


def _emu_cell(e: dict[str, Any] | None, meta: dict[str, Any]) -> str:
    if e is None or e.get("skipped"):
        return "skipped"
    if e.get("error"):
        return f"ERROR: {e['error'][:60]}"
    res = "ok" if e["outputs_ok"] else "WRONG"
    req = f", requested {e['requested_bytes']}" if "requested_bytes" in e else ""
    if e["bytes_match"]:
        return f"{res}; bytes isl = emu = {e['isl_bytes']} distinct{req}"
    return f"{res}; MISMATCH isl {e['isl_bytes']} != emu {e['emulator_bytes']} distinct{req}"


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        help="subgraphs to run (space- or comma-separated); default all: " + ", ".join(suite.NAMES),
    )
    ap.add_argument(
        "--emulate-scale",
        type=int,
        default=64,
        metavar="N",
        help="divide the non-reduced dims by N for the emulator check (default 64)",
    )
    ap.add_argument("--no-emulate", action="store_true", help="skip the emulator cross-check")
    ap.add_argument(
        "--json",
        type=Path,
        default=DEFAULT_JSON,
        metavar="PATH",
        help=f"where to write the results (default {DEFAULT_JSON.relative_to(REPO)})",
    )
    ap.add_argument(
        "--peers",
        type=Path,
        default=DEFAULT_PEERS,
        metavar="PATH",
        help="peers.json (default <repo>/../shared/bench/peers.json)",
    )
    ap.add_argument("--arch", default="sm_80", help="target architecture (default sm_80)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random emulator inputs")
    ap.add_argument(
        "--models",
        nargs="*",
        metavar="NAME",
        help="whole zoo models instead of subgraphs (options: fusion_models.py --help)",
    )
    args = ap.parse_args(argv)
    if args.emulate_scale < 1:
        ap.error("--emulate-scale must be >= 1")
    names = list(suite.NAMES)
    if args.only:
        names = [n for item in args.only for n in item.split(",") if n]
        unknown = [n for n in names if n not in suite.NAMES]
        if unknown:
            ap.error(
                f"unknown subgraph(s) {', '.join(unknown)}; choose from {', '.join(suite.NAMES)}"
            )
    args.names = names
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--models" in argv:  # whole zoo models: their own options (fusion_models.py --help)
        import fusion_models

        return fusion_models.main(argv)
    args = parse_args(argv)
    peers, peers_note = load_peers(args.peers)
    if peers_note:
        log(peers_note)
    emulate = not args.no_emulate
    skipped = "--no-emulate" if not emulate else None
    if emulate:
        why = load_emulator()
        if why:
            log(f"emulator check skipped: {why}")
            emulate, skipped = False, why
    meta = {
        "arch": args.arch,
        "emulate": emulate,
        "emulate_scale": args.emulate_scale,
        "emulate_skipped": skipped,
        "rtol": RTOL,
        "atol": ATOL,
        "peers_file": str(args.peers),
        "peers_note": peers_note,
        "polyfuse_version": polyfuse.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "bytes": "exact isl footprints at full size (fn.global_bytes())",
        "gpu_timings": "none measured",
    }
    results: dict[str, Any] = {}
    failed = False
    for i, name in enumerate(args.names, 1):
        log(f"[{i}/{len(args.names)}] {name}: compiling at full size ...")
        r: dict[str, Any] = {"scaled": suite.SCALED[name], "peers": peer_row(peers, name)}
        results[name] = r
        try:
            r["full"] = measure_full(name, args.arch)
        except Exception as e:  # noqa: BLE001 - report and go on with the next subgraph
            r["full"] = None
            r["error"] = f"{type(e).__name__}: {e}"
            r["traceback"] = traceback.format_exc()
            log(f"  compile failed: {r['error']}")
            failed = True
            continue
        log(f"  {r['full']['kernels']} kernels, compile {r['full']['compile_s']:.2f} s")
        if not emulate:
            r["emulated"] = {"skipped": skipped}
            continue
        log(f"  emulating at 1/{args.emulate_scale} ...")
        try:
            e = measure_emulated(name, args.emulate_scale, args.arch, args.seed)
        except Exception as ex:  # noqa: BLE001
            e = {
                "scale": args.emulate_scale,
                "error": f"{type(ex).__name__}: {ex}",
                "traceback": traceback.format_exc(),
            }
            log(f"  emulator run failed: {e['error']}")
            failed = True
        else:
            failed |= not (e["outputs_ok"] and e["bytes_match"])
            log(
                f"  emulated in {e['emulate_s']:.2f} s: "
                f"outputs {'ok' if e['outputs_ok'] else 'WRONG'}, "
                f"bytes {'match' if e['bytes_match'] else 'MISMATCH'}"
            )
        r["emulated"] = e

    print(render(results, meta))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"meta": meta, "subgraphs": results}, indent=1) + "\n")
    log(f"wrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
