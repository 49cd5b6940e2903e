"""``polyfuse zoo``: batch compilation of model zoos.

``polyfuse zoo [MODELS or DIRS...]`` compiles many models in parallel and reports, per model,
the primitives, micrographs, kernels, stitched kernels, cache hits and compile seconds per stage,
as a terminal table and (``--json``) as JSON. Arguments are model arguments as
:mod:`polyfuse.models` reads them: zoo names (none = the whole zoo), example names, ``.onnx``
files, directories of ``.onnx`` files, ``.py`` files, or ``module:function`` builders.

Executors: one process per model, ``--jobs N`` at a time (``--executor process``, default the
CPU count), or Ray (``--executor ray``, imported lazily; ``pip install 'polyfuse[ray]'``). Every
model compiles in its own task; a model that fails — or whose worker dies (killed, out of
memory) — is reported with a one-line reason and the others finish (exit status 1 when any
failed, 0 otherwise, 2 on bad arguments).

Caching, two levels, both under ``--cache-dir`` (default ``$POLYFUSE_CACHE`` or
``~/.cache/polyfuse``; ``--no-cache`` disables both):

* the kernel cache of :func:`polyfuse.compile` (``cache=`` a :class:`polyfuse.cache.CompileCache`
  under ``<dir>/compile``) when this polyfuse has one: identical micrographs within and across
  models are scheduled and generated once; its hits and misses are reported per model;
* a model-level cache (``<dir>/zoo``): the key is a structural hash of the whole graph (every
  compute's loop nest, shapes, dtypes, names and the inputs/constants/outputs boundary; weight
  *values* are not part of it), the arch, the CUDA-check flag, the polyfuse version and a digest
  of the compiler's own source files. An entry holds the compile summary and the CUDA source,
  so a warm run only builds each graph and hashes it. Entries are :class:`polyfuse.store.Store`
  entries (versioned, checksummed, replaced atomically): a corrupt one is recompiled and healed.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import inspect
import json
import multiprocessing
import multiprocessing.connection as mp_connection
import os
import pickle
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import polyfuse
from polyfuse.errors import PolyfuseError
from polyfuse.models import LoadedModel, ModelSource, load_model, resolve_models
from polyfuse.settings import DEFAULT_CACHE_ROOT, cache_root
from polyfuse.shapes_arg import add_shapes_argument, parse_shapes
from polyfuse.store import Store, write_atomic

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
RAY_HINT = "pip install 'polyfuse[ray]'"


# --------------------------------------------------------------------------- tasks and reports


@dataclass
class Task:
    """One model to compile (a resolved :class:`polyfuse.models.ModelSource` and options)."""

    label: str
    kind: str  # polyfuse.models.KINDS: "zoo" | "example" | "onnx" | "pyfile" | "python" | "invalid"
    spec: str
    size: str = "full"
    arch: str = "sm_80"
    cache_dir: str | None = None
    check_cuda: bool = True
    reason: str = ""  # for kind == "invalid"
    #: ONNX input name -> dims (``--shapes``), for models with dynamic input dims
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()


@dataclass
class ModelReport:
    """What compiling one model gave (JSON-serialisable through :func:`dataclasses.asdict`)."""

    name: str
    source: str
    status: str = "error"  # "ok" | "error"
    reason: str = ""
    primitives: int | None = None
    micrographs: int | None = None
    kernels: int | None = None
    stitched_kernels: int | None = None
    model_cache: str = "off"  # "hit" | "miss" | "off"
    kernel_cache_hits: int | None = None
    kernel_cache_misses: int | None = None
    seconds: dict[str, float] = field(default_factory=dict)  # this run, per stage
    compile_seconds: dict[str, float] = field(default_factory=dict)  # the (cold) compile
    total_seconds: float = 0.0
    cuda: str = ""
    key: str = ""


# --------------------------------------------------------------------------- hashing


@functools.cache
def _compiler_digest() -> str:
    """Digest of the compiler's source files: a changed compiler misses the model cache."""
    import polyfuse.cuda
    import polyfuse.graph
    import polyfuse.poly
    import polyfuse.stitch

    h = hashlib.sha256(polyfuse.__version__.encode())
    dirs = [Path(polyfuse.__file__).parent] + [
        Path(m.__file__).parent
        for m in (polyfuse.graph, polyfuse.poly, polyfuse.stitch, polyfuse.cuda)
        if m.__file__
    ]
    for d in dirs:
        for p in sorted(d.glob("*.py")):
            if p.name != "batch.py":
                h.update(p.name.encode())
                h.update(p.read_bytes())
    for p in sorted((dirs[-1] / "emulator_rt").glob("*")) if len(dirs) > 1 else []:
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def graph_hash(inputs: Sequence[Any], outputs: Sequence[Any], constants: Sequence[Any]) -> str:
    """A structural hash of a te graph.

    Tensors are numbered in first-visit order and loop variables by their first appearance
    in each compute, so two separately built copies of the same model hash equal; placeholder
    names, shapes, dtypes, tags, constants and the input/output order are part of the hash;
    compute names (often generated, ``add17``) and weight values are not. Expression nodes
    are hashed generically from their dataclass fields.
    """
    from polyfuse.graph.expr import IterVar, Tensor

    h = hashlib.sha256()
    tensor_ids: dict[int, int] = {}
    order: list[Tensor] = []
    const_ids = {id(t) for t in constants}

    def visit(root: Tensor) -> None:
        stack: list[tuple[Tensor, bool]] = [(root, False)]
        while stack:
            t, done = stack.pop()
            if id(t) in tensor_ids:
                continue
            if done or t.op is None:
                tensor_ids[id(t)] = len(order)
                order.append(t)
                continue
            stack.append((t, True))
            stack.extend((s, False) for s in reversed(t.op.inputs()))

    for t in [*inputs, *constants, *outputs]:
        visit(t)

    def enc(v: Any, vars_: dict[int, int]) -> str:
        if isinstance(v, Tensor):
            return f"T{tensor_ids.get(id(v), -1)}"
        if isinstance(v, IterVar):
            n = vars_.setdefault(id(v), len(vars_))
            return f"V{n}:{v.kind}:{v.lo}:{v.hi}"
        if dataclasses.is_dataclass(v):
            parts = [
                enc(getattr(v, f.name), vars_) for f in dataclasses.fields(v) if f.name != "uid"
            ]
            return f"{type(v).__name__}(" + ",".join(parts) + ")"
        if isinstance(v, list | tuple):
            return "[" + ",".join(enc(x, vars_) for x in v) + "]"
        return repr(v)

    for t in order:
        kind = "C" if id(t) in const_ids else "P" if t.op is None else "F"
        # computes are numbered, not named: ops' generated names (``add17``) depend on what
        # was built before in the process; placeholder names are the call interface
        head = f"{kind}|{t.name if t.op is None else ''}|{t.shape}|{t.dtype}|"
        body = ""
        if t.op is not None:
            vars_: dict[int, int] = {}
            axes = ",".join(enc(a, vars_) for a in t.op.axes)
            body = f"{t.op.tag}|{axes}|{enc(t.op.body, vars_)}"
        h.update((head + body + "\n").encode())
    boundary = [tensor_ids[id(t)] for t in inputs], [tensor_ids[id(t)] for t in outputs]
    h.update(repr(boundary).encode())
    return h.hexdigest()


# --------------------------------------------------------------------------- one model (worker)


def _load(task: Task) -> LoadedModel:
    """Build or import the model of ``task``."""
    source = ModelSource(task.label, task.kind, task.spec, task.reason)
    return load_model(source, task.size, dict(task.shapes))


#: Bump when what a model-cache entry holds changes.
ZOO_ENTRY_VERSION = 1
_SUMMARY = ("primitives", "micrographs", "kernels", "stitched_kernels", "cuda")


def _model_store(task: Task) -> Store | None:
    """The model-level cache (``<cache_dir>/zoo``), None when caching is off."""
    return Store(Path(task.cache_dir) / "zoo", "zoo", ZOO_ENTRY_VERSION) if task.cache_dir else None


def _model_entry(store: Store, key: str) -> dict[str, Any] | None:
    """The cached summary of model ``key``; None when missing, corrupt or incomplete."""
    entry = store.read_json(f"{key}.json")
    if not isinstance(entry, dict) or not all(k in entry for k in (*_SUMMARY, "compile_seconds")):
        return None
    return entry


def _one_line(e: BaseException) -> str:
    msg = " ".join(str(e).split()) or type(e).__name__
    return msg if isinstance(e, PolyfuseError) else f"{type(e).__name__}: {msg}"


def compile_task(task: Task) -> dict[str, Any]:
    """Compile one model (in a worker); never raises: failures become ``status="error"``."""
    rep = ModelReport(task.label, task.spec)
    start = time.perf_counter()
    stage = "loading"
    try:
        os.environ["POLYFUSE_CACHE"] = (
            str(Path(task.cache_dir).resolve()) if task.cache_dir else "off"
        )
        t0 = time.perf_counter()
        model = _load(task)
        inputs, outputs, constants = model.inputs, model.outputs, model.constants
        rep.seconds["build"] = time.perf_counter() - t0

        stage = "hashing"
        t0 = time.perf_counter()
        salt = f"{task.arch}|cuda {task.check_cuda}|{_compiler_digest()}"
        rep.key = hashlib.sha256(
            (graph_hash(inputs, outputs, list(constants)) + salt).encode()
        ).hexdigest()[:32]
        rep.seconds["hash"] = time.perf_counter() - t0
        store = _model_store(task)
        stage = "reading the cache"
        t0 = time.perf_counter()
        entry = _model_entry(store, rep.key) if store is not None else None

        if entry is not None:
            for k in _SUMMARY:
                setattr(rep, k, entry[k])
            rep.compile_seconds = entry["compile_seconds"]
            rep.model_cache = "hit"
            rep.seconds["cache"] = time.perf_counter() - t0
        else:
            stage = "compiling"
            rep.model_cache = "miss" if store is not None else "off"
            kwargs: dict[str, Any] = {}
            kcache = None
            if "cache" in inspect.signature(polyfuse.compile).parameters:
                from polyfuse.cache import CompileCache

                kcache = CompileCache(Path(task.cache_dir) / "compile" if task.cache_dir else None)
                kwargs["cache"] = kcache
            fn = polyfuse.compile(
                inputs,
                outputs,
                task.arch,
                constants=constants,
                check_cuda=False,
                name=task.label,
                **kwargs,
            )
            rep.seconds.update(fn.plan.seconds)
            stats = getattr(fn, "cache_stats", None)
            if kcache is not None and isinstance(stats, dict):
                rep.kernel_cache_hits = int(stats.get("hits", 0))
                rep.kernel_cache_misses = int(stats.get("misses", 0))
            rep.primitives = len(fn.plan.graph.prims)
            rep.micrographs = len(fn.plan.micrographs)
            rep.kernels = len(fn.kernels)
            # Layer 2 kernels of several micrographs, also inside a Layer 3 pack
            packs = [d for d in getattr(fn.plan, "packs", []) if d.packed]
            inside = {d.name for d in packs}
            rep.stitched_kernels = sum(
                len(k.micrographs) > 1 for k in fn.kernels if k.name not in inside
            ) + sum(len(m) > 1 for d in packs for m in d.micrographs)
            if task.check_cuda:
                stage = "compiling CUDA"
                t0 = time.perf_counter()
                binary = fn.check_cuda(task.arch, required=False)
                rep.seconds["cuda"] = time.perf_counter() - t0
                rep.cuda = (
                    f"{binary.compiler} {task.arch}"
                    if binary is not None
                    else "no NVRTC/nvcc: not compiled"
                )
            rep.compile_seconds = {k: v for k, v in rep.seconds.items() if k != "hash"}
            if store is not None:
                stage = "writing the cache"
                write_atomic(store.path(f"{rep.key}.cu"), fn.cuda_source.encode())
                entry = {k: getattr(rep, k) for k in _SUMMARY}
                entry.update(
                    name=task.label,
                    arch=task.arch,
                    polyfuse=polyfuse.__version__,
                    compile_seconds=rep.compile_seconds,
                )
                store.write_json(f"{rep.key}.json", entry)  # last: it marks the entry complete
        rep.status = "ok"
    except Exception as e:  # error isolation: one line, the batch goes on
        rep.status = "error"
        rep.reason = f"{stage}: {_one_line(e)}"
        if not isinstance(e, PolyfuseError) and os.environ.get("POLYFUSE_DEBUG"):
            traceback.print_exc()
    rep.total_seconds = time.perf_counter() - start
    return dataclasses.asdict(rep)


# --------------------------------------------------------------------------- resolving arguments


def resolve_tasks(
    specs: Sequence[str],
    *,
    size: str = "full",
    arch: str = "sm_80",
    cache_dir: str | None = None,
    check_cuda: bool = True,
    shapes: dict[str, tuple[int, ...]] | None = None,
) -> list[Task]:
    """Turn command-line arguments into tasks (no argument: the whole built-in zoo); see
    :func:`polyfuse.models.resolve_models`. Unknown names become ``kind="invalid"`` tasks,
    reported as failed models.
    """
    common = dict(
        size=size,
        arch=arch,
        cache_dir=cache_dir,
        check_cuda=check_cuda,
        shapes=tuple((shapes or {}).items()),
    )
    return [Task(m.label, m.kind, m.spec, reason=m.reason, **common) for m in resolve_models(specs)]


# --------------------------------------------------------------------------- executors, progress


class Progress:
    """A progress bar on stderr: redrawn in place on a terminal, one line per model otherwise."""

    def __init__(self, total: int, stream: TextIO | None = None, quiet: bool = False) -> None:
        self.total, self.done, self.failed = total, 0, 0
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start = time.perf_counter()

    def _bar(self) -> str:
        width = 24
        fill = width * self.done // max(self.total, 1)
        failed = f", {self.failed} failed" if self.failed else ""
        return (
            f"[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total}{failed} "
            f"{time.perf_counter() - self.start:.1f} s"
        )

    def started(self, n_workers: int, executor: str) -> None:
        if not self.quiet:
            print(
                f"polyfuse zoo: {self.total} models, {n_workers} {executor} workers",
                file=self.stream,
                flush=True,
            )

    def finished(self, rep: dict[str, Any]) -> None:
        self.done += 1
        self.failed += rep["status"] != "ok"
        if self.quiet:
            return
        if rep["status"] == "ok":
            cached = " (cached)" if rep["model_cache"] == "hit" else ""
            what = f"ok, {rep['kernels']} kernels, {rep['total_seconds']:.1f} s{cached}"
        else:
            what = f"FAILED: {rep['reason']}"
        line = f"{rep['name']}: {what}"
        if self.tty:
            print(f"\r\x1b[K  {line}\n{self._bar()}", end="", file=self.stream, flush=True)
            if self.done == self.total:
                print(file=self.stream, flush=True)
        else:
            print(f"{self._bar()} {line}", file=self.stream, flush=True)


def _task_main(task: Task, conn: Any) -> None:
    """A worker process: compile one task and send its report to the parent."""
    conn.send(compile_task(task))
    conn.close()


def _died(task: Task, exitcode: int | None) -> dict[str, Any]:
    """The report of a task whose worker process ended without sending one."""
    if exitcode is not None and exitcode < 0:
        how = f"was killed by {signal.Signals(-exitcode).name}"
        if -exitcode == signal.SIGKILL:
            how += " (out of memory, or killed by hand)"
    else:
        how = f"exited with status {exitcode} without a report"
    reason = f"worker died: the process compiling '{task.label}' {how}; the other models went on"
    return dataclasses.asdict(ModelReport(task.label, task.spec, reason=reason))


def _run_process(tasks: list[Task], jobs: int, on_done: Callable[[int, dict], None]) -> None:
    """One process per task, at most ``jobs`` at a time.

    A pool would not do: when one of its workers dies (SIGKILL, the OOM killer), a process
    pool breaks and fails every pending task with it. A process of its own per task ties a
    death to exactly one model, which is reported as failed while the others go on.
    """
    # fork: workers start with polyfuse already imported (the parent is single-threaded)
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    queue = list(range(len(tasks)))[::-1]
    running: dict[Any, tuple[int, Any]] = {}  # receiving end of the pipe -> (task, process)
    try:
        while queue or running:
            while queue and len(running) < jobs:
                i = queue.pop()
                recv, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_task_main, args=(tasks[i], send), name=tasks[i].label)
                proc.start()
                send.close()  # the parent keeps no write end: a dead worker reads as EOF
                running[recv] = (i, proc)
            for recv in mp_connection.wait(list(running)):
                i, proc = running.pop(recv)
                try:
                    rep = recv.recv()
                except (EOFError, OSError, ValueError, pickle.UnpicklingError):
                    rep = None  # died before (or while) sending its report
                recv.close()
                proc.join()
                on_done(i, rep if isinstance(rep, dict) else _died(tasks[i], proc.exitcode))
    finally:
        for recv, (_, proc) in running.items():  # interrupted: stop the workers still running
            proc.kill()
            proc.join()
            recv.close()


def _run_ray(tasks: list[Task], jobs: int, on_done: Callable[[int, dict], None]) -> None:
    try:
        import ray
    except ImportError:
        raise PolyfuseError(
            f"--executor ray needs Ray, which is not installed: {RAY_HINT}"
        ) from None
    started_here = not ray.is_initialized()
    if started_here:
        env = {"POLYFUSE_CACHE": os.environ.get("POLYFUSE_CACHE", "")}
        path = os.environ.get("PYTHONPATH")
        if path:
            env["PYTHONPATH"] = path
        ray.init(
            num_cpus=jobs,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            runtime_env={"env_vars": {k: v for k, v in env.items() if v}},
        )
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(compile_task)
        refs = {remote.remote(t): i for i, t in enumerate(tasks)}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            i = refs[ready[0]]
            try:
                rep = ray.get(ready[0])
            except Exception as e:  # the worker died
                rep = dataclasses.asdict(
                    ModelReport(tasks[i].label, tasks[i].spec, reason=f"worker died: {e}")
                )
            on_done(i, rep)
    finally:
        if started_here:
            ray.shutdown()


def run_batch(
    tasks: list[Task],
    *,
    jobs: int | None = None,
    executor: str = "process",
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Compile ``tasks`` in parallel; one report dict per task, in task order."""
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(tasks) or 1))
    prog = progress or Progress(len(tasks), quiet=True)
    prog.started(jobs, executor)
    reports: list[dict[str, Any] | None] = [None] * len(tasks)

    def on_done(i: int, rep: dict[str, Any]) -> None:
        reports[i] = rep
        prog.finished(rep)

    # arguments that name nothing are reported without a worker
    runnable = []
    for i, t in enumerate(tasks):
        if t.kind == "invalid":
            on_done(i, compile_task(t))
        else:
            runnable.append(i)
    sub = [tasks[i] for i in runnable]
    if sub:
        run = {"process": _run_process, "ray": _run_ray}.get(executor)
        if run is None:
            raise PolyfuseError(f"unknown executor '{executor}': use 'process' or 'ray'")
        run(sub, jobs, lambda j, rep: on_done(runnable[j], rep))
    return [r for r in reports if r is not None]


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


# --------------------------------------------------------------------------- the command


def default_cache_dir() -> str:
    """``$POLYFUSE_CACHE`` or ``~/.cache/polyfuse``."""
    return str(cache_root() or DEFAULT_CACHE_ROOT)


def add_zoo_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``polyfuse zoo`` on the ``polyfuse`` subparsers ``sub``."""
    from polyfuse.driver import SUPPORTED_ARCHS
    from polyfuse.zoo import MODELS

    p = sub.add_parser(
        "zoo",
        help="batch-compile the built-in model zoo, .onnx files or directories",
        description=(
            "Compile many models in parallel (a process per model, or Ray) and report kernels, "
            "cache hits and compile seconds per stage. No argument: the built-in zoo. A model "
            "that fails is reported and the others finish; exit status 1 if any failed."
        ),
        epilog="built-in models:\n"
        + "\n".join(f"  {n:<13} {s.description}" for n, s in MODELS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "models",
        nargs="*",
        metavar="MODEL",
        help="zoo names, .onnx files, directories of .onnx files, or module:function",
    )
    p.add_argument("--jobs", "-j", type=int, default=None, help="parallel workers (default: CPUs)")
    p.add_argument("--executor", choices=("process", "ray"), default="process")
    p.add_argument("--arch", default="sm_80", choices=SUPPORTED_ARCHS)
    p.add_argument("--tiny", action="store_true", help="the zoo models at their tiny size")
    p.add_argument("--json", metavar="PATH", help="write the report as JSON")
    p.add_argument(
        "--cache-dir", metavar="DIR", default=None, help="cache root (default: ~/.cache/polyfuse)"
    )
    p.add_argument("--no-cache", action="store_true", help="no model or kernel cache")
    p.add_argument("--no-cuda-check", action="store_true", help="skip the NVRTC/nvcc compile")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    add_shapes_argument(p)
    p.set_defaults(func=run_zoo)
    return p


def run_zoo(args: argparse.Namespace) -> int:
    """``polyfuse zoo``: compile, print the table, write JSON; the exit status."""
    if args.jobs is not None and args.jobs < 1:
        raise PolyfuseError("--jobs must be at least 1")
    cache_dir = None if args.no_cache else (args.cache_dir or default_cache_dir())
    size = "tiny" if args.tiny else "full"
    tasks = resolve_tasks(
        args.models,
        size=size,
        arch=args.arch,
        cache_dir=cache_dir,
        check_cuda=not args.no_cuda_check,
        shapes=parse_shapes(args.shapes),
    )
    t0 = time.perf_counter()
    reports = run_batch(
        tasks,
        jobs=args.jobs,
        executor=args.executor,
        progress=Progress(len(tasks), quiet=args.quiet),
    )
    wall = time.perf_counter() - t0
    print(format_table(reports))
    doc = summary(
        reports,
        arch=args.arch,
        size=size,
        executor=args.executor,
        jobs=args.jobs or os.cpu_count(),
        cache_dir=cache_dir,
        wall_seconds=wall,
    )
    c = doc["cache"]
    line = f"wall {wall:.2f} s; model cache {c['model_hits']}/{len(reports)} hits"
    if c["kernel_hits"] + c["kernel_misses"]:
        line += f"; kernel cache {c['kernel_hits']}/{c['kernel_hits'] + c['kernel_misses']} hits"
    print(line)
    for r in reports:
        if r["status"] != "ok":
            print(f"polyfuse: error: {r['name']}: {r['reason']}", file=sys.stderr)
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return EXIT_FAIL if doc["failed"] else EXIT_OK
