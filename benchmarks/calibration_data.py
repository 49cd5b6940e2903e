"""Rebuild the kernels of a measured GPU day and store what the cost model's calibration needs.

    python benchmarks/calibration_data.py --commit fc634f1 --day 2026-11-22 \\
        --measured ../shared/bench/gpu/h100-2026-11-22.json
    python benchmarks/calibration_data.py --commit fcb3b1c --day 2026-11-25 \\
        --measured benchmarks/measured/h100-2026-11-25-fcb3b1c.json --models

Each measured day timed the kernels polyfuse generated at one commit. This script rebuilds them:

1. ``git archive COMMIT`` into a scratch folder and a virtual environment there whose
   site-packages see this one's dependencies (a ``_base.pth`` line, as ``/work/mkwt.sh``
   does), ``pip install -e . --no-deps --no-build-isolation``;
2. that tree's polyfuse compiles the 17 cases of ``benchmarks/gpu_cases.py`` (the 12 suite
   subgraphs at full size and the 5 compute cases) for sm_90 exactly as the GPU benchmark's
   ``--prepare`` does (``polyfuse.compile(inputs, outputs, arch)``), and writes each case's
   CUDA source with its kernels' launch shapes and isl byte counts (:func:`dump`, run with the
   old tree's Python);
3. today's SASS instrument (:mod:`polyfuse.cuda.toolchain.sass`, NVRTC + nvdisasm) analyses each
source,
   and :func:`polyfuse.cuda.codegen.kernel_cost.describe_sass` turns every kernel into the cost
   model's typed description (:class:`polyfuse.poly.costs.KernelDesc`: per-thread instruction
   mix, registers, shared memory, launch, DRAM bytes);
4. the descriptions and the measured times go into ``benchmarks/measured/calibration_kernels.json``
   under the day (``--day``), replacing that day's entry; with ``--models``, the day's whole
   models too (BERT-base, GPT-2, ResNet-50, ViT-B/16 at full size, each kernel description once
   with its count), an optional validation.

``benchmarks/calibration.py`` and ``tests/test_cost_model.py`` read only that file: they need
neither git history nor a disassembler. Needs NVRTC and ``polyfuse[sass]`` here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DATA = HERE / "measured" / "calibration_kernels.json"
ARCH = "sm_90"
#: The GPU benchmark's cases (``gpu_cases.SUITE`` and ``gpu_cases.COMPUTE``), repeated here so
#: that :func:`dump` runs in a tree older than ``gpu_cases.py``.
SUITE = (
    "layernorm", "layernorm_lib", "softmax", "log_softmax", "bias_gelu_tanh",
    "residual_layernorm", "attn_softmax", "lstm_cell", "batchnorm_train_relu", "adam3",
    "two_branches", "rmsnorm_swiglu",
)  # fmt: skip
COMPUTE = {
    "ffn_up_gelu": ("matmul_bias_gelu", {"m": 8192, "k": 768, "n": 3072}),
    "matmul_4096": ("matmul_bias_gelu", {"m": 4096, "k": 4096, "n": 4096}),
    "conv3x3_relu": ("conv2d_relu", {"batch": 32, "channels": 64, "size": 56, "filters": 64}),
    "attention_s128": ("attention", {"batch": 16, "heads": 12, "seq": 128, "dim": 64}),
    "attention_s512": ("attention", {"batch": 8, "heads": 12, "seq": 512, "dim": 64}),
}


# ----------------------------------------------------------------- runs in the old tree


def dump(tree: Path, out: Path, models: Sequence[str] = ()) -> None:
    """Compile every case (or the zoo ``models`` at full size) with the polyfuse of ``tree``
    (the running interpreter's) and write the sources, kernels and launches to ``out`` (JSON).
    Uses only the API every commit since 2026-11-22 has: ``polyfuse.compile``,
    ``benchmarks/suite.build``, ``polyfuse.examples``, ``polyfuse.zoo.build``."""
    sys.path.insert(0, str(tree / "benchmarks"))
    import suite  # the tree's own

    import polyfuse
    from polyfuse import examples, zoo

    cases = {}
    for name in models or (*SUITE, *COMPUTE):
        constants = None
        if models:
            m = zoo.build(name, "full", weights="zeros")
            inputs, outputs, constants = m.inputs, m.outputs, m.constants
        elif name in SUITE:
            inputs, outputs, _ = suite.build(name, 1)
        else:
            example, args = COMPUTE[name]
            inputs, outputs, _ = getattr(examples, example)(**args)
        fn = polyfuse.compile(inputs, outputs, arch=ARCH, name=name, constants=constants)
        launched = {lc.kernel: lc.shared_bytes for lc in fn.launches}  # dynamic bytes
        mapped = dict(zip([k.name for k in fn.plan.kernels], fn.plan.mapped, strict=True))
        kernels = []
        for k in fn.kernels:
            dynamic = launched.get(k.name, 0)
            block_read = _block_read_bytes(mapped.get(k.name))
            kernels.append(
                {
                    "name": k.name,
                    "function": getattr(k, "function", "") or k.name,
                    "grid": list(k.grid),
                    "block": list(k.block),
                    "shared_bytes": k.shared_bytes,
                    "dynamic_shared_bytes": dynamic,
                    "bytes_read": k.bytes_read,
                    "bytes_written": k.bytes_written,
                    "vector_bytes": getattr(k, "vector_bytes", 0),
                    "registers": k.registers,
                    "block_read_bytes": block_read,
                }
            )
        cases[name] = {
            "source": fn.cuda_source,
            "kernels": kernels,
            "compulsory_bytes": fn.compulsory_bytes(),
        }
        print(f"  compiled {name}: {len(kernels)} kernels", flush=True)
    out.write_text(json.dumps(cases))


def _block_read_bytes(mm: Any) -> int | None:
    """Distinct bytes of global inputs the first block of a one-element-per-thread kernel
    reads (isl: the statement instances whose mapped band point lies in the first block tile,
    through their read accesses), or None for another mapping (GEMM tiles, reductions with
    lanes: their reads are tile fills or streams, which the SASS counts give)."""
    import islpy as isl

    if mm is None or getattr(mm, "strategy", None) is not None:
        return None
    if getattr(mm, "layout", None) is not None or len(getattr(mm, "parts", [0])) > 1:
        return None
    sm = mm.scheduled
    root = sm.schedule.get_root()
    band = root.child(0) if root.has_children() else None
    if band is None or band.get_type() != isl.schedule_node_type.band:
        return None
    n = len(mm.tile_sizes)
    part = isl.UnionMap.from_multi_union_pw_aff(band.band_get_partial_schedule())
    part = part.intersect_domain(sm.schedule.get_domain())
    names = [f"p{i}" for i in range(band.band_n_member())]
    box = zip(mm.extents, mm.tile_sizes, strict=True)
    cons = " and ".join(f"{lo} <= p{i} < {lo + t}" for i, ((lo, _), t) in enumerate(box))
    first = isl.Set(f"{{ [{', '.join(names)}] : {cons} }}", context=sm.model.ctx)
    inst = part.intersect_range(isl.UnionSet.from_set(first)).domain()
    if n > band.band_n_member() or inst.is_empty():
        return None
    reads = sm.model.reads.intersect_domain(inst).range()
    total = 0
    sets = reads.get_set_list()
    for s in (sets.get_at(i) for i in range(sets.n_set())):
        role = sm.model.tensors.get(s.get_tuple_name())
        if role is not None and role.role == "input":
            total += s.count_val().to_python() * 4
    return total


# ----------------------------------------------------------------- runs here


def _tree(commit: str, scratch: Path) -> tuple[Path, Path]:
    """(tree, python) of ``commit`` in ``scratch``, installed in a venv of its own."""
    tree = scratch / commit
    if not (tree / "pyproject.toml").is_file():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    python = tree / ".venv" / "bin" / "python"
    if not python.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(tree / ".venv")], check=True)
        import site

        here = next(p for p in site.getsitepackages() if p.endswith("site-packages"))
        base = [Path(here)] + [
            Path(ln.strip()) for f in Path(here).glob("_base.pth") for ln in f.read_text().split()
        ]
        py = f"python{sys.version_info.major}.{sys.version_info.minor}"
        pth = tree / ".venv" / "lib" / py / "site-packages" / "_base.pth"
        pth.write_text("\n".join(str(b) for b in base) + "\n")
        pip = [str(python), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "-e", ".", "--no-deps", "--no-build-isolation"], cwd=tree, check=True)
    return tree, python


def _measured(path: Path) -> dict[str, dict[str, Any]]:
    """Per case: the polyfuse time (ms) and, where a run timed them, per-kernel times."""
    d = json.loads(path.read_text())
    run = d.get("run", d)
    out: dict[str, dict[str, Any]] = {}
    if isinstance(run.get("cases"), dict):  # the 2026-11-22 format
        for name, c in run["cases"].items():
            out[name] = {"ms": c["polyfuse_ms"], "per_kernel_ms": c.get("per_kernel_ms", {})}
    else:  # benchmarks/gpu.py --run
        for c in run["results"]:
            out[c["name"]] = {"ms": c["polyfuse_ms"], "per_kernel_ms": c.get("per_kernel_ms", {})}
    return out


def describe_cases(raw: dict[str, Any]) -> dict[str, Any]:
    """Analyse every case's source with today's SASS instrument: the cost model's kernel
    descriptions (JSON) per case."""
    from polyfuse.cuda.codegen.kernel_cost import describe_sass
    from polyfuse.cuda.toolchain.sass import analyse

    out = {}
    for name, case in raw.items():
        shells = [_Shell(**k) for k in case["kernels"]]
        report = analyse(case["source"], (ARCH,), kernels=shells, name=name)
        descs = []
        for shell, ks in zip(shells, report.kernels, strict=True):
            desc = describe_sass(
                ks, shell.bytes_read, shell.bytes_written, shell.vector_bytes, shell.block_read
            )
            descs.append(desc.to_json())
        out[name] = {"compulsory_bytes": case["compulsory_bytes"], "kernels": descs}
        print(f"  analysed {name}: {len(descs)} kernels", flush=True)
    return out


class _Shell:
    """What :func:`polyfuse.cuda.toolchain.sass.analyse` reads of a kernel, from a dumped record."""

    def __init__(self, name, function, grid, block, shared_bytes, dynamic_shared_bytes,
                 bytes_read, bytes_written, vector_bytes, registers,
                 block_read_bytes=None):  # fmt: skip
        self.name, self.function = name, function
        self.grid, self.block = tuple(grid), tuple(block)
        self.dynamic_shared_bytes = dynamic_shared_bytes
        self.bytes_read, self.bytes_written = bytes_read, bytes_written
        self.vector_bytes, self.registers = vector_bytes, registers
        self.block_read = block_read_bytes
        self.body: list = []


def _raw(args: Any, tree: Path, python: Path, what: str, models: Sequence[str] = ()) -> Any:
    """The dump of ``tree``'s cases (or ``models``), made once per commit in the scratch."""
    path = args.scratch / f"{args.commit}.{what}.json"
    if not path.is_file():
        env = dict(os.environ, POLYFUSE_CACHE=str(args.scratch / f"{args.commit}.cache"))
        print(f"compiling the {what} at {args.commit} ({tree})", flush=True)
        argv = [str(python), str(Path(__file__).resolve()), "--dump", str(tree), str(path)]
        subprocess.run([*argv, "--dump-models", *models], check=True, env=env, cwd=tree)
    return json.loads(path.read_text())


def _deduplicated(kernels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A model's kernel descriptions, identical ones (but for the name) once with a count."""
    out: dict[str, dict[str, Any]] = {}
    for k in kernels:
        key = json.dumps({n: v for n, v in k.items() if n != "name"}, sort_keys=True)
        if key in out:
            out[key]["count"] += 1
        else:
            out[key] = {**k, "count": 1}
    return list(out.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commit", help="the commit whose kernels the GPU day timed")
    ap.add_argument("--day", help="the measured day's key in the data file (its date)")
    ap.add_argument("--measured", type=Path, help="the GPU day's JSON")
    ap.add_argument("--device", default="NVIDIA H100 80GB HBM3")
    ap.add_argument("--scratch", type=Path, default=Path(tempfile.gettempdir()) / "pf-calib")
    ap.add_argument("--out", type=Path, default=DATA)
    ap.add_argument(
        "--models",
        action="store_true",
        help="also the day's whole models (its JSON's 'models' section), kernels deduplicated",
    )
    ap.add_argument("--dump", nargs=2, metavar=("TREE", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--dump-models", nargs="*", default=(), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.dump:
        dump(Path(args.dump[0]), Path(args.dump[1]), args.dump_models)
        return 0
    if not (args.commit and args.day and args.measured):
        ap.error("--commit, --day and --measured are required")
    tree, python = _tree(args.commit, args.scratch)
    cases = describe_cases(_raw(args, tree, python, "raw"))
    measured = _measured(args.measured)
    for name, c in cases.items():
        c["measured_ms"] = measured[name]["ms"]
        if measured[name]["per_kernel_ms"]:
            c["measured_per_kernel_ms"] = measured[name]["per_kernel_ms"]
    models = {}
    if args.models:
        rows = json.loads(args.measured.read_text())["models"]["models"]
        names = [r["model"] for r in rows]
        described = describe_cases(_raw(args, tree, python, "models", names))
        for r in rows:
            models[r["model"]] = {
                "measured_ms": r["polyfuse_ms"],
                "measured_breakdown_ms": r.get("breakdown_ms", {}),
                "kernels": _deduplicated(described[r["model"]]["kernels"]),
            }
    data = json.loads(args.out.read_text()) if args.out.is_file() else {"days": {}}
    data["about"] = (
        "Kernels timed on measured GPU days, as the cost model describes them (polyfuse.poly."
        "costs.KernelDesc, instruction mix from today's SASS instrument, sm_90). Written by "
        "benchmarks/calibration_data.py; read by benchmarks/calibration.py and "
        "tests/test_cost_model.py."
    )
    data["days"][args.day] = {
        "commit": args.commit,
        "device": args.device,
        "measured": args.measured.name,
        "arch": ARCH,
        "cases": cases,
        **({"models": models} if models else {}),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out} ({args.day}: {len(cases)} cases)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
