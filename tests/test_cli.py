"""Tests of the ``polyfuse`` command (polyfuse.cli), ``python -m polyfuse`` and the examples."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import polyfuse
from polyfuse import examples
from polyfuse.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_SCRIPTS = sorted((ROOT / "examples").glob("*.py"))


def _emulator_available() -> bool:
    try:
        import polyfuse.cuda.emulator  # noqa: F401
    except ImportError:
        return False
    return True


needs_emulator = pytest.mark.skipif(
    not _emulator_available(), reason="polyfuse.cuda.emulator is not available"
)


def _run_module(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "polyfuse", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


# --------------------------------------------------------------------------- arguments


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"polyfuse {polyfuse.__version__}"


def test_demo_help_lists_examples_and_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--help"]) == 0
    out = capsys.readouterr().out
    for word in ("--out", "--arch", "--only", "--race-check", "--quiet", "exit status"):
        assert word in out
    for name in examples.EXAMPLES:
        assert name in out


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "demo" in capsys.readouterr().err


def test_unknown_example_is_a_clean_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--only", "no_such_example", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no_such_example" in err and "invalid choice" in err
    assert "Traceback" not in err
    assert not list(tmp_path.iterdir())


def test_unknown_arch_is_a_clean_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--arch", "sm_12"]) == 2
    err = capsys.readouterr().err
    assert "sm_12" in err and "Traceback" not in err


def test_polyfuse_error_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise polyfuse.errors.ScheduleError("compile 'softmax': isl gave up\n(second line)")

    monkeypatch.setattr(polyfuse, "compile", broken)
    assert main(["demo", "--only", "softmax", "--out", str(tmp_path), "--quiet"]) == 2
    captured = capsys.readouterr()
    errors = [ln for ln in captured.err.splitlines() if ln.startswith("polyfuse: error:")]
    assert errors == [
        "polyfuse: error: softmax: compiling: compile 'softmax': isl gave up (second line)"
    ]
    assert "Traceback" not in captured.err
    assert "ERROR" in captured.out  # the summary table still prints


def test_wrong_result_fails_with_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A result that differs from numpy is a FAIL (exit 1) with a one-line reason."""

    class Fake:
        def __init__(self, fn: polyfuse.CompiledGraph) -> None:
            self.fn = fn

        def __getattr__(self, name: str) -> object:
            return getattr(self.fn, name)

        def __call__(self, *arrays: np.ndarray, **kwargs: object) -> np.ndarray:
            return np.zeros(self.fn.outputs[0].shape, np.float32)

    real = polyfuse.compile
    monkeypatch.setattr(polyfuse, "compile", lambda *a, **k: Fake(real(*a, **k)))
    assert main(["demo", "--only", "softmax", "--out", str(tmp_path), "--quiet"]) == 1
    captured = capsys.readouterr()
    fails = [ln for ln in captured.err.splitlines() if "FAIL" in ln]
    assert len(fails) == 1 and "softmax" in fails[0] and "differ from numpy" in fails[0]
    assert "FAIL" in captured.out
    assert (tmp_path / "softmax.cu").exists()


# --------------------------------------------------------------------------- examples


@pytest.mark.parametrize("name", list(examples.EXAMPLES))
def test_examples_build_and_compile(name: str) -> None:
    """Every example compiles, and its numpy reference has the outputs' shapes."""
    inputs, outputs, reference = examples.EXAMPLES[name].build()
    fn = polyfuse.compile(inputs=inputs, outputs=outputs, check_cuda=False, name=name)
    assert fn.kernels and "__global__" in fn.cuda_source
    want = reference(*examples.random_inputs(inputs))
    assert [w.shape for w in want] == [t.shape for t in outputs]
    assert any(d % 32 for t in inputs for d in t.shape)


def test_max_error() -> None:
    a = np.ones((2, 3), np.float32)
    assert examples.max_error(a, (a + 0.5,)) == 0.5
    assert examples.max_error((a,), (np.ones((3, 2)),)) == float("inf")
    assert examples.max_error(np.full_like(a, np.nan), a) == float("inf")


# --------------------------------------------------------------------------- demo runs


@needs_emulator
def test_demo_softmax(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "out"
    assert main(["demo", "--only", "softmax", "--out", str(out_dir)]) == 0
    captured = capsys.readouterr()
    cu = out_dir / "softmax.cu"
    assert cu.exists() and "__global__" in cu.read_text()
    assert "== polyfuse plan: softmax ==" in captured.out
    assert "micrographs" in captured.out and "PASS" in captured.out
    assert str(out_dir.resolve()) in captured.out
    assert "softmax: compiling" in captured.err  # progress goes to stderr


@needs_emulator
def test_demo_quiet_prints_only_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--only", "softmax", "--out", str(tmp_path), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "polyfuse plan" not in captured.out
    assert "PASS" in captured.out and "max error" in captured.out
    assert captured.err == ""


def test_python_m_polyfuse_version_and_errors(tmp_path: Path) -> None:
    version = _run_module("--version", cwd=tmp_path)
    assert version.returncode == 0
    assert version.stdout.strip() == f"polyfuse {polyfuse.__version__}"
    bad = _run_module("demo", "--only", "nope", cwd=tmp_path)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    assert "Traceback" not in bad.stderr


@needs_emulator
def test_python_m_polyfuse_demo(tmp_path: Path) -> None:
    run = _run_module("demo", "--only", "softmax", "--race-check", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "PASS" in run.stdout and "reverse order" in run.stdout
    assert (tmp_path / "polyfuse-demo-out" / "softmax.cu").exists()


@pytest.mark.slow
@needs_emulator
def test_demo_all_examples(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--out", str(tmp_path), "--race-check", "--quiet"]) == 0
    out = capsys.readouterr().out
    for name in examples.EXAMPLES:
        assert (tmp_path / f"{name}.cu").exists()
        assert name in out
    assert f"{len(examples.EXAMPLES)}/{len(examples.EXAMPLES)} PASS" in out


@pytest.mark.slow
@needs_emulator
@pytest.mark.parametrize("script", EXAMPLE_SCRIPTS, ids=lambda p: p.name)
def test_example_script(script: Path, tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "polyfuse plan" in run.stdout and "max |error| vs numpy" in run.stdout
