"""``polyfuse fuzz --torch``: random PyTorch programs through the torch.compile backend,
compared with eager (:mod:`polyfuse.testing.torch_programs`)."""

from __future__ import annotations

import json
import sys

import pytest

pytestmark = pytest.mark.extra  # needs PyTorch (CI's extras step)
torch = pytest.importorskip("torch")

from polyfuse.cli import main  # noqa: E402
from polyfuse.testing.torch_programs import STEPS, Program, check, draw  # noqa: E402
from polyfuse.torch import lower  # noqa: E402

aten = torch.ops.aten

SOURCE = """import torch
import torch.nn.functional as F


def make_inputs():
    x0 = torch.linspace(-2, 2, 12).reshape(3, 4)
    return (x0,)


def f(x0):
    v0 = torch.tanh(x0) * 3 - 2  # tanh
    v1 = v0.amax(1)  # amax
    return (v0, v1,)
"""


def test_programs_are_drawn_deterministically_and_use_many_operators():
    a, b = draw(12, ("float32", "int64", "bool")), draw(12, ("float32", "int64", "bool"))
    assert a.source == b.source and "def f(" in a.source
    names = {line.split("# ")[-1] for s in range(40) for line in draw(s).source.splitlines()
             if "  # " in line}  # fmt: skip
    assert len(names) >= 30, names  # of the len(STEPS) templates
    assert names <= {name for name, _, _ in STEPS}


def test_a_planted_wrong_lowering_is_a_mismatch_naming_the_value(monkeypatch):
    program = Program(0, SOURCE, {"float32"})
    assert check(program).status == "pass"
    monkeypatch.setitem(lower.LOWERINGS, aten.tanh.default, lower.LOWERINGS[aten.sigmoid.default])
    o = check(program)
    assert o.status == "mismatch" and o.detail.startswith("value 0"), o.detail


def test_fuzz_torch_command_runs_programs_of_every_dtype(tmp_path, capsys):
    out = tmp_path / "fz.json"
    rc = main(["fuzz", "--torch", "--n", "6", "--seed", "40", "--dtypes", "all", "-q",
               "--json", str(out)])  # fmt: skip
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "polyfuse fuzz --torch: 6 programs (seeds 40..45)" in text and "6 pass" in text
    doc = json.loads(out.read_text())
    assert doc["counts"] == {"pass": 6} and doc["operators"] > 6


def test_fuzz_torch_without_pytorch_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)
    assert main(["fuzz", "--torch", "--n", "1"]) == 2
    assert "needs PyTorch: pip install 'polyfuse[torch]'" in capsys.readouterr().err


@pytest.mark.slow
def test_fuzz_torch_slow_tier():
    """30 programs of 10 operators over every dtype (a prefix of runs that passed in full;
    a stop runs more from a new seed by hand)."""
    from polyfuse.testing.torch_programs import fuzz_torch

    outcomes = fuzz_torch(30, 500_000, ("float32", "float16", "bfloat16", "float64", "int32",
                                         "int64", "bool"), steps=10)  # fmt: skip
    bad = [(o.program.seed, o.status, o.detail) for o in outcomes if o.failed]
    assert not bad, bad
