"""benchmarks/gpu.py without a GPU: the peers compute what polyfuse computes, and the
prepared artifacts run through the runtime (fake driver, kernels in the emulator).

What the lent GPU machine will run is exactly this path with the real driver: the prepared
artifacts (``polyfuse.load``), :func:`gpu.case_program`, :func:`gpu.draw_inputs`, and the peers
as the float64 reference.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from polyfuse import examples

pytestmark = pytest.mark.extra  # needs PyTorch (CI's extras step)
torch = pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import gpu  # noqa: E402
import suite  # noqa: E402

SCALE = 512  # rows / 512: the numpy references take milliseconds


def _peer64(name: str, arrays: list[np.ndarray]) -> list[np.ndarray]:
    ops = gpu.Ops("torch")
    with torch.no_grad():
        out = gpu.PEERS[name](ops, *[torch.from_numpy(a).double() for a in arrays])
    return [o.numpy() for o in gpu._peer_outputs(out)]


@pytest.mark.parametrize("name", gpu.SUITE)
def test_suite_peers_match_the_suite_references(name):
    inputs, outputs, reference = suite.build(name, SCALE)
    arrays = suite.random_inputs(name, inputs, seed=1)
    got = _peer64(name, arrays)
    want = reference(*arrays)
    assert len(got) == len(want) == len(outputs)
    for g, w in zip(got, want, strict=True):
        assert gpu.rel_err(g, w) < 1e-6, name


@pytest.mark.parametrize("name", list(gpu.COMPUTE))
def test_compute_peers_match_the_example_references(name):
    example, _ = gpu.COMPUTE[name]
    small = {"matmul_bias_gelu": {}, "conv2d_relu": {}, "attention": {}}[example]
    inputs, outputs, reference = getattr(examples, example)(**small)
    arrays = examples.random_inputs(inputs, seed=2)
    (got,) = _peer64(name, arrays)
    (want,) = reference(*arrays)
    assert gpu.rel_err(got, want) < 1e-12


def test_prepared_cases_run_through_the_runtime(tmp_path):
    cases = ["batchnorm_train_relu", "adam3", "attention_s128"]
    prepared = gpu.prepare(tmp_path, cases, "sm_90", scale=SCALE)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == sorted([f"{c}.pfa" for c in cases] + ["overhead_attention4.pfa"])
    assert prepared.overhead is not None
    loaded = gpu.load_cases(tmp_path)  # polyfuse.load: one artifact per case
    assert [c.name for c in loaded.cases] == cases and loaded.arch == "sm_90"
    assert len(loaded.overhead.kernels) == 4, "the overhead graph has 4 kernels"
    for c in loaded.cases:
        assert c.graph.binaries["sm_90"].image[:4] == b"\x7fELF"
        assert all(k.spill_bytes == 0 and k.registers for k in c.kernels)
        assert c.compulsory_bytes > 0 and c.meta["distinct_bytes"] >= c.compulsory_bytes
    assert loaded.cases[2].flops > 0 and loaded.cases[0].flops == 0
    assert {k.kind for k in loaded.cases[2].kernels} >= {"gemm"}
    assert loaded.cases[0].kernels[0].kind in ("reduction", "stitched")
    assert {k.kind for k in loaded.cases[1].kernels} == {"elementwise"}
    device = gpu.fake_device(loaded.cases)  # the fake runs each cubin's CUDA source
    for case in loaded.cases:
        prog = gpu.case_program(device, case)
        arrays = gpu.draw_inputs(case, seed=3)
        if case.name == "adam3":
            v = [a for n, a in zip(case.input_names, arrays, strict=True) if n[0] == "v"]
            assert all((a >= 0).all() for a in v)
        got = prog(dict(zip(case.inputs, arrays, strict=True)))
        want = _peer64(case.name, arrays)
        for g, w in zip(got, want, strict=True):
            assert gpu.rel_err(g, w) < 1e-5, case.name
    loaded_images = device.driver.cu.gpu.loaded_images
    assert loaded_images == [c.graph.binaries["sm_90"].image for c in loaded.cases]


def test_a_damaged_case_stops_the_run_with_the_reason(tmp_path):
    gpu.prepare(tmp_path, ["layernorm"], "sm_90", scale=SCALE, overhead=False)
    path = tmp_path / "layernorm.pfa"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(SystemExit, match=r"layernorm.pfa' is truncated"):
        gpu.load_cases(tmp_path)
    with pytest.raises(SystemExit, match="no prepared cases"):
        gpu.load_cases(tmp_path / "empty")


def test_runner_imports_without_the_compiler(tmp_path):
    """On the GPU machine there is no islpy: the runtime must import without it (the
    installed package; tests/test_runtime_leaf.py blocks the compiler's layers outright)."""
    code = (
        f"import sys; sys.modules['islpy'] = None; sys.path.insert(0, {str(BENCH)!r}); "
        "import gpu; rt = gpu.import_runtime(); rt.DeviceProgram; "
        "assert not [m for m in sys.modules if m.startswith(('polyfuse.driver', "
        "'polyfuse.graph', 'polyfuse.poly', 'polyfuse.stitch'))]"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)


def test_gpu_day_prepares_and_runs_on_the_fake_driver(tmp_path):
    """--prepare-all then --all, the whole day's plumbing without a GPU: cases compiled into
    DIR/cases, the run step checks every case on the fake driver against the float64 peers,
    tests/test_gpu.py runs (and skips: no GPU), the torch-on-GPU steps are skipped, and one
    JSON holds it all."""
    import gpu_day

    cases = ["layernorm", "attention_s128"]
    day = gpu_day.prepare_all(tmp_path, scale=SCALE, cases=cases, wheels=False)
    assert day["bytes"] < gpu_day.MAX_BYTES and (tmp_path / gpu_day.DAY).exists()
    out = tmp_path / "day_out.json"
    result = gpu_day.run_all(tmp_path, out, budget_s=300, fake=True)
    status = {s.name: s.status for s in result.steps}
    assert status["run"] == "ok" and status["tests"] == "ok", status
    assert status["overhead"].startswith("skipped") and status["models"].startswith("skipped")
    assert "skipped" in next(s.summary for s in result.steps if s.name == "tests")
    report = json.loads(out.read_text())
    got = {r["name"]: r for r in report["run"]["results"]}
    assert set(got) == set(cases)
    assert all(r["rel_err"] < 1e-5 and r["rerun_identical"] for r in got.values()), got


def test_the_carried_wheel_has_no_stale_module_of_an_earlier_build(tmp_path):
    """A module left in ``build/lib`` by an earlier build (deleted from the source since)
    once went into the wheel the GPU machine installs: the wheel is built from a clean copy."""
    import zipfile

    import gpu_day

    project = gpu_day._source_tree(tmp_path / "project")
    stale = project / "build" / "lib" / "polyfuse" / "zz_deleted_module.py"
    stale.parent.mkdir(parents=True)
    stale.write_text("GONE = True\n")
    r = gpu_day.build_wheel(tmp_path / "wheels", root=project)
    assert r.returncode == 0, r.stderr[-400:]
    (wheel,) = (tmp_path / "wheels").glob("polyfuse-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "polyfuse/__init__.py" in names and "polyfuse/poly/tiling.py" in names
    assert not any("zz_deleted_module" in n for n in names)
    assert not (project / "build" / "lib" / "polyfuse" / "__init__.py").exists()


def test_gpu_day_stops_a_step_at_its_limit_and_skips_what_has_no_time(tmp_path):
    import gpu_day

    step = gpu_day.Step("sleepy", [sys.executable, "-c", "import time; time.sleep(30)"], 1)
    gpu_day._run_step(step, {}, 1.0, tmp_path)
    assert step.status == "timed out after 1 s" and step.seconds < 10
    day = gpu_day.run_all(tmp_path, budget_s=10, fake=True)
    assert {s.status for s in day.steps} <= {
        "skipped: out of time",
        "skipped: needs torch on a GPU (fake driver)",
    }


def test_gpu_cli_has_the_day_flags(capsys):
    with pytest.raises(SystemExit) as e:
        gpu.main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "--prepare-all DIR" in text and "--all DIR" in text and "--fake-driver" in text
    with pytest.raises(SystemExit) as e:
        gpu.main(["--all"])
    assert e.value.code == 2  # DIR is required


@pytest.mark.slow  # two 16x4096x4096 GEMMs in the emulator: ~40 s on 2 cores
def test_tensor_core_cases_are_stored_and_checked_in_their_dtypes(tmp_path):
    """The tensor-core cases (issue 23's GPU figures): bfloat16 / tf32 artifacts whose inputs
    are drawn in their dtype and run on the fake driver (its 16-bit buffers failed before with
    KeyError ('g', 2)), each case's math naming the cuBLAS rate of its floor."""
    cases = ["matmul_bf16", "matmul_tf32"]
    gpu.prepare(tmp_path, cases, "sm_90", scale=256, overhead=False)
    loaded = gpu.load_cases(tmp_path)
    bf16, tf32 = loaded.cases
    assert (bf16.math, tf32.math) == ("bf16", "tf32")
    assert bf16.input_dtypes == ["bfloat16", "bfloat16"] and tf32.input_dtypes == ["float32"] * 2
    assert bf16.peers == ["eager", "inductor"] and bf16.flops == 2.0 * 16 * 4096 * 4096
    assert "mma.sync.m16n8k16 bfloat16" in str(bf16.graph.plan)
    drawn = gpu.draw_inputs(bf16)[0]
    assert np.array_equal(drawn, gpu.typed(drawn, "bfloat16").astype(np.float32)), "rounded"
    device = gpu.fake_device(loaded.cases)
    for case, tol in ((bf16, 4e-3), (tf32, 2e-3)):
        r = gpu.check_case_on_host(device, case)
        assert r.rel_err < tol and r.rerun_identical, (case.name, r.rel_err)


def test_split_k_cases_time_the_split_beside_one_stage(tmp_path):
    """The split-K cases (BERT-base's float32 FFN down, batch / 8 here): the model's choice
    is a partial GEMM and a final sum, the ``split_k=1`` variant one kernel, both fp32 math
    (the cuBLAS FP32 floor), both correct on the fake driver."""
    gpu.prepare(tmp_path, list(gpu.SPLIT_K), "sm_90", scale=8, overhead=False)
    loaded = gpu.load_cases(tmp_path)
    split, one = loaded.cases
    assert (split.name, one.name) == ("ffn_down_f32", "ffn_down_f32_k1")
    assert (split.math, one.math) == ("fp32", "fp32") and (split.peers, one.peers) == (
        ["eager"],
        [],
    )
    assert (len(split.graph.kernels), len(one.graph.kernels)) == (2, 1)
    assert split.flops == one.flops == 2.0 * 128 * 3072 * 768
    device = gpu.fake_device(loaded.cases)
    for case in (split, one):
        r = gpu.check_case_on_host(device, case)
        assert r.rel_err < 1e-5 and r.rerun_identical, (case.name, r.rel_err)


@pytest.mark.parametrize("name", list(gpu.CONFIGURED))
def test_tensor_core_peers_match_the_example_references(name):
    tc = gpu.CONFIGURED[name]
    small = {"matmul": {"m": 9, "k": 20, "n": 7}}.get(tc.example, {})
    if tc.example == "matmul":
        a, w = (np.random.default_rng(4).standard_normal(s) for s in ((9, 20), (20, 7)))
        (got,) = _peer64(name, [a, w])
        assert gpu.rel_err(got, a @ w) < 1e-12
        return
    inputs, outputs, reference = getattr(examples, tc.example)(**small)
    arrays = examples.random_inputs(inputs, seed=2)
    (got,) = _peer64(name, arrays)
    (want,) = reference(*arrays)
    assert gpu.rel_err(got, want) < 1e-12


def test_tables_put_each_case_beside_its_floor_plus_one_empty_launch(capsys):
    """Every case and peer pays one launch the floor leaves out (on the H100 of 2026-11-26
    the memory-bound cases sat 4.7-6.8 µs over their floors, torch.compile's likewise): the
    run's table and the day's give polyfuse / (floor + the measured empty launch) beside
    polyfuse / floor, and '-' where no launch was measured (the fake driver)."""
    import gpu_day
    import gpu_measure

    assert gpu_measure.over_launch(0.020, 0.0125, 0.0035) == pytest.approx(1.25)
    assert gpu_measure.over_launch(0.020, 0.0125, None) is None
    r = gpu.CaseResult("softmax", 1, polyfuse_ms=0.0175, floor_ms=0.0112, launch_ms=0.0045)
    r.rel_err, r.rerun_identical = 1e-7, True
    gpu_measure.print_table([r], {"softmax": types.SimpleNamespace(kernels=[])})
    row = capsys.readouterr().out.splitlines()[-1].split(" | ")
    assert row[8:10] == ["1.56", "1.11"], row
    run = {"device": {"name": "H"}, "ceilings": {"launch_ms": 0.0045},
           "results": [asdict(r) | {"best_peer_ms": None}]}  # fmt: skip
    day = gpu_day.Day("d", "c", "c", [], run=run)
    gpu_day.print_day(day)
    out = capsys.readouterr().out
    assert "one empty launch 0.0045" in out and "| 1.56 | 1.11 |" in out, out


def test_models_split_each_kernel_measured_beside_modelled(capsys):
    """``--models`` keeps each kernel's measured time (its launches timed apart) beside the
    cost model's, costliest first, and prints each model's costliest kernels: the next GPU
    day shows which kernels make a model's gap to its model (ViT-B/16: 14.2 ms measured on
    2026-11-26, 11.0 modelled)."""
    import gpu_models

    import polyfuse
    from polyfuse import zoo

    ins, outs, consts, _ = zoo.build("bert_base", "tiny", weights="zeros")
    fn = polyfuse.compile(ins, outs, constants=consts, arch="sm_90", check_cuda=False)
    launches = fn.launches
    per_launch = [0.001 * (i + 1) for i in range(len(launches))]
    rows = gpu_models.kernel_table(fn, launches, per_launch, "sm_90")
    assert sorted(r["kernel"] for r in rows) == sorted({lc.kernel for lc in launches})
    assert sum(r["launches"] for r in rows) == len(launches)
    assert sum(r["measured_ms"] for r in rows) == pytest.approx(sum(per_launch))
    times = [r["measured_ms"] for r in rows]
    assert times == sorted(times, reverse=True)
    kinds = ("gemm", "reduction", "stitched", "elementwise")
    assert all(r["modelled_ms"] > 0 and r["kind"] in kinds for r in rows)
    gpu_models.print_kernel_table([{"model": "bert_base", "kernels_ms": rows}], top=3)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5 and lines[2].startswith(f"| bert_base | {rows[0]['kernel']} |")
    import gpu_day

    model = {"model": "bert_base", "kernels": len(rows), "polyfuse_ms": 1.0, "kernels_ms": rows}
    gpu_day.print_day(gpu_day.Day("d", "c", "c", [], models={"models": [model]}))
    assert f"| bert_base | {rows[0]['kernel']} | {rows[0]['kind']} |" in capsys.readouterr().out
