"""Every isl scheduler call is bounded, in operations and in time (issue 19, items 9 and 10).

Two graphs that ran for minutes before: torchvision swin_t's first-stage tail (LayerNorm → Pad
→ roll as Slice/Slice/Concat twice), whose isl scheduler call never finished (20 minutes, the
operation budget notwithstanding), and Conv1d(1, 32, 16) → ReLU → MaxPool1d(4) on 8000
samples, whose whole-component retry took a minute to fail. Both are built here with
polyfuse's ops under the tensor names the ONNX importer gives them (the names decided which
schedule isl found, and how fast), compiled in a subprocess with a time limit (an isl call
cannot be interrupted in-thread), and checked on the emulator against the reference.

The guard itself (poly/guard.py) is checked on the raw scheduler input of the swin_t group,
written as isl text: isl's operation budget does not bound its time, the deadline does.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import islpy as isl
import numpy as np
import pytest

import polyfuse
import polyfuse.poly.guard as guard
import polyfuse.poly.schedule as schedule
from polyfuse.base.decision import DecisionKind, note_records
from polyfuse.cache import CompileCache
from polyfuse.reference import evaluate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from isl_graphs import conv_pool, swin_call, swin_constraints, swin_tail  # noqa: E402

COMPILE_LIMIT_S = 10.0  # CPU seconds each reproduction compiles within (it took minutes before)
HANG_LIMIT_S = 120  # wall seconds before a child counts as hung (a loaded machine is slower)
#: CPU seconds of this process and its waited-for children (the guard runs isl in a child):
#: unlike wall time, not inflated when other work shares the machine's cores
CPU_CLOCK = (
    "(lambda r: time.process_time() + r.ru_utime + r.ru_stime)"
    "(resource.getrusage(resource.RUSAGE_CHILDREN))"
)
HERE = Path(__file__).resolve().parent


# --------------------------------------------------------------------------- the graphs


def _feeds(inputs, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(t.shape).astype(np.float32) for t in inputs]


def _check_on_emulator(inputs, outputs, **compile_kw) -> polyfuse.CompiledGraph:
    fn = polyfuse.compile(inputs, outputs, check_cuda=False, **compile_kw)
    feeds = _feeds(inputs)
    got = fn(*feeds, device="emulate")
    (want,) = evaluate(outputs, dict(zip(inputs, feeds, strict=True)))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    return fn


def _compile_in_subprocess(call: str) -> float:
    """Seconds to compile ``call`` (a builder of this module) in a child Python; fails when it
    takes over COMPILE_LIMIT_S. A fresh process with the persistent caches off: a cold
    compile, as a new user's."""
    script = textwrap.dedent(
        f"""
        import resource, sys, time
        sys.path.insert(0, {str(HERE)!r})
        import polyfuse
        from isl_graphs import swin_tail, conv_pool
        ins, outs = {call}
        t0 = {CPU_CLOCK}
        polyfuse.compile(ins, outs, check_cuda=False)
        print({CPU_CLOCK} - t0)
        """
    )
    env = {**os.environ, "POLYFUSE_CACHE": "off"}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=HANG_LIMIT_S,
            env=env,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{call} did not compile in {HANG_LIMIT_S} s") from None
    assert proc.returncode == 0, proc.stderr[-3000:]
    seconds = float(proc.stdout.split()[-1])
    assert seconds <= COMPILE_LIMIT_S, f"{call} compiled in {seconds:.1f} CPU s"
    return seconds


# --------------------------------------------------------------------------- item 9: swin_t


def test_swin_tail_compiles_within_seconds():
    _compile_in_subprocess("swin_tail()")


def test_swin_tail_is_correct():
    inputs, outputs = swin_tail()
    _check_on_emulator(inputs, outputs)


def test_one_group_one_schedule_whatever_its_names():
    """The scheduler sees canonical statement names in a canonical order: the swin group under
    the importer's names and under others gets the same partition and the same schedules."""

    ctx = isl.Context()

    def plan(rename) -> list[tuple[int, isl.Schedule]]:
        """Per micrograph: its size and its schedule over the canonical statement names."""
        inputs, outputs = swin_tail(c=32, hw=8, rename=rename)
        fn = polyfuse.compile(inputs, outputs, check_cuda=False, cache=None)
        out = []
        for sm in fn.plan.scheduled:
            canon = schedule.canonical_names(sm.model)
            to_real = isl.UnionMap.empty(isl.Space.params_alloc(sm.model.ctx, 0))
            for st in sm.model.statements:
                real = isl.Map.identity(st.domain.get_space().map_from_set())
                real = real.set_tuple_name(isl.dim_type.in_, canon[st.name])
                to_real = to_real.union(isl.UnionMap.from_map(real))
            renamed = sm.schedule.pullback_union_pw_multi_aff(
                isl.UnionPwMultiAff.from_union_map(to_real)
            )
            out.append((len(sm.model.micrograph.prims), isl.Schedule(str(renamed), context=ctx)))
        return out

    def same(a, b) -> bool:
        return len(a) == len(b) and all(
            n == m and s.plain_is_equal(t) for (n, s), (m, t) in zip(a, b, strict=True)
        )

    first = plan(None)
    # mean | centered, var | rstd | ln, pad | roll along H | roll along W (the H roll fused
    # with the pad shifted H out of parallel: split, poly/schedule._lost_parallelism)
    assert len(first) == 6
    assert same(plan(lambda s: "q" + s[::-1].strip("_")), first)
    assert same(plan(lambda s: "t" + s.replace("_", "")[-6:]), first)


# --------------------------------------------------------------------------- item 10: conv1d


@pytest.mark.parametrize("stride", [1, 16])
def test_conv1d_relu_maxpool_compiles_within_seconds(stride):
    _compile_in_subprocess(f"conv_pool(stride={stride})")


def test_conv1d_relu_maxpool_is_correct():
    inputs, outputs = conv_pool()
    fn = _check_on_emulator(inputs, outputs)
    # the feedback split the ReLU off the pool, not the convolution off its bias and ReLU
    assert [m.prims[-1] for m in fn.plan.micrographs] == [
        "_1_Relu_relu4",
        "_2_MaxPool_maxpool5",
    ]


# --------------------------------------------------------------------------- through torch

_TORCH_MODELS = {
    "swin_tail": """
class M(nn.Module):
    def __init__(s):
        super().__init__()
        s.l1, s.l2 = nn.Linear(96, 384), nn.Linear(384, 96)
        s.ln0, s.ln = nn.LayerNorm(96), nn.LayerNorm(96)
    def forward(s, x):
        x = x + s.l2(F.gelu(s.l1(s.ln0(x))))
        h = F.pad(s.ln(x), (0, 0, 0, 5, 0, 5))
        return torch.roll(h, shifts=(-3, -3), dims=(1, 2))
example = torch.randn(1, 16, 16, 96)
""",
    "conv1d_relu_maxpool": """
M = lambda: nn.Sequential(nn.Conv1d(1, 32, 16), nn.ReLU(), nn.MaxPool1d(4))
example = torch.randn(1, 1, 8000)
""",
}


@pytest.mark.extra  # needs PyTorch
@pytest.mark.parametrize("model", list(_TORCH_MODELS))
def test_torch_onnx_reproductions_prepare_within_seconds(model, tmp_path):
    """The reproductions as reported: exported by torch.onnx (opset 17, TorchScript exporter)
    and compiled by the ONNX backend, within the limit; the emulator's result is torch's."""
    pytest.importorskip("torch")
    pytest.importorskip("onnx")
    script = (
        textwrap.dedent(
            """
        import resource, sys, time, warnings
        import numpy as np, onnx, torch
        import torch.nn as nn, torch.nn.functional as F
        from polyfuse.onnx.backend import prepare
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        """
        )
        + _TORCH_MODELS[model]
        + textwrap.dedent(
            f"""
        m = M().eval()
        path = {str(tmp_path / "m.onnx")!r}
        torch.onnx.export(m, (example,), path, opset_version=17, dynamo=False)
        t0 = {CPU_CLOCK}
        rep = prepare(onnx.load(path))
        took = {CPU_CLOCK} - t0
        (got,) = rep.run([example.numpy()], device="emulate")
        want = m(example).detach().numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        print(took)
        """
        )
    )
    env = {**os.environ, "POLYFUSE_CACHE": "off"}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{model}: export + prepare did not finish in 120 s") from None
    assert proc.returncode == 0, proc.stderr[-3000:]
    took = float(proc.stdout.split()[-1])
    assert took <= COMPILE_LIMIT_S, f"{model}: prepare took {took:.1f} CPU s"


# --------------------------------------------------------------------------- the guard


def test_operation_budget_alone_does_not_bound_the_swin_call():
    """Why the deadline exists: under an operation budget of 100k (the calls of the examples,
    suite and zoo need at most ~100k) this call runs for many seconds (13 s measured), its
    pivots slowed by growing integers. Run in a child Python that is stopped after 2 s."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        import islpy as isl
        from isl_graphs import swin_call
        ctx = isl.Context()
        call = swin_call(ctx)
        ctx.set_max_operations(100_000)
        ctx.reset_operations()
        try:
            call()
        except isl.Error:
            pass
        """
    )
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=2)


def test_deadline_stops_the_swin_call():
    ctx = isl.Context()
    call = swin_call(ctx)
    limits = guard.Limits(operations=2_000_000, seconds=1.0)
    t0 = time.perf_counter()
    with pytest.raises(guard.Exhausted) as info:
        guard.bounded(ctx, call, limits, str, lambda t: isl.Schedule(t, context=ctx))
    took = time.perf_counter() - t0
    assert info.value.limit == "deadline" and "deadline of 1 s" in info.value.reason
    assert 1.0 <= took < 5.0
    # the context is usable afterwards: the call ran in a child process
    assert isl.Set("{ [i] : 0 <= i < 4 }", context=ctx).count_val().to_python() == 4


def test_canonical_names_schedule_the_swin_call_in_a_moment():
    """The same constraints under the canonical statement names compute_schedule gives them
    (S0.. in the micrograph's order) schedule at once, in-process."""
    ctx = isl.Context()
    sc = swin_constraints(ctx)
    order = [
        "ln_LayerNormalization_ln20_rstd",
        "ln_LayerNormalization_ln20",
        "Pad_pad23",
        "Slice_1_slice24",
        "Slice_2_slice25",
        "Concat_1_concat26",
        "Slice_3_slice27",
        "Slice_4_slice28",
        "Concat_2_concat29",
    ]
    canon = {f"S__{n}": f"S{k}" for k, n in enumerate(order)}
    from polyfuse.poly.islutil import rename_tuples

    deps = rename_tuples(sc.get_validity(), canon)
    renamed = (
        isl.ScheduleConstraints.on_domain(rename_tuples(sc.get_domain(), canon))
        .set_validity(deps)
        .set_proximity(deps)
        .set_coincidence(deps)
    )
    ctx.set_schedule_max_coefficient(schedule.MAX_COEFFICIENT)
    limits = guard.Limits(operations=schedule.DEFAULT_BUDGET, seconds=None)
    out = guard.bounded(ctx, renamed.compute_schedule, limits, str, str)
    assert out.seconds < 1.0 and not out.forked
    assert out.value is not None and out.value.get_domain().is_equal(renamed.get_domain())


def test_operations_decide_in_process_and_in_the_child_alike():
    """A call that needs more than its in-process operations starts over in the child under
    the full budget: the same schedule as in-process, carried back as isl text; a budget too
    small fails the same way in both."""
    ctx = isl.Context()
    schedule.configure(ctx)
    dom = isl.UnionSet("{ A[i, j] : 0 <= i, j < 64; B[i, j] : 0 <= i, j < 64 }", context=ctx)
    deps = isl.UnionMap("{ A[i, j] -> B[i, j + 1] : 0 <= i < 64 and 0 <= j < 63 }", context=ctx)
    sc = (
        isl.ScheduleConstraints.on_domain(dom)
        .set_validity(deps)
        .set_proximity(deps)
        .set_coincidence(deps)
    )
    parse = lambda t: isl.Schedule(t, context=ctx)  # noqa: E731
    here = guard.bounded(ctx, sc.compute_schedule, guard.Limits(10**6, None), str, parse)
    there = guard.bounded(ctx, sc.compute_schedule, guard.Limits(10**6, 30.0, 1), str, parse)
    assert not here.forked and there.forked
    assert here.value.plain_is_equal(there.value)
    for lim in (guard.Limits(50, None), guard.Limits(50, 30.0, 1)):
        with pytest.raises(guard.Exhausted) as info:
            guard.bounded(ctx, sc.compute_schedule, lim, str, parse)
        assert info.value.limit == "operations"


def test_without_fork_the_budget_alone_bounds_the_call(monkeypatch):
    monkeypatch.setattr(guard, "FORK", False)
    ctx = isl.Context()
    call = swin_call(ctx)
    with pytest.raises(guard.Exhausted) as info:
        guard.bounded(ctx, call, guard.Limits(20_000, 1.0), str, str)
    assert info.value.limit == "operations"


def test_a_child_that_dies_or_cannot_start_is_no_crash(monkeypatch):
    """A child killed inside the call (as the kernel's OOM killer would) is an isl failure the
    feedback handles; when no process can be started the call runs in-process."""
    import signal

    ctx = isl.Context()
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)  # noqa: E731 - runs in the child only
    with pytest.raises(guard.Exhausted) as info:
        guard.bounded(ctx, die, guard.Limits(1000, 5.0, inline=0), str, str)
    assert info.value.limit == "error" and "ended without a result" in info.value.detail

    def no_fork():
        raise OSError("Resource temporarily unavailable")

    monkeypatch.setattr(guard.os, "fork", no_fork)
    out = guard.bounded(ctx, lambda: "here", guard.Limits(1000, 5.0, inline=0), str, str)
    assert out.value == "here" and not out.forked


def test_deadline_feedback_splits_remembers_and_says_why(monkeypatch):
    """Every scheduler call out of time: the micrographs split down to single primitives (which
    keep their own loop order), the plan says why, the result is right, and a second compile
    through the same cache runs no scheduler call (the feedback is remembered)."""
    monkeypatch.setattr(schedule, "INLINE_OPERATIONS", 0)
    monkeypatch.setattr(schedule, "SCHEDULE_DEADLINE_S", 1e-6)
    inputs, outputs = swin_tail(c=8, hw=4, pad=2, shift=1)
    cache = CompileCache()
    fn = _check_on_emulator(inputs, outputs, cache=cache)
    events = fn.plan.feedback
    assert events and all(e.limit == "deadline" for e in events)
    assert all("deadline of 1e-06 s" in e.reason for e in events)
    assert "stopped at its deadline" in str(fn.plan)
    assert all(len(m.prims) == 1 for m in fn.plan.micrographs)
    notes = [n for sm in fn.plan.scheduled for n in sm.notes]
    assert notes and all("kept the original loop order" in n for n in notes)
    recs = note_records(notes)  # typed records (plain strings before)
    assert len(recs) == len(notes)
    assert all(r.kinds == (DecisionKind.ISL_FEEDBACK,) and not r.made for r in recs)
    assert {r.subject for r in recs} == {(m.name,) for m in fn.plan.micrographs}

    calls = []
    run = schedule._run_scheduler
    monkeypatch.setattr(schedule, "_run_scheduler", lambda *a, **k: calls.append(a) or run(*a, **k))
    again = polyfuse.compile(inputs, outputs, check_cuda=False, cache=cache)
    assert calls == []
    assert [(e.groups, e.reason, e.limit) for e in again.plan.feedback] == [
        (e.groups, e.reason, e.limit) for e in events
    ]
    assert len(again.kernels) == len(fn.kernels)


# --------------------------------------------------------------------------- the fuzzer's family


def test_stencil_family_draws_both_chains_with_every_kind():
    from polyfuse.testing.stencil import KINDS, generate_stencil

    specs = [generate_stencil(s) for s in range(200)]
    nodes = [n for sp in specs for n in sp.nodes]
    assert {n.kind for n in nodes} == {*KINDS, "input", "binary"}
    rolls = [n for n in nodes if n.kind == "roll"]
    assert {n.axes for n in rolls} >= {(1,), (2,)} and len({n.params for n in rolls}) > 5
    pads = [n for n in nodes if n.kind == "pad"]
    assert any(sum(n.params) > 0 for n in pads)  # padding before, not only after
    convs = [n for n in nodes if n.kind == "conv1d"]
    assert {n.params[0] for n in convs} >= {1, 2, 4, 16} and any(len(n.args) == 3 for n in convs)
    assert {n.op for n in nodes if n.kind == "pool1d"} == {"max", "avg"}
    # a concat of two different producers, and chains of two conv stages
    assert any(len(set(n.args)) == 2 for n in nodes if n.kind == "concat")
    assert any(sum(n.kind == "conv1d" for n in sp.nodes) == 2 for sp in specs)
    assert generate_stencil(7).nodes == generate_stencil(7).nodes  # a function of the seed


def test_fuzzer_draws_the_stencil_family():
    from polyfuse.testing.generate import FAMILIES, draw, generate

    assert set(FAMILIES) >= {"random", "stencil"}
    families = [draw(s).meta["family"] for s in range(100)]
    assert 5 < families.count("stencil") < 50
    seed = families.index("random")
    assert draw(seed).nodes == generate(seed).nodes  # the random family is generate's graphs


@pytest.mark.slow  # ~12 s
def test_stencil_family_graphs_pass_and_print_as_scripts(tmp_path):
    """A fast tier of the family: 16 graphs, 8 per compile, emulator vs reference; and the
    failure script of a norm chain and of a conv chain runs and agrees."""
    from polyfuse.testing.run import run_batch
    from polyfuse.testing.script import to_script
    from polyfuse.testing.stencil import generate_stencil

    outcomes = []
    for start in (0, 8):
        specs = [generate_stencil(s, prefix=f"g{s - start}_") for s in range(start, start + 8)]
        outcomes += run_batch(specs)
    assert [o.status for o in outcomes] == ["pass"] * 16, [o.detail for o in outcomes]
    for want in ("layer_norm", "conv1d"):
        seed = next(s for s in range(50) if any(n.kind == want for n in generate_stencil(s).nodes))
        path = tmp_path / f"{want}.py"
        path.write_text(to_script(generate_stencil(seed)))
        proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert re.search(r"\b0 of \d+ outputs differ", proc.stdout), proc.stdout[-500:]
