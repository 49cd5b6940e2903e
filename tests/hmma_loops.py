"""The tensor-core tests' SASS question: what the k-tile loop of a compiled kernel holds."""

from __future__ import annotations

import pytest


def hmma_loop(binary, arch: str, function: str | None = None) -> tuple[int, int, int, int]:
    """(HMMA, LDSM, LDGSTS, other instructions) per k-tile of the first SASS loop (in block
    order) of ``binary`` (one kernel, or its function ``function``) that holds HMMA: the
    k-tile loop's steady state (:func:`polyfuse.cuda.toolchain.sass.hmma_loop`; a steady
    state unrolled by its stages counted per k-tile, :meth:`~polyfuse.cuda.toolchain.sass.
    loops.HmmaLoop.per_ktile`). Skips the test when NVIDIA's disassembler is not installed."""
    from polyfuse.cuda.toolchain.sass import (
        DisassemblerNotFound,
        find_disassembler,
        hmma_loop,
        parse_listing,
    )

    try:
        dis = find_disassembler()
    except DisassemblerNotFound:
        pytest.skip("NVIDIA's disassembler is not installed")
    listing = parse_listing(dis.disassemble(binary.image), arch)
    (f,) = listing.values() if function is None else (listing[function],)
    loop = hmma_loop(f)
    if loop is None:
        raise AssertionError("no loop holds HMMA")
    loop = loop.per_ktile()
    return loop.hmma, loop.ldsm, loop.ldgsts, loop.other
