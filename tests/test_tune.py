"""``polyfuse tune``: candidates timed on a (fake) GPU, the winner stored and used later.

The fake driver (tests/fake_cuda.py) runs every launch on the emulator and returns event
timings from ``FakeGPU.kernel_ms``, so a candidate other than the modelled best can win
deterministically. Without a GPU the command says so in one line and stores nothing.
"""

from __future__ import annotations

import pytest
from fake_cuda import FakeBindings, FakeGPU

import polyfuse
import polyfuse.runner as runner_mod
from polyfuse.cache import CompileCache
from polyfuse.cli import main
from polyfuse.cuda.runtime import device as device_mod
from polyfuse.cuda.runtime import select as select_mod
from polyfuse.cuda.runtime.bindings_driver import BindingsDriver
from polyfuse.cuda.toolchain.compiler import CudaBinary
from polyfuse.errors import DeviceError
from polyfuse.examples import EXAMPLES
from polyfuse.tune import TuneError, tune


@pytest.fixture
def fake_gpu(monkeypatch):
    """Route the runtime to a fake GPU whose module image is the CUDA source."""
    gpu = FakeGPU()
    monkeypatch.setattr(select_mod, "_LOADED", {"cuda-bindings": BindingsDriver(FakeBindings(gpu))})
    monkeypatch.setattr(device_mod, "_DEVICES", {})
    monkeypatch.setenv("POLYFUSE_CUDA_RUNTIME", "cuda-bindings")
    monkeypatch.setattr(
        runner_mod,
        "compile_cuda",
        lambda source, arch, **kw: CudaBinary(
            arch, "nvrtc", "cubin", source.encode(), None, {}, "", 0.0
        ),
    )
    return gpu


@pytest.fixture
def no_gpu(monkeypatch):
    def refuse(ordinal=0, runtime=None):
        raise DeviceError("no GPU: cannot count CUDA devices: fake")

    monkeypatch.setattr(device_mod, "open_device", refuse)


def test_winner_stored_and_used_by_the_next_compile(fake_gpu, tmp_path):
    cache = CompileCache(tmp_path)
    # The second candidate is the fastest on this "GPU"; the modelled best (first) is slow.
    name = "pf_tune_matmul_c"
    lines: list[str] = []
    fake_gpu.kernel_ms = {f"{name}0": 0.030, f"{name}1": 0.010, f"{name}2": 0.020}
    (t,) = tune("matmul_bias_gelu", cache=cache, warmup=1, reps=3, top=3, say=lines.append)
    assert [c.function for c in t.candidates] == [f"{name}{i}" for i in range(3)]
    assert t.winner == 1 and t.candidates[1].measured_us == pytest.approx(10.0)
    assert fake_gpu.count("cuLaunchKernel") == 3 * (1 + 3)
    assert "winner candidate 2 stored" in lines[-1]
    win = t.candidates[1].tile

    inputs, outputs, _ = EXAMPLES["matmul_bias_gelu"].build()
    fn = polyfuse.compile(inputs, outputs, check_cuda=False, cache=CompileCache(tmp_path))
    (k,) = [k for k in fn.kernels if any("register micro-tile" in n for n in k.notes)]
    tuned = [n for n in k.notes if n.startswith("tuned on")]
    assert tuned and "10.0 us vs modelled best" in tuned[0], k.notes
    bm, bn, tm, tn, tk = win
    assert any(f"block tile {bm}x{bn}" in n and f"micro-tile {tm}x{tn}" in n for n in k.notes)
    assert "tuned on" in str(fn.plan)
    # Without the cache the modelled choice stays.
    plain = polyfuse.compile(inputs, outputs, check_cuda=False)
    assert not any("tuned on" in n for k in plain.kernels for n in k.notes)


def test_without_gpu_modelled_choice_kept_nothing_stored(no_gpu, tmp_path):
    cache = CompileCache(tmp_path)
    lines: list[str] = []
    (t,) = tune("matmul_bias_gelu", cache=cache, say=lines.append)
    assert lines[0].startswith("tune: no GPU present") and "\n" not in lines[0]
    assert "modelled choice kept" in lines[1] and "1. block" in lines[1]
    assert t.winner == 0 and all(c.measured_us is None for c in t.candidates)
    assert not list(tmp_path.rglob("*.json"))


def test_cli_without_gpu_exits_0(no_gpu, capsys):
    assert main(["tune", "matmul_bias_gelu", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "no GPU present" in out and "2. block" in out


def test_cli_bad_model_one_line_error(capsys):
    assert main(["tune", "no_such_model"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("polyfuse: error: tune: unknown model 'no_such_model'")
    assert "\n" not in err
    with pytest.raises(TuneError):
        tune("no_such_model")
