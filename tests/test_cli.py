"""Tests of the ``polyfuse`` command (polyfuse.cli), ``python -m polyfuse`` and the examples."""

from __future__ import annotations

import argparse
import io
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import polyfuse
from polyfuse import examples
from polyfuse.batch_progress import Progress
from polyfuse.cli import build_parser, main

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


# --------------------------------------------------------------------------- conventions (issue 25)
# Every subcommand: -q/-v, help on every flag, --size {tiny,full} where models load, --json -
# (JSON alone on stdout), one-line errors with exit status 2 for every user mistake.

SUBCOMMANDS = ["demo", "zoo", "viz", "explain", "fuzz", "tune", "sass"]
MODEL_VERBS = ["zoo", "viz", "explain", "tune", "sass"]  # those that load model arguments
_NEEDS_MODEL = {"viz", "explain", "tune", "sass"}


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _one_line_error(err: str) -> str:
    """The single stderr line of a refused command (no usage block, no traceback)."""
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("polyfuse") and "error:" in lines[0]
    return lines[0]


def test_every_subcommand_and_every_flag_has_help() -> None:
    subs = _subparsers()
    assert set(subs) == set(SUBCOMMANDS)
    missing = [
        f"{name} {a.option_strings or a.dest}"
        for name, p in subs.items()
        for a in p._actions
        if not a.help or a.help == argparse.SUPPRESS
    ]
    assert missing == []


@pytest.mark.parametrize("verb", SUBCOMMANDS)
def test_quiet_and_verbose_on_every_subcommand(verb: str) -> None:
    model = ["softmax"] if verb in _NEEDS_MODEL else []
    args = build_parser().parse_args([verb, *model, "-q"])
    assert args.quiet is True and args.verbose == 0
    args = build_parser().parse_args([verb, *model, "-vv"])
    assert args.quiet is False and args.verbose == 2


@pytest.mark.parametrize("verb", MODEL_VERBS)
def test_one_size_option_everywhere(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    model = ["softmax"] if verb in _NEEDS_MODEL else []
    assert build_parser().parse_args([verb, *model]).size == "full"
    assert build_parser().parse_args([verb, *model, "--size", "tiny"]).size == "tiny"
    assert main([verb, *model, "--size", "huge"]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "--size" in line and "'tiny', 'full'" in line


def test_zoo_tiny_is_a_deprecated_alias(capsys: pytest.CaptureFixture[str]) -> None:
    assert build_parser().parse_args(["zoo", "--tiny"]).size == "tiny"
    assert main(["zoo", "--help"]) == 0
    assert "--tiny                deprecated: the same as --size tiny" in capsys.readouterr().out


def test_zoo_help_says_how_to_reach_a_ray_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["zoo", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--ray-address ADDR" in out and "RAY_ADDRESS" in out and "ray start --head" in out
    assert "polyfuse zoo --size tiny --executor ray --ray-address" in out


NOISY_MODEL = """
import os
from polyfuse import ops, te

def build():
    print("print() in a model")
    os.write(1, b"os.write(1) in a model\\n")  # below Python: the file descriptor itself
    x = te.placeholder((4, 8), name="x")
    return [x], [ops.relu(x)]
"""


def test_zoo_json_to_stdout_alone(tmp_path: Path) -> None:
    """``--json -``: stdout carries the JSON document only; the table, the progress and
    whatever a model's code prints (in a worker, even on file descriptor 1) go to stderr."""
    (tmp_path / "noisy.py").write_text(NOISY_MODEL)
    args = ["zoo", "softmax", "noisy:build", "--size", "tiny", "--no-cuda-check", "--json", "-"]
    run = _run_module(*args, "--cache-dir", str(tmp_path / "cache"), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert [m["name"] for m in doc["models"]] == ["softmax", "build"] and doc["size"] == "tiny"
    assert re.search(r"total +2/2 ok", run.stderr) and "softmax: ok" in run.stderr
    assert "print() in a model" in run.stderr and "os.write(1) in a model" in run.stderr
    assert not (tmp_path / "-").exists()


@needs_emulator
@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "--only", "softmax", "--race-check"],
        ["viz", "softmax", "-o", "{tmp}/r.html"],
        ["fuzz", "--n", "2", "--no-shrink"],
        ["tune", "softmax"],
    ],
    ids=["demo", "viz", "fuzz", "tune"],
)
def test_json_dash_is_json_only_on_stdout(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main([*argv, "--json", "-"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # nothing else on stdout
    assert isinstance(doc, dict) and doc
    assert captured.err  # what would have gone to stdout went to stderr
    assert not (tmp_path / "-").exists()


def test_shapes_on_a_model_that_is_not_onnx(tmp_path: Path, capsys) -> None:
    for argv in (
        ["zoo", "softmax", "--size", "tiny", "--cache-dir", str(tmp_path)],
        ["explain", "softmax"],
        ["viz", "deepfm", "--size", "tiny", "-o", str(tmp_path / "r.html")],
    ):
        assert main([*argv, "--shapes", "x=4,4"]) == 2
        line = _one_line_error(capsys.readouterr().err)
        assert "--shapes fixes the dynamic input dims of .onnx models" in line
    assert not list(tmp_path.iterdir())  # refused before any work


def test_unknown_model_exits_2_before_any_work(tmp_path: Path, capsys) -> None:
    out = tmp_path / "report.json"
    argv = ["zoo", "softmax", "no_such_model", "--size", "tiny", "--json", str(out)]
    assert main([*argv, "--cache-dir", str(tmp_path / "cache")]) == 2
    captured = capsys.readouterr()
    line = _one_line_error(captured.err)  # once, not once per place it was reported
    assert "unknown model 'no_such_model': not a zoo model" in line
    assert captured.out == "" and not out.exists() and not (tmp_path / "cache").exists()


def _user_mistakes(tmp_path: Path) -> dict[str, list[str]]:
    (tmp_path / "bad_syntax.py").write_text("inputs = (\n")
    (tmp_path / "not_tensors.py").write_text("inputs = [1]\noutputs = [2]\n")
    mod = f"pf_user_mods_{tmp_path.name}"  # a fresh module name per test
    (tmp_path / f"{mod}.py").write_text("x = 1\n")
    return {
        "negative budget": ["viz", "softmax", "--budget", "-5"],
        "syntax error": ["viz", str(tmp_path / "bad_syntax.py")],
        "not tensors": ["viz", str(tmp_path / "not_tensors.py")],
        "no such function": ["explain", f"{mod}:nope"],
        "no such module": ["viz", "nosuchmod_pf:f"],
        "zoo no such module": ["zoo", "nosuchmod_pf:f"],
        "zoo no such function": ["zoo", f"{mod}:nope"],
        "jobs 0": ["zoo", "softmax", "--jobs", "0"],
        "fuzz batch 0": ["fuzz", "--batch", "0"],
        "tune top 0": ["tune", "softmax", "--top", "0"],
        "tune arch": ["tune", "softmax", "--arch", "sm_1000"],
        "sass missing .cu": ["sass", str(tmp_path / "missing.cu")],
    }


@pytest.mark.parametrize(
    "what",
    [
        "negative budget", "syntax error", "not tensors", "no such function", "no such module",
        "zoo no such module", "zoo no such function", "jobs 0", "fuzz batch 0", "tune top 0",
        "tune arch", "sass missing .cu",
    ],
)  # fmt: skip
def test_user_mistakes_are_one_line_exit_2(
    what: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)  # module:function is found next to the user
    argv = _user_mistakes(tmp_path)[what]
    assert main(argv) == 2
    line = _one_line_error(capsys.readouterr().err)
    name = {
        "no such function": "module 'pf_user_mods_",
        "zoo no such function": "has no function 'nope'",
        "not tensors": "inputs must be a te tensor or a list of them, not int",
        "syntax error": "line 1: syntax error: '(' was never closed",
        "negative budget": "argument --budget: expected a positive integer, got -5",
        "no such module": "no module named 'nosuchmod_pf'",
    }.get(what, "")
    assert name in line


def test_user_mistake_in_a_real_process_has_no_traceback(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("inputs = (\n")
    run = _run_module("viz", "bad.py", cwd=tmp_path)
    assert run.returncode == 2 and run.stdout == ""
    line = _one_line_error(run.stderr)
    assert line == "polyfuse: error: viz: 'bad.py' line 1: syntax error: '(' was never closed"


def test_vv_shows_the_traceback_behind_an_error(tmp_path: Path, capsys) -> None:
    (tmp_path / "bad.py").write_text("inputs = (\n")
    assert main(["viz", str(tmp_path / "bad.py"), "-vv"]) == 2
    err = capsys.readouterr().err
    assert "\npolyfuse: error: viz:" in err and "Traceback" in err and "SyntaxError" in err


def test_zoo_progress_shows_eta_and_what_is_running() -> None:
    stream = io.StringIO()
    p = Progress(3, stream=stream)
    p.started(2, "process")
    p.running("a")
    p.running("b")
    rep = {"status": "ok", "model_cache": "miss", "kernels": 3, "total_seconds": 0.5}
    p.finished({**rep, "name": "a"})
    p.running("c")
    p.finished({"name": "b", "status": "error", "reason": "broken"})
    p.finished({**rep, "name": "c", "model_cache": "hit"})
    lines = stream.getvalue().splitlines()
    assert lines[0] == "polyfuse zoo: 3 models, 2 process workers"
    eta = r"\d\d:\d\d<(\d\d:\d\d|\?)"
    assert re.fullmatch(rf"\[1/3 {eta}\] a: ok, 3 kernels, 0\.5 s; running: b", lines[1])
    assert re.fullmatch(rf"\[2/3 {eta}, 1 failed\] b: FAILED: broken; running: c", lines[2])
    assert re.fullmatch(rf"\[3/3 {eta}, 1 failed\] c: ok, 3 kernels, 0\.5 s \(cached\)", lines[3])


def test_zoo_progress_on_a_terminal_is_a_tqdm_bar() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    p = Progress(2, stream=stream)
    p.started(2, "process")
    p.running("a")
    p.running("b")
    p.finished({"name": "a", "status": "ok", "model_cache": "miss", "kernels": 1,
                "total_seconds": 0.1})  # fmt: skip
    text = stream.getvalue()
    assert "running: a, b" in text and "running: b" in text  # redrawn as models end
    assert "  a: ok, 1 kernels" in text and "1/2 [" in text and "<" in text  # bar, ETA
    p.close()


# --------------------------------------------------------------------------- the Python API


class HostDLPack:
    """A host array from some library: only the DLPack protocol."""

    def __init__(self, a: np.ndarray) -> None:
        self._a = a

    def __dlpack__(self, **kwargs: object) -> object:
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._a.__dlpack_device__()


@pytest.fixture(scope="module")
def softmax_fn() -> tuple[polyfuse.CompiledGraph, np.ndarray, np.ndarray]:
    inputs, outputs, reference = examples.EXAMPLES["softmax"].build()
    fn = polyfuse.compile(inputs=inputs, outputs=outputs, check_cuda=False, name="softmax")
    (x,) = examples.random_inputs(inputs)
    (want,) = reference(x)
    return fn, x, want


@needs_emulator
def test_call_accepts_any_host_dlpack_array(softmax_fn) -> None:
    fn, x, want = softmax_fn
    got = fn(HostDLPack(x))
    assert isinstance(got, np.ndarray)  # another library's array in: numpy out
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(got, fn(x))


def test_short_reprs_and_describe(softmax_fn) -> None:
    fn, _, _ = softmax_fn
    k = fn.kernels[0]
    for r in (repr(k), repr(fn)):
        assert "\n" not in r and len(r) <= 200, r
    assert repr(k).startswith(f"<Kernel {k.name}: grid {k.grid}, block {k.block}")
    assert repr(fn).startswith("<CompiledGraph softmax: (x[") and "for sm_80>" in repr(fn)
    assert k.source and k.source in k.describe() and str(k) in k.describe()
    assert str(fn.plan) in fn.describe() and all(str(la) in fn.describe() for la in fn.launches)


def test_visualize_returns_the_html_path(softmax_fn, tmp_path: Path) -> None:
    fn, _, _ = softmax_fn
    path = fn.visualize(tmp_path / "report.html")
    assert path == (tmp_path / "report.html").resolve()
    assert path.read_text(encoding="utf-8").lstrip().lower().startswith("<!doctype html")


def test_verbose_logs_to_stderr_and_leaves_logging_as_it_was(capsys) -> None:
    log = logging.getLogger("polyfuse")
    level, handlers = log.level, list(log.handlers)
    assert main(["explain", "softmax", "-v"]) == 0
    err = capsys.readouterr().err
    assert "polyfuse.models: INFO: loading example model 'softmax' (size full)" in err
    assert main(["explain", "softmax"]) == 0  # without -v: no INFO
    assert "INFO" not in capsys.readouterr().err
    assert (log.level, log.handlers) == (level, handlers)
