"""The Layer 2 targets on the benchmark suite at full size (compile only, exact isl bytes).

Row-wise patterns: exactly one kernel and global bytes within 1.15x of compulsory; batch-norm
training forward in at most two kernels; on every subgraph no more kernels than the fewest
any peer in ../shared/bench/peers.json needs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import polyfuse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import suite  # noqa: E402

PEERS = ROOT.parent / "shared" / "bench" / "peers.json"
ROW_WISE = (
    "layernorm",
    "layernorm_lib",
    "softmax",
    "log_softmax",
    "residual_layernorm",
    "attn_softmax",
)
_fns: dict[str, polyfuse.CompiledGraph] = {}


def full(name: str) -> polyfuse.CompiledGraph:
    if name not in _fns:
        inputs, outputs, _ = suite.build(name, 1)
        _fns[name] = polyfuse.compile(inputs, outputs, check_cuda=False, name=name)
    return _fns[name]


@pytest.mark.parametrize("name", ROW_WISE)
def test_row_wise_pattern_is_one_kernel_near_compulsory_bytes(name):
    fn = full(name)
    assert len(fn.kernels) == 1, str(fn.plan)
    assert fn.global_bytes() <= 1.15 * fn.compulsory_bytes()


def test_batchnorm_training_forward_in_at_most_two_kernels():
    fn = full("batchnorm_train_relu")
    assert len(fn.kernels) <= 2
    assert fn.global_bytes() <= 1.15 * fn.compulsory_bytes()


@pytest.mark.parametrize("name", suite.NAMES)
def test_no_more_kernels_than_the_best_peer(name):
    if not PEERS.exists():
        pytest.skip(f"{PEERS} is not beside the repository")
    peers = json.loads(PEERS.read_text())["subgraphs"][name]
    best = min(v["kernels"] for k, v in peers.items() if isinstance(v, dict) and "kernels" in v)
    assert len(full(name).kernels) <= best
