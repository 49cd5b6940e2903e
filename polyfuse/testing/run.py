"""Compile random graphs, run them on the emulator and compare against the reference evaluator.

One emulator build (a g++ run, most of a small graph's cost) is shared by a *batch* of graphs:
:func:`run_batch` merges several disjoint specs into one compile, so Layer 3 packing of
independent kernels is exercised too, and only when the batch fails are its graphs run alone
to find the guilty one (a batch that fails while every graph passes alone is itself the
failure).

Comparison (:func:`compare`) is NaN-aware and scaled by the graph's own sensitivity: NaN
positions must match and infinities must match exactly; finite values must agree within
``atol + rtol * |want|`` plus a multiple of how far the reference moves when the inputs are
perturbed by a relative ``PERTURB`` (three trials). A graph that amplifies rounding — a sum that
cancels, a comparison on a computed value that sits on its threshold — thereby gets the slack it
needs at exactly the elements that need it, and no slack anywhere else.
"""

from __future__ import annotations

import tempfile
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import polyfuse
from polyfuse.cache import CompileCache
from polyfuse.errors import PolyfuseError
from polyfuse.graph.expr import Tensor
from polyfuse.reference import evaluate, tolerance

from .build import build, input_values
from .generate import GraphSpec, draw, merge

__all__ = [
    "Outcome",
    "check_spec",
    "compare",
    "perturbed_references",
    "reference_values",
    "run_batch",
]

RTOL = tolerance("float32").rtol  # the per-dtype table of polyfuse.graph.dtypes
ATOL = tolerance("float32").atol
PERTURB = 1e-5
SLACK = 8.0  # multiple of the perturbed reference's spread that is allowed
TRIALS = 3


@dataclass
class Outcome:
    """What happened to one graph: status "pass", "mismatch", "crash" (an exception that is not
    a PolyfuseError: a polyfuse bug), "error" (a PolyfuseError on a valid graph) or "silent"
    (a graph that must be refused was built)."""

    spec: GraphSpec
    status: str
    detail: str = ""
    kernels: int = 0
    wrong: dict[str, str] = field(default_factory=dict)  # of a mismatch: output -> why

    @property
    def failed(self) -> bool:
        return self.status in ("mismatch", "crash", "error", "silent")


# --------------------------------------------------------------------------- reference


def reference_values(
    spec: GraphSpec, feeds: dict[str, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """Every tensor of ``spec`` (inputs and computes) by name, from the reference evaluator."""
    spec = spec.pruned()
    feeds = input_values(spec) if feeds is None else feeds
    _, _, ts = build(spec)
    computes = [n.name for n in spec.nodes if n.kind != "input"]
    got = evaluate([ts[c] for c in computes], {ts[k]: v for k, v in feeds.items() if k in ts})
    return {**feeds, **dict(zip(computes, got, strict=True))}


def perturbed_references(
    outputs: Sequence[Tensor], feeds: Mapping[Tensor, np.ndarray], seed: int = 0
) -> list[list[np.ndarray]]:
    """The reference outputs for :data:`TRIALS` copies of ``feeds``, each value moved by a
    random relative amount of at most :data:`PERTURB` (what :func:`compare` measures the
    graph's sensitivity with)."""
    rng = np.random.default_rng([seed, 7919])
    trials = []
    for _ in range(TRIALS):
        moved = {
            t: (v * (1 + PERTURB * rng.uniform(-1, 1, np.shape(v)))).astype(np.float32)
            for t, v in feeds.items()
        }
        trials.append(evaluate(list(outputs), moved))
    return trials


def compare(
    name: str, got: np.ndarray, want: np.ndarray, perturbed: Sequence[np.ndarray] = ()
) -> str:
    """Why ``got`` is not ``want`` (one line), or "" when it agrees (see the module docstring)."""
    got = np.asarray(got)
    if got.shape != want.shape:
        return f"output '{name}' has shape {got.shape}, reference {want.shape}"
    g = got.astype(np.float64)
    w = want.astype(np.float64)
    spread = np.zeros(w.shape)
    unstable = np.zeros(w.shape, dtype=bool)  # NaN-ness or infinity moves under perturbation
    with np.errstate(all="ignore"):
        for p in perturbed:
            p = p.astype(np.float64)
            unstable |= (np.isnan(p) != np.isnan(w)) | (np.isinf(p) & (p != w))
            d = np.abs(p - w)
            spread = np.maximum(spread, np.where(np.isfinite(d), d, 0.0))
        nan_bad = (np.isnan(g) != np.isnan(w)) & ~unstable
        if nan_bad.any():
            at = tuple(int(i) for i in np.argwhere(nan_bad)[0])
            return (
                f"output '{name}': NaN positions differ at {int(nan_bad.sum())} of {w.size} "
                f"elements, first at {at}: got {float(g[at])!r}, want {float(w[at])!r}"
            )
        inf_bad = (np.isinf(w) | np.isinf(g)) & (g != w) & ~unstable & ~np.isnan(w)
        if inf_bad.any():
            at = tuple(int(i) for i in np.argwhere(inf_bad)[0])
            return (
                f"output '{name}': infinities differ, first at {at}: "
                f"got {float(g[at])!r}, want {float(w[at])!r}"
            )
        fin = np.isfinite(w) & np.isfinite(g) & ~unstable
        tol = ATOL + RTOL * np.abs(w) + SLACK * spread
        err = np.where(fin, np.abs(g - w) - tol, -1.0)
    if (err > 0).any():
        at = np.unravel_index(int(np.argmax(err)), w.shape)
        at_s = tuple(int(i) for i in at)
        return (
            f"output '{name}': {int((err > 0).sum())} of {w.size} elements differ; worst at "
            f"{at_s}: got {g[at]:.7g}, want {w[at]:.7g} (tolerance {tol[at]:.3g})"
        )
    return ""


# --------------------------------------------------------------------------- running


def _compile(inputs: list, outputs: list, cache_twice: bool) -> tuple[Any, str]:
    """The compiled graph; with ``cache_twice``, compiled cold then warm through one fresh
    on-disk compile cache, and why the two differ ("" when they give the same CUDA and the
    same kernels: a plan must not depend on where its parts came from)."""
    if not cache_twice:
        return polyfuse.compile(inputs, outputs, check_cuda=False, name="fuzz"), ""
    with tempfile.TemporaryDirectory(prefix="pf-fuzz-cache-") as d:
        cold = polyfuse.compile(
            inputs, outputs, check_cuda=False, name="fuzz", cache=CompileCache(d)
        )
        warm = polyfuse.compile(
            inputs, outputs, check_cuda=False, name="fuzz", cache=CompileCache(d)
        )
    if len(cold.kernels) != len(warm.kernels):
        return warm, f"cold compile has {len(cold.kernels)} kernels, warm {len(warm.kernels)}"
    if cold.cuda_source != warm.cuda_source:
        return warm, "cold and warm compiles (one compile cache) print different CUDA"
    return warm, ""


def _run_compiled(
    spec: GraphSpec, race_check: bool, cache_twice: bool = False
) -> tuple[dict[str, str], int]:
    """Compile and emulate ``spec``; per output, why it is wrong ("" when right)."""
    spec = spec.pruned()
    feeds = input_values(spec)
    inputs, outputs, ts = build(spec)
    fn, differs = _compile(inputs, outputs, cache_twice)
    if differs:
        return {o: differs for o in spec.outputs}, len(fn.kernels)
    args = [feeds[n.name] for n in spec.inputs]  # build's inputs, in spec order
    want = evaluate(outputs, {ts[k]: v for k, v in feeds.items() if k in ts})
    perturbed = perturbed_references(outputs, dict(zip(inputs, args, strict=True)), spec.seed)
    why = {o: "" for o in spec.outputs}
    for order in (False, True) if race_check else (False,):
        got = fn(*args, device="emulate", race_check=order)
        got_t = got if isinstance(got, tuple) else (got,)
        for i, o in enumerate(spec.outputs):
            if not why[o]:
                r = compare(o, got_t[i], want[i], [p[i] for p in perturbed])
                why[o] = r + (" [threads in reverse order]" if r and order else "")
    return why, len(fn.kernels)


def check_spec(spec: GraphSpec, *, race_check: bool = True, cache_twice: bool = False) -> Outcome:
    """Compile, run and compare one spec. A spec that must be refused
    (``meta["expect_error"]``, e.g. an out-of-bounds read) passes when building it raises that
    error, and is "silent" (a failure) when it compiles."""
    spec = spec.pruned()
    expect = spec.meta.get("expect_error")
    if expect:
        try:
            build(spec)
        except PolyfuseError as e:
            if type(e).__name__ == expect:
                return Outcome(spec, "pass", f"refused: {e}")
            return Outcome(spec, "error", f"expected {expect}, got {type(e).__name__}: {e}")
        return Outcome(spec, "silent", f"built without the {expect} it must raise")
    try:
        why, kernels = _run_compiled(spec, race_check, cache_twice)
    except PolyfuseError as e:
        out = Outcome(spec, "error", f"{type(e).__name__}: {e}")
    except Exception as e:  # a polyfuse bug
        tb = traceback.extract_tb(e.__traceback__)[-1]
        where = f" at {tb.filename.rsplit('/', 1)[-1]}:{tb.lineno}"
        out = Outcome(spec, "crash", f"{type(e).__name__}: {e}{where}")
    else:
        bad = "; ".join(w for w in why.values() if w)
        out = Outcome(spec, "mismatch" if bad else "pass", bad, kernels)
        out.wrong = {o: w for o, w in why.items() if w}
    return out


def run_batch(
    specs: Sequence[GraphSpec], *, race_check: bool = True, cache_twice: bool = False
) -> list[Outcome]:
    """Check ``specs`` (disjointly named) with one compile; return one outcome per spec, plus
    one for the merged spec when it fails while every spec passes alone. Specs that must be
    refused are checked alone (their error would stop the merged build). ``cache_twice``:
    the merged graph is compiled cold and warm through one compile cache (same CUDA)."""
    refused = [check_spec(s) for s in specs if s.meta.get("expect_error")]
    specs = [s for s in specs if not s.meta.get("expect_error")]
    if len(specs) <= 1:
        return refused + [
            check_spec(s, race_check=race_check, cache_twice=cache_twice) for s in specs
        ]
    merged = merge(list(specs))
    whole = check_spec(merged, race_check=race_check, cache_twice=cache_twice)
    return refused + _blame(specs, whole, race_check)


def _blame(specs: Sequence[GraphSpec], whole: Outcome, race_check: bool) -> list[Outcome]:
    """One outcome per spec of a merged check ``whole``: all pass with it, or the suspects
    are checked alone (and ``whole`` is kept when only the merged graph fails)."""
    if whole.status == "pass":
        per = max(1, whole.kernels // len(specs))
        return [Outcome(s, "pass", "", per) for s in specs]
    # Run alone only the graphs that may be guilty: on a mismatch, those with a wrong output.
    outs: list[Outcome] = []
    suspects: list[bool] = []
    for s in specs:
        wrong = [whole.wrong[o] for o in s.outputs if o in whole.wrong]
        suspect = whole.status != "mismatch" or bool(wrong)
        suspects.append(suspect)
        if not suspect:
            outs.append(Outcome(s, "pass"))
        else:
            outs.append(check_spec(s, race_check=race_check))
    if not any(o.status != "pass" for o, sus in zip(outs, suspects, strict=True) if sus):
        whole.detail = "only when compiled together: " + whole.detail
        outs.append(whole)
    return outs


@dataclass
class FuzzReport:
    """Counts of a fuzz run and its failing outcomes."""

    graphs: int = 0
    compiles: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    failures: list[Outcome] = field(default_factory=list)

    def add(self, o: Outcome) -> None:
        self.counts[o.status] = self.counts.get(o.status, 0) + 1
        if o.failed:
            self.failures.append(o)


def fuzz(
    n: int,
    seed: int = 0,
    *,
    batch: int = 4,
    race_check: bool = True,
    max_elements: int = 4096,
    progress: Callable[[int, Outcome], None] | None = None,
    cache_twice_every: int = 4,
    families: Sequence[str] | None = None,
) -> FuzzReport:
    """Generate and check ``n`` graphs (seeds ``seed``, ``seed+1``, ...), ``batch`` per compile.
    Every ``cache_twice_every``-th compile (0: none) is done twice through one fresh compile
    cache, cold then warm, and must give the same CUDA. ``families``: draw only from these
    (:data:`~polyfuse.testing.generate.FAMILIES`; default all)."""
    rep = FuzzReport()
    for start in range(0, n, batch):
        specs = [
            draw(seed + i, max_elements=max_elements, prefix=f"g{i}_", families=families)
            for i in range(start, min(n, start + batch))
        ]
        twice = cache_twice_every > 0 and rep.compiles % cache_twice_every == 0
        rep.compiles += 1
        for o in run_batch(specs, race_check=race_check, cache_twice=twice):
            rep.add(o)
            if progress is not None:
                progress(rep.graphs, o)
        rep.graphs += len(specs)
    return rep
