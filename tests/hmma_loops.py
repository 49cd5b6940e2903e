"""The tensor-core tests' SASS question: what the k-tile loop of a compiled kernel holds."""

from __future__ import annotations

import pytest


def hmma_loop(binary, arch: str, function: str | None = None) -> tuple[int, int, int, int]:
    """(HMMA, LDSM, LDGSTS, other instructions) of the first SASS loop (in block order) of
    ``binary`` (one kernel, or its function ``function``) that holds HMMA: the k-tile loop's
    steady state. Skips the test when NVIDIA's disassembler is not installed."""
    from polyfuse.cuda.toolchain.sass import (
        DisassemblerNotFound,
        find_disassembler,
        find_loops,
        parse_listing,
    )

    try:
        dis = find_disassembler()
    except DisassemblerNotFound:
        pytest.skip("NVIDIA's disassembler is not installed")
    listing = parse_listing(dis.disassemble(binary.image), arch)
    (f,) = listing.values() if function is None else (listing[function],)
    for lp in sorted(find_loops(f), key=lambda lp: min(lp.blocks)):
        ins = [i for b in lp.blocks for i in f.blocks[b].instructions]
        hmma = sum(i.opcode.startswith("HMMA") for i in ins)
        if hmma:
            ldsm = sum(i.opcode.startswith("LDSM") for i in ins)
            ldgsts = sum(i.opcode.startswith("LDGSTS") for i in ins)
            return hmma, ldsm, ldgsts, len(ins) - hmma
    raise AssertionError("no loop holds HMMA")
