"""One model of a ``polyfuse zoo`` batch: the task, its report, and compiling it in a worker.

:func:`compile_task` never raises: a model that fails becomes a ``status="error"`` report with
a one-line reason. The model-level cache entry (``<cache_dir>/zoo``) is keyed by
:func:`polyfuse.batch_hash.graph_hash` plus the arch, the CUDA-check flag and the compiler
digest."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import os
import re
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polyfuse
from polyfuse.base.store import Store, write_atomic
from polyfuse.batch_hash import compiler_digest, graph_hash
from polyfuse.errors import PolyfuseError
from polyfuse.models import LoadedModel, ModelSource, load_model, resolve_models

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
    #: ``--save DIR``: write the compiled model there as an artifact (``fn.save``)
    save_dir: str | None = None


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
    artifact: str = ""  # the file ``--save`` wrote


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
        salt = f"{task.arch}|cuda {task.check_cuda}|{compiler_digest()}"
        rep.key = hashlib.sha256(
            (graph_hash(inputs, outputs, list(constants)) + salt).encode()
        ).hexdigest()[:32]
        rep.seconds["hash"] = time.perf_counter() - t0
        store = _model_store(task)
        stage = "reading the cache"
        t0 = time.perf_counter()
        # --save needs the compiled graph: a model-cache hit holds only its summary
        entry = _model_entry(store, rep.key) if store is not None and not task.save_dir else None

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
            if task.save_dir:
                stage = "saving the artifact"
                rep.artifact = str(save_artifact(fn, task))
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


def save_artifact(fn: Any, task: Task) -> Path:
    """``fn`` saved as ``<save_dir>/<label>.pfa`` with a cubin for the task's arch (the CUDA
    source only under ``--no-cuda-check`` or where no CUDA compiler is installed)."""
    from polyfuse.artifact import SUFFIX
    from polyfuse.errors import CompilerNotFound

    assert task.save_dir is not None
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", task.label).strip("._") or "model"
    path = Path(task.save_dir) / f"{name}{SUFFIX}"
    try:
        return fn.save(path, archs=[task.arch] if task.check_cuda else ())
    except CompilerNotFound:
        return fn.save(path, archs=())


# --------------------------------------------------------------------------- resolving arguments


def resolve_tasks(
    specs: Sequence[str],
    *,
    size: str = "full",
    arch: str = "sm_80",
    cache_dir: str | None = None,
    check_cuda: bool = True,
    shapes: dict[str, tuple[int, ...]] | None = None,
    save_dir: str | None = None,
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
        save_dir=save_dir,
    )
    return [Task(m.label, m.kind, m.spec, reason=m.reason, **common) for m in resolve_models(specs)]
