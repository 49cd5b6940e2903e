"""Reproducible plans: a compile gives the same kernels, packs and byte-identical CUDA whether
its parts come from the compile cache or not (issue 19, item 6). The cache keeps what a plan
needs: kernel facts, layout records and the read footprints Layer 3 intersects."""

import sys
from pathlib import Path

import numpy as np
import pytest

import polyfuse
from polyfuse import examples, ops, te, zoo
from polyfuse.cache import CompileCache
from polyfuse.reference import evaluate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import suite  # noqa: E402

SUITE_SCALE = 16


def _cold_and_warm(
    monkeypatch, tmp_path, inputs, outputs, constants=None, name="graph", passes=True
):
    """Two compiles through one fresh ``$POLYFUSE_CACHE``: the first fills it, the second (a new
    cache object, as another process would make) reads it."""
    monkeypatch.setenv("POLYFUSE_CACHE", str(tmp_path / "cache"))
    fns = []
    for _ in range(2):
        cache = CompileCache.default()
        fn = polyfuse.compile(
            inputs,
            outputs,
            constants=constants,
            check_cuda=False,
            cache=cache,
            name=name,
            passes=passes,
        )
        fns.append(fn)
    return fns


def _assert_same(cold, warm, name):
    assert warm.cache_stats["hits"] > 0 and warm.cache_stats["misses"] == 0, name
    assert len(cold.kernels) == len(warm.kernels), (name, str(cold.plan), str(warm.plan))
    assert cold.cuda_source == warm.cuda_source, name
    assert [str(d) for d in cold.plan.packs] == [str(d) for d in warm.plan.packs], name
    assert [k.facts for k in cold.kernels] == [k.facts for k in warm.kernels], name
    assert [(k.bytes_read, k.bytes_written) for k in cold.kernels] == [
        (k.bytes_read, k.bytes_written) for k in warm.kernels
    ], name


def test_cached_stitched_kernels_sharing_an_input_pack_as_when_generated(monkeypatch, tmp_path):
    """Two stitched reductions and an elementwise branch read x: cold, the stitched ones were
    packed; warm, cached parts had no footprint of x and stayed apart (2 kernels, then 3).
    Graph passes off: CSE would merge the two row maxima and sums, leaving one stitched
    reduction and nothing to pack."""
    x = te.placeholder((64, 384), name="x")
    outs = [ops.softmax(x, name="a"), ops.log_softmax(x, name="b"), ops.relu(x, name="c")]
    cold, warm = _cold_and_warm(monkeypatch, tmp_path, [x], outs, passes=False)
    _assert_same(cold, warm, "branches")
    assert len(warm.kernels) == 2 and any(d.packed for d in warm.plan.packs)
    arr = np.random.default_rng(0).standard_normal(x.shape, dtype=np.float32)
    for fn in (cold, warm):
        for got, want in zip(fn(arr), evaluate(outs, {x: arr}), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        # the pack reads x once, in the model and in the emulator's count
        assert sum(t.bytes_read for t in fn.last_traffic) == sum(k.bytes_read for k in fn.kernels)


@pytest.mark.parametrize("name", sorted(examples.EXAMPLES))
def test_examples_compile_alike_cold_and_warm(monkeypatch, tmp_path, name):
    inputs, outputs, _ = examples.EXAMPLES[name].build()
    _assert_same(*_cold_and_warm(monkeypatch, tmp_path, inputs, outputs, name=name), name)


@pytest.mark.parametrize("name", suite.NAMES)
def test_suite_subgraphs_compile_alike_cold_and_warm(monkeypatch, tmp_path, name):
    inputs, outputs, _ = suite.build(name, SUITE_SCALE)
    _assert_same(*_cold_and_warm(monkeypatch, tmp_path, inputs, outputs, name=name), name)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_tiny_zoo_models_compile_alike_cold_and_warm(monkeypatch, tmp_path, name):
    m = zoo.build(name, "tiny")
    fns = _cold_and_warm(monkeypatch, tmp_path, m.inputs, m.outputs, m.constants, name)
    _assert_same(*fns, name)
