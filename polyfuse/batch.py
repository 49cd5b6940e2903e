"""``polyfuse zoo``: batch compilation of model zoos.

``polyfuse zoo [MODELS or DIRS...]`` compiles many models in parallel and reports, per model,
the primitives, micrographs, kernels, stitched kernels, cache hits and compile seconds per stage,
as a terminal table and (``--json``) as JSON. Arguments are model arguments as
:mod:`polyfuse.models` reads them: zoo names (none = the whole zoo), example names, ``.onnx``
files, directories of ``.onnx`` files, ``.py`` files, or ``module:function`` builders.

Executors: one process per model, ``--jobs N`` at a time (``--executor process``, default the
CPU count), or Ray (``--executor ray``, imported lazily; ``pip install 'polyfuse[ray]'``): a
private local Ray, or a running cluster named by ``--ray-address`` / ``$RAY_ADDRESS``
(:mod:`polyfuse.batch_ray`, which checks every node first). Every model compiles in its own
task; a model that fails — or whose worker dies (killed, out of memory) — is reported with a
one-line reason and the others finish (exit status 1 when any failed, 0 otherwise, 2 on bad
arguments, an unknown model among them, before anything is compiled). Progress (tqdm, on
stderr) shows the ETA and the models still running; ``--json -`` puts the JSON report alone on
stdout (the table then goes to stderr).

Caching, two levels, both under ``--cache-dir`` (default ``$POLYFUSE_CACHE`` or
``~/.cache/polyfuse``; ``--no-cache`` disables both):

* the kernel cache of :func:`polyfuse.compile` (``cache=`` a :class:`polyfuse.cache.CompileCache`
  under ``<dir>/compile``) when this polyfuse has one: identical micrographs within and across
  models are scheduled and generated once; its hits and misses are reported per model;
* a model-level cache (``<dir>/zoo``): the key is a structural hash of the whole graph (every
  compute's loop nest, shapes, dtypes, names and the inputs/constants/outputs boundary; weight
  *values* are not part of it), the arch, the CUDA-check flag, the polyfuse version and a digest
  of the compiler's own source files. An entry holds the compile summary and the CUDA source,
  so a warm run only builds each graph and hashes it. Entries are :class:`polyfuse.base.store.Store`
  entries (versioned, checksummed, replaced atomically): a corrupt one is recompiled and healed.

Modules: this one is the command; :mod:`polyfuse.batch_task` (one model, compiled in a
worker), :mod:`polyfuse.batch_hash` (the model cache key), :mod:`polyfuse.batch_executors`
(processes), :mod:`polyfuse.batch_ray` and :mod:`polyfuse.batch_probe` (Ray, and the check of
its workers), :mod:`polyfuse.batch_progress` (progress) and :mod:`polyfuse.batch_report`
(table and JSON).
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from polyfuse.base.settings import DEFAULT_CACHE_ROOT, cache_root
from polyfuse.batch_executors import run_batch
from polyfuse.batch_hash import graph_hash
from polyfuse.batch_progress import Progress
from polyfuse.batch_ray import RAY_EPILOG
from polyfuse.batch_report import format_table, summary
from polyfuse.batch_task import ModelReport, Task, compile_task, resolve_tasks
from polyfuse.cli_common import add_arch, add_common, positive_int, write_json
from polyfuse.errors import PolyfuseError
from polyfuse.shapes_arg import add_shapes_argument, check_shapes_apply, parse_shapes

__all__ = [
    "ModelReport",
    "Task",
    "add_zoo_parser",
    "compile_task",
    "format_table",
    "graph_hash",
    "resolve_tasks",
    "run_batch",
    "run_zoo",
]

EXIT_OK, EXIT_FAIL, EXIT_ERROR = 0, 1, 2


def default_cache_dir() -> str:
    """``$POLYFUSE_CACHE`` or ``~/.cache/polyfuse``."""
    return str(cache_root() or DEFAULT_CACHE_ROOT)


def add_zoo_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``polyfuse zoo`` on the ``polyfuse`` subparsers ``sub``."""
    from polyfuse.zoo import MODELS

    p = sub.add_parser(
        "zoo",
        help="batch-compile the built-in model zoo, .onnx files or directories",
        description=textwrap.fill(
            "Compile many models in parallel (a process per model, or Ray) and report kernels, "
            "cache hits and compile seconds per stage. No argument: the built-in zoo. A model "
            "that fails is reported and the others finish; exit status 1 if any failed, 2 on "
            "bad arguments (an unknown model among them: nothing is compiled).",
            width=79,
        ),
        epilog="built-in models:\n"
        + "\n".join(f"  {n:<13} {s.description}" for n, s in MODELS.items())
        + "\n\n"
        + RAY_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "models",
        nargs="*",
        metavar="MODEL",
        help="zoo or example names, .onnx files, directories of .onnx files, .py files, "
        "or module:function (default: the whole built-in zoo)",
    )
    p.add_argument(
        "--jobs",
        "-j",
        metavar="N",
        type=positive_int,
        default=None,
        help="models compiled at once (default: the CPUs here, or the Ray cluster's)",
    )
    p.add_argument(
        "--executor",
        choices=("process", "ray"),
        default="process",
        help="a process per model on this machine (default), or Ray tasks (a private local "
        "Ray, or a cluster with --ray-address)",
    )
    p.add_argument(
        "--ray-address",
        metavar="ADDR",
        default=None,
        help="with --executor ray: the Ray cluster to connect to (HOST:PORT of the head, "
        "ray://HOST:10001, or auto); default $RAY_ADDRESS, else a private local Ray",
    )
    add_arch(p)
    p.add_argument(
        "--cache-dir",
        metavar="DIR",
        default=None,
        help="cache root (default: $POLYFUSE_CACHE or ~/.cache/polyfuse)",
    )
    p.add_argument("--no-cache", action="store_true", help="no model or kernel cache")
    p.add_argument(
        "--no-cuda-check", action="store_true", help="skip the NVRTC/nvcc compile of each model"
    )
    p.add_argument(
        "--save",
        metavar="DIR",
        default=None,
        help="write each compiled model to DIR/<model>.pfa (fn.save: CUDA source, cubin for "
        "--arch, launches, weights), for polyfuse.load without the compiler",
    )
    add_shapes_argument(p)
    add_common(p, size=True, tiny_alias=True, json="the report (run, models, cache totals)")
    p.set_defaults(func=run_zoo)
    return p


def run_zoo(args: argparse.Namespace) -> int:
    """``polyfuse zoo``: compile, print the table, write JSON; the exit status."""
    cache_dir = None if args.no_cache else (args.cache_dir or default_cache_dir())
    if args.verbose >= 2:
        os.environ["POLYFUSE_DEBUG"] = "1"  # workers print the traceback of a failed model
    if args.ray_address and args.executor != "ray":
        raise PolyfuseError("--ray-address needs --executor ray")
    shapes = parse_shapes(args.shapes)
    tasks = resolve_tasks(
        args.models,
        size=args.size,
        arch=args.arch,
        cache_dir=cache_dir,
        check_cuda=not args.no_cuda_check,
        shapes=shapes,
        save_dir=str(Path(args.save).resolve()) if args.save else None,
    )
    invalid = [t for t in tasks if t.kind == "invalid"]  # before any work: exit status 2
    if invalid:
        raise PolyfuseError("; ".join(t.reason for t in invalid))
    check_shapes_apply(tasks, shapes)
    t0 = time.perf_counter()
    progress = Progress(len(tasks), quiet=args.quiet)
    reports = run_batch(
        tasks,
        jobs=args.jobs,
        executor=args.executor,
        progress=progress,
        ray_address=args.ray_address,
    )
    wall = time.perf_counter() - t0
    print(format_table(reports))
    doc = summary(
        reports,
        arch=args.arch,
        size=args.size,
        executor=args.executor,
        jobs=progress.workers,
        cache_dir=cache_dir,
        wall_seconds=wall,
        **({"ray": progress.where} if args.executor == "ray" else {}),
    )
    c = doc["cache"]
    line = f"wall {wall:.2f} s; model cache {c['model_hits']}/{len(reports)} hits"
    if c["kernel_hits"] + c["kernel_misses"]:
        line += f"; kernel cache {c['kernel_hits']}/{c['kernel_hits'] + c['kernel_misses']} hits"
    print(line)
    if args.save:
        saved = sum(1 for r in reports if r.get("artifact"))
        print(f"saved {saved} artifacts to {args.save} (polyfuse.load runs them)")
    for r in reports:
        if r["status"] != "ok":
            print(f"polyfuse: error: {r['name']}: {r['reason']}", file=sys.stderr)
    write_json(args, doc)
    return EXIT_FAIL if doc["failed"] else EXIT_OK
