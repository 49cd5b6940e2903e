"""Checks shared by the tests of new operators: run a compiled graph, rerun it race-checked on
the emulator, compile its CUDA with NVRTC for sm_80 and sm_90 where installed (with no
register spills: :func:`compiles_without_spills`); skip a test without NVRTC and a SASS
disassembler (:func:`require_sass_tools`); a torch session with fresh Dynamo and polyfuse
caches for the tests that compile with PyTorch; the shared-memory bank sites of a tensor-core
kernel's cp.async writes and ldmatrix reads."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import polyfuse
from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda
from polyfuse.cuda.toolchain.sass import DisassemblerNotFound, find_disassembler


def require_sass_tools() -> None:
    """Skip unless NVRTC and a SASS disassembler are installed."""
    if "nvrtc" not in available_compilers():
        pytest.skip("NVRTC not installed")
    try:
        find_disassembler()
    except DisassemblerNotFound:
        pytest.skip("no SASS disassembler (pip install 'polyfuse[sass]')")


def compiles_without_spills(fn: Any, arch: str) -> Any:
    """NVRTC's result for compiled graph ``fn``'s CUDA for ``arch``: a cubin, and no kernel
    spilling registers."""
    res = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
    assert res.image
    for r in res.resources.values():
        assert r.spill_stores == r.spill_loads == 0, r
    return res


def run_checked(ins: Sequence[Any], outs: Sequence[Any], feed: Mapping[str, Any] | Sequence[Any]):
    """The outputs (a list) of the graph ``ins`` → ``outs`` on ``feed`` (arrays by input name,
    or in input order); the same again race-checked, the CUDA compiled by NVRTC for sm_80 and
    sm_90 where installed."""
    fn = polyfuse.compile(list(ins), list(outs))
    args = [feed[t.name] for t in ins] if isinstance(feed, Mapping) else list(feed)
    got = fn(*args)
    got = list(got) if isinstance(got, tuple) else [got]
    again = fn(*args, device="emulate", race_check=True)
    for g, a in zip(got, again if isinstance(again, tuple) else (again,), strict=True):
        np.testing.assert_array_equal(g, a)
    if "nvrtc" in available_compilers():
        for arch in ("sm_80", "sm_90"):
            assert compile_cuda(fn.cuda_source, arch, compiler="nvrtc").image
    return got


@contextmanager
def fresh_torch() -> Iterator[Any]:
    """``torch`` with Dynamo and polyfuse's compile caches reset before and after (a test's
    ``last_compiled()`` is its own compile)."""
    import torch

    import polyfuse.torch as pt

    torch._dynamo.reset()
    pt.reset()
    try:
        yield torch
    finally:
        torch._dynamo.reset()


def torch_matches_eager(fn: Any, *args: Any, atol: float = 1e-8) -> dict[str, Any]:
    """``fn`` compiled with ``backend="polyfuse"`` gives eager's outputs on ``args``: the same
    dtypes and shapes, equal values or (floats) close ones, NaN where eager has NaN; returns
    the compile's ``polyfuse_report``. Dynamo starts and ends fresh."""
    from polyfuse.torch import last_compiled

    with fresh_torch() as torch, torch.no_grad():
        want, got = fn(*args), torch.compile(fn, backend="polyfuse")(*args)
        want = want if isinstance(want, tuple) else (want,)
        got = got if isinstance(got, tuple) else (got,)
        for w, o in zip(want, got, strict=True):
            assert w.dtype == o.dtype and w.shape == o.shape, (w, o)
            same = torch.equal(w, o) or torch.allclose(w, o, atol=atol, equal_nan=True)
            assert same, (w, o)
        return last_compiled().polyfuse_report


def site_text(lines: Sequence[str], s: Any) -> str:
    """The kernel-source line of emulator bank site ``s`` (``lines``: the source's). A site
    whose line the library's line table does not give (GCC keeps none for code it merges
    from two source lines) is named by its kind where its direction and width tell it: a
    16-byte write is a ``cp.async`` (``pf_cp_async16(``), a 16-byte read an ``ldmatrix``
    row; else empty. Checks that such sites are conflict-free only get stricter."""
    if s.line is not None:
        return lines[s.line - 1]
    return {("write", 16): "pf_cp_async16(", ("read", 16): "pf_ldmatrix"}.get(
        (s.access, s.width), ""
    )


def bank_sites(fn: Any, arrays: Sequence[Any]) -> tuple[Any, list[Any], list[Any]]:
    """(result, cp.async write sites, ldmatrix read sites) of one emulator run of ``fn`` on
    ``arrays`` under the shared-memory bank counter (``race_check="banks"``)."""
    got = fn(*arrays, race_check="banks")
    lines = fn.cuda_source.splitlines()
    sites = [s for t in fn.last_traffic for s in t.shared_banks]

    copies = [s for s in sites if "pf_cp_async16(" in site_text(lines, s)]
    loads = [s for s in sites if "pf_ldmatrix" in site_text(lines, s)]
    return got, copies, loads


def exact_without_bank_conflicts(fn: Any, arrays: Sequence[Any], want: Any) -> None:
    """One run of ``fn`` under the bank counter equals ``want`` exactly (integer kernels),
    with at least two cp.async write sites and two ldmatrix read sites, none conflicting."""
    import numpy as np

    got, copies, loads = bank_sites(fn, arrays)
    np.testing.assert_array_equal(got, want)
    assert len(copies) >= 2 and len(loads) >= 2
    assert [str(s) for s in copies + loads if s.conflicts] == []
