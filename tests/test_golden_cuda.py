"""The generated CUDA is byte-for-byte what ``tests/golden/generate.py`` recorded.

Refactors of the lowering (issue 11) must not change behaviour; an intended change of the
generated code reruns ``python tests/golden/generate.py`` and commits the new goldens.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "golden"))
import generate  # noqa: E402

GRAPHS = dict(generate.graphs())


def test_every_graph_has_a_golden():
    recorded = {p.stem for p in generate.HERE.glob("*.cu")}
    assert recorded == set(GRAPHS), "rerun python tests/golden/generate.py"
    assert SLOW <= set(GRAPHS)


#: the tiny zoo models whose goldens take 7-11 s to compile: slow tier (the other three stay)
SLOW = {"zoo_vit_b16", "zoo_gpt2_small", "zoo_resnet50", "zoo_bert_base", "zoo_mobilenet_v2"}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in GRAPHS]
)
def test_cuda_matches_golden(name):
    want = generate.path_of(name).read_text()
    got = generate.cuda_of(name, GRAPHS[name])
    assert got == want, f"{name}: generated CUDA changed; see python tests/golden/generate.py"
