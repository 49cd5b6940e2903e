"""Compile random graphs, run them on the emulator and compare against the reference evaluator.

One emulator build (a g++ run, most of a small graph's cost) is shared by a *batch* of graphs:
:func:`run_batch` merges several disjoint specs into one compile, so Layer 3 packing of
independent kernels is exercised too, and only when the batch fails are its graphs run alone
to find the guilty one (a batch that fails while every graph passes alone is itself the
failure).

Comparison (:func:`compare`) is NaN-aware and scaled by the graph's own sensitivity: NaN
positions must match and infinities must match exactly; finite values must agree within
``atol + rtol * |want|`` plus a multiple of how far the reference moves when the inputs are
perturbed by a relative ``PERTURB`` (three trials; half a unit of roundoff of the coarsest
16-bit float dtype downstream of an input, :func:`.dtypes.perturbation`). A graph that
amplifies rounding — a sum that cancels, a comparison on a computed value that sits on its
threshold — thereby gets the slack it needs at exactly the elements that need it, and no slack
anywhere else. Likewise for the roundings of 16-bit tensors: kernel and reference round every
tensor to its dtype, but from float32 and float64 bodies (one unit apart at times), so an
element may also be off by ``ORACLE_SLACK`` times the gap between the reference and its float64
oracle (``evaluate(..., precision="float64")``, which rounds nothing after the inputs), and its
NaN-ness or infinity may differ where the two differ (an int32 cast of a bfloat16 ``erf`` that
rounds to 1.0 in the reference and stayed 0.998 in a kernel: fuzz seed 710032). The same
holds for a second reference, ``precision="operation"`` (every float32 operation rounded to
float32, as the kernels compute it, where the storage reference keeps a compute body in
float64): a float32 product that underflows to a subnormal before a division by a tiny
constant is off by half its value in the kernel and in numpy alike (fuzz seed 740066).

``rtol``/``atol`` are the per-dtype tolerance (:func:`polyfuse.graph.dtypes.tolerance`) of
each output's dtype, or of the coarser 16-bit dtype a compute upstream of it stores or casts to
(:func:`.dtypes.precision`: the reference rounds that tensor where a fused kernel keeps it in
float32), and the output must come back as an array of its dtype.

A graph that stores a tensor in (or casts to) a dtype the code generator refuses
(:func:`.dtypes.refusal`) must raise ``UnsupportedDtypeError`` when compiled: it is then
"refused", which is not a failure.
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
from polyfuse.errors import PolyfuseError, UnsupportedDtypeError
from polyfuse.graph.expr import Tensor
from polyfuse.reference import evaluate, tolerance

from .build import build, input_values
from .dtypes import perturbation, precision, refusal, with_dtypes
from .generate import GraphSpec, draw, merge

__all__ = [
    "Outcome",
    "check_spec",
    "compare",
    "perturbed_references",
    "reference_values",
    "run_batch",
]

RTOL = tolerance("float32").rtol  # float32's; compare() takes each output dtype's
ATOL = tolerance("float32").atol
PERTURB = 1e-5  # of a float32 graph (:data:`.dtypes.PERTURB`)
SLACK = 8.0  # multiple of the perturbed reference's spread that is allowed
ORACLE_SLACK = 2.0  # multiple of the gap between the reference and its float64 oracle
TRIALS = 3


@dataclass
class Outcome:
    """What happened to one graph: status "pass", "refused" (a graph with a dtype the code
    generator does not support raised UnsupportedDtypeError, as it must), "mismatch", "crash"
    (an exception that is not a PolyfuseError: a polyfuse bug), "error" (a PolyfuseError on a
    valid graph) or "silent" (a graph that must be refused was built or compiled)."""

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
    outputs: Sequence[Tensor],
    feeds: Mapping[Tensor, np.ndarray],
    seed: int = 0,
    perturb: float | Mapping[Tensor, float] = PERTURB,
) -> list[list[np.ndarray]]:
    """The reference outputs for :data:`TRIALS` copies of ``feeds``, each float value moved by
    a random relative amount of at most ``perturb`` (or ``perturb[input]``) and stored
    back in its dtype (what :func:`compare` measures the graph's sensitivity with); integer
    and bool feeds stay."""
    rng = np.random.default_rng([seed, 7919])
    trials = []
    for _ in range(TRIALS):
        moved = {
            t: _moved(v, perturb if isinstance(perturb, float) else perturb[t], rng)
            for t, v in feeds.items()
        }
        trials.append(evaluate(list(outputs), moved))
    return trials


def _moved(v: np.ndarray, perturb: float, rng: np.random.Generator) -> np.ndarray:
    v = np.asarray(v)
    if v.dtype.kind in "biu":
        rng.uniform(-1, 1, np.shape(v))  # the same draws as a float feed: trials stay aligned
        return v
    moved = v.astype(np.float64) * (1 + perturb * rng.uniform(-1, 1, np.shape(v)))
    return moved.astype(v.dtype)  # a float64 input keeps its (float64-sized) perturbation


def compare(
    name: str,
    got: np.ndarray,
    want: np.ndarray,
    perturbed: Sequence[np.ndarray] = (),
    dtype: str = "float32",
    oracle: np.ndarray | Sequence[np.ndarray] | None = None,
) -> str:
    """Why ``got`` is not ``want`` (one line), or "" when it agrees within ``dtype``'s
    tolerance (see the module docstring); ``oracle``: the same output evaluated with
    ``precision="float64"`` (no tensor rounded after the inputs), or several such other
    references (also ``precision="operation"``): the largest gap counts."""
    got = np.asarray(got)
    if got.shape != want.shape:
        return f"output '{name}' has shape {got.shape}, reference {want.shape}"
    if got.dtype != want.dtype:
        return f"output '{name}' is a {got.dtype} array, reference {want.dtype}"
    rtol, atol = tolerance(dtype).rtol, tolerance(dtype).atol
    g = got.astype(np.float64)
    w = want.astype(np.float64)
    spread = np.zeros(w.shape)
    unstable = np.zeros(w.shape, dtype=bool)  # NaN-ness or infinity moves under perturbation
    if got.dtype == np.float64 and dtype != "float64":
        # float32 arithmetic stored in float64: beyond float32's range the kernel's registers
        # overflow where the reference's float64 body does not
        with np.errstate(invalid="ignore"):
            unstable |= np.abs(w) > np.finfo(np.float32).max
    with np.errstate(all="ignore"):
        for p in perturbed:
            p = p.astype(np.float64)
            unstable |= (np.isnan(p) != np.isnan(w)) | (np.isinf(p) & (p != w))
            d = np.abs(p - w)
            spread = np.maximum(spread, np.where(np.isfinite(d), d, 0.0))
        gap = np.zeros(w.shape)
        others = [] if oracle is None else oracle if isinstance(oracle, list | tuple) else [oracle]
        for other in others:  # where rounding the intermediates moves the reference
            o = np.asarray(other).astype(np.float64)
            nan_o, nan_w = np.isnan(o), np.isnan(w)
            inf_moves = (np.isinf(o) | np.isinf(w)) & (o != w) & ~nan_o & ~nan_w
            unstable |= (nan_o != nan_w) | inf_moves
            gap = np.maximum(gap, np.where(np.isfinite(o - w), np.abs(o - w), 0.0))
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
        tol = atol + rtol * np.abs(w) + SLACK * spread + ORACLE_SLACK * gap
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
    by_tensor = {ts[k]: v for k, v in feeds.items() if k in ts}
    want = evaluate(outputs, by_tensor)
    oracle = evaluate(outputs, by_tensor, precision="float64")
    rounded = evaluate(outputs, by_tensor, precision="operation")
    by_input = dict(zip(inputs, args, strict=True))
    moves = perturbation(spec)
    moves = {t: moves[n.name] for t, n in zip(inputs, spec.inputs, strict=True)}
    perturbed = perturbed_references(outputs, by_input, spec.seed, moves)
    why = {o: "" for o in spec.outputs}
    for order in (False, True) if race_check else (False,):
        got = fn(*args, device="emulate", race_check=order)
        got_t = got if isinstance(got, tuple) else (got,)
        for i, o in enumerate(spec.outputs):
            if not why[o]:
                moved = [p[i] for p in perturbed]
                others = [oracle[i], rounded[i]]
                r = compare(o, got_t[i], want[i], moved, precision(spec, o), others)
                why[o] = r + (" [threads in reverse order]" if r and order else "")
    return why, len(fn.kernels)


def check_spec(spec: GraphSpec, *, race_check: bool = True, cache_twice: bool = False) -> Outcome:
    """Compile, run and compare one spec. A spec that must be refused
    (``meta["expect_error"]``, e.g. an out-of-bounds read) passes when building it raises that
    error, and is "silent" (a failure) when it compiles."""
    spec = spec.pruned()
    if why_refused := refusal(spec):
        return _check_refused(spec, why_refused)
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


def _check_refused(spec: GraphSpec, why: str) -> Outcome:
    """A spec the code generator must refuse (``why``): compiling it raises
    UnsupportedDtypeError ("refused"), anything else is a failure."""
    try:
        inputs, outputs, _ = build(spec)
        polyfuse.compile(inputs, outputs, check_cuda=False, name="fuzz")
    except UnsupportedDtypeError as e:
        return Outcome(spec, "refused", str(e))
    except PolyfuseError as e:
        return Outcome(spec, "error", f"{type(e).__name__} where {why}: {e}")
    except Exception as e:  # a polyfuse bug
        return Outcome(spec, "crash", f"{type(e).__name__}: {e}")
    return Outcome(
        spec, "silent", f"compiled without the UnsupportedDtypeError it must raise: {why}"
    )


def run_batch(
    specs: Sequence[GraphSpec], *, race_check: bool = True, cache_twice: bool = False
) -> list[Outcome]:
    """Check ``specs`` (disjointly named) with one compile; return one outcome per spec, plus
    one for the merged spec when it fails while every spec passes alone. Specs that must be
    refused are checked alone (their error would stop the merged build). ``cache_twice``:
    the merged graph is compiled cold and warm through one compile cache (same CUDA). Specs
    that must be refused (an error when built, or a dtype code generation refuses) are checked
    alone too."""
    alone = [s for s in specs if s.meta.get("expect_error") or refusal(s)]
    refused = [check_spec(s) for s in alone]
    specs = [s for s in specs if not (s.meta.get("expect_error") or refusal(s))]
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
    dtypes: Sequence[str] | None = None,
) -> FuzzReport:
    """Generate and check ``n`` graphs (seeds ``seed``, ``seed+1``, ...), ``batch`` per compile.
    Every ``cache_twice_every``-th compile (0: none) is done twice through one fresh compile
    cache, cold then warm, and must give the same CUDA. ``families``: draw only from these
    (:data:`~polyfuse.testing.generate.FAMILIES`; default all). ``dtypes``: the dtypes
    graphs draw (:func:`.dtypes.with_dtypes`; default float32 only)."""
    rep = FuzzReport()
    for start in range(0, n, batch):
        specs = [
            with_dtypes(
                draw(seed + i, max_elements=max_elements, prefix=f"g{i}_", families=families),
                dtypes,
            )
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
