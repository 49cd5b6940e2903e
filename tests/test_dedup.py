"""Structurally identical kernels share one ``__global__`` function (cuda/codegen/dedup.py)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import polyfuse
from polyfuse.cache import CompileCache
from polyfuse.cuda.codegen.pack import pack_parts
from polyfuse.cuda.codegen.printer import PRELUDE
from polyfuse.cuda.emulator import Emulator
from polyfuse.zoo import build


@pytest.fixture(scope="module")
def gpt2():
    m = build("gpt2_small", "tiny")
    fn = polyfuse.compile(m.inputs, m.outputs, constants=m.constants, check_cuda=False)
    return m, fn


def test_source_has_one_body_per_distinct_kernel(gpt2):
    _, fn = gpt2
    functions = {k.function or k.name for k in fn.kernels}  # packed launches: their own
    head = r"__global__ void (?:__launch_bounds__\([\d, ]+\) )?(\w+)\("  # GEMM: (T, B)
    defined = re.findall(head, fn.cuda_source)
    assert sorted(defined) == sorted(functions)  # each distinct body exactly once
    assert len(functions) < len(fn.kernels)  # the two layers share their kernels
    bodies = {}
    for k in fn.kernels:
        assert k.source in fn.cuda_source
        if not k.function:  # a pack with a part from outside the structural cache
            assert k.name.startswith("pk")
            continue
        assert k.function.startswith("pf_")
        bodies.setdefault(k.function, k.source)
        assert bodies[k.function] == k.source
    assert len(set(bodies.values())) == len(bodies)  # different names, different bodies
    entry = {launch.kernel: launch.entry for launch in fn.launches}
    assert all(entry[k.name] == (k.function or k.name) for k in fn.kernels)


def test_shared_functions_give_identical_results(gpt2):
    m, fn = gpt2
    args = m.sample_inputs(3)
    shared = fn(*args, device="emulate")
    # The same launches against one private copy of the function per kernel (no sharing).
    private = PRELUDE + "\n".join(
        k.source.replace(k.function, k.name) if k.function else k.source for k in fn.kernels
    )
    module = Emulator().load(private)
    bufs = fn._bind(tuple(args), {})
    module.run([dataclasses.replace(lc, function="") for lc in fn.launches], bufs)
    alone = tuple(bufs[fn._idents[t.uid]] for t in fn.outputs)
    shared = shared if isinstance(shared, tuple) else (shared,)
    for a, b in zip(shared, alone, strict=True):
        np.testing.assert_array_equal(a, b)
    for a, r in zip(shared, m.reference(*args), strict=True):
        np.testing.assert_allclose(a, r, rtol=2e-3, atol=2e-3)


def test_identical_packs_share_a_function(gpt2):
    """The layers' Layer 3 packs are alike, so they run one function (they ran one each).
    Compiled without the graph passes: the layout fold leaves GPT-2 no reshape kernels to pack
    beside its GEMMs."""
    m, _ = gpt2
    fn = polyfuse.compile(
        m.inputs, m.outputs, constants=m.constants, check_cuda=False, passes=False
    )
    packs = [k for k in fn.kernels if pack_parts(k)]
    assert len(packs) >= 2
    assert all(k.function.startswith("pf_") for k in packs)
    assert len({k.function for k in packs}) < len(packs)


def test_warm_compile_shares_the_same_functions(tmp_path, gpt2):
    m, fn = gpt2
    cache = CompileCache(tmp_path)
    a = polyfuse.compile(m.inputs, m.outputs, constants=m.constants, cache=cache, check_cuda=False)
    b = polyfuse.compile(m.inputs, m.outputs, constants=m.constants, cache=cache, check_cuda=False)
    assert b.cache_stats["misses"] == 0
    assert [k.function for k in a.kernels] == [k.function for k in b.kernels]
    assert a.cuda_source == b.cuda_source == fn.cuda_source


def test_only_identical_bodies_share_a_function():
    from polyfuse import te

    x, y = te.placeholder((8, 16), name="x"), te.placeholder((8, 16), name="y")
    a = te.compute((8, 16), lambda i, j: x[i, j] * 2.0, name="a")
    b = te.compute((8, 16), lambda i, j: y[i, j] * 2.0, name="b")  # same body as a
    c = te.compute((8, 16), lambda i, j: y[i, j] * 3.0, name="c")  # another constant
    fn = polyfuse.compile([x, y], [a, b, c], check_cuda=False, pack=False)  # three launches
    by_name = {k.name.split("_", 1)[1]: k.function for k in fn.kernels}
    assert by_name["a"] == by_name["b"] != by_name["c"]
    xs = np.arange(128, dtype=np.float32).reshape(8, 16)
    ys = xs[::-1].copy()
    ra, rb, rc = fn(xs, ys, device="emulate")
    np.testing.assert_array_equal(ra, xs * 2)
    np.testing.assert_array_equal(rb, ys * 2)
    np.testing.assert_array_equal(rc, ys * 3)
