"""Shared-memory bank conflicts as the race-check emulator counts them.

A run with ``banks=True`` (race-check modules only: their ThreadSanitizer instrumentation is
what sees every plain shared-memory access) groups each access site's executions into
warp-level requests and prices each request the way the hardware serves shared memory: 32
banks of 4-byte words, one wavefront per phase (a warp for accesses up to 4 bytes, a half-warp
for 8 bytes, a quarter-warp for 16 bytes) plus one more for every further distinct word a bank
is asked for in that phase (lanes reading the same word share it). ``cp.async`` writes and
``ldmatrix`` rows (16 bytes per lane, an 8×8 matrix per quarter-warp) are counted the same
way. The report is per launch and per access site (source line, read or write, width):
``conflicts`` (wavefronts beyond one per phase) is 0 for a conflict-free access.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from polyfuse.base.errors import EmulatorError

from .races import source_lines
from .wire import BANK_CAP, BANK_HEADER, BANK_STAT


@dataclass(frozen=True)
class BankAccess:
    """One shared-memory access site of one launch: its warp-level requests and wavefronts."""

    line: int | None  # line of the kernel source (None where addr2line cannot tell)
    access: str  # "read" | "write"
    width: int  # bytes per lane
    requests: int  # warp-level executions
    wavefronts: int
    ideal: int  # one wavefront per phase

    @property
    def conflicts(self) -> int:
        """Wavefronts spent on bank conflicts (0: conflict-free)."""
        return self.wavefronts - self.ideal

    @property
    def degree(self) -> float:
        """Wavefronts per phase: 1.0 conflict-free, 32.0 all lanes on one bank."""
        return self.wavefronts / self.ideal if self.ideal else 1.0

    def __str__(self) -> str:
        at = f"line {self.line}" if self.line else "an unknown line"
        return (
            f"{self.access} of {self.width} B at {at}: {self.requests} requests, "
            f"{self.wavefronts} wavefronts ({self.degree:.2f}× the conflict-free "
            f"{self.ideal})"
        )


def decode_banks(library: Path, raw: np.ndarray, nlaunch: int) -> list[list[BankAccess]]:
    """The bank report in ``raw`` (a pf_bank_table, see pf_emu_rt.cpp) per launch, each list
    in source-line order."""
    n, overflow = (int(x) for x in raw[:BANK_HEADER].view(np.uint32))
    if overflow:
        raise EmulatorError(
            f"emulator bank report: {overflow} access sites did not fit its {BANK_CAP} entries "
            "(run fewer launches at a time)"
        )
    stats = raw[BANK_HEADER : BANK_HEADER + n * BANK_STAT.itemsize].view(BANK_STAT)
    lines = source_lines(library, [int(s["pc"]) for s in stats])
    # sites of one line (an unrolled loop's copies) are summed; unknown lines stay apart
    sums: list[dict[tuple, list[int]]] = [{} for _ in range(nlaunch)]
    for i, (s, line) in enumerate(zip(stats, lines, strict=True)):
        key = (line or 0, ("read", "write")[int(s["access"])], int(s["width"]), line or -i)
        acc = sums[int(s["launch"])].setdefault(key, [0, 0, 0])
        acc[0] += int(s["requests"])
        acc[1] += int(s["wavefronts"])
        acc[2] += int(s["ideal"])
    return [
        [BankAccess(k[0] or None, k[1], k[2], *v) for k, v in sorted(sites.items())]
        for sites in sums
    ]
