"""The SASS instrument: what the GPU will execute, measured without a GPU.

NVRTC (or nvcc) compiles a translation unit to a cubin per arch, NVIDIA's disassembler prints
its SASS (:mod:`.tools`), the listing becomes typed instructions and basic blocks
(:mod:`.parse`), natural loops with trip counts (:mod:`.loops`, :mod:`.trips`) and the hot
loop's instruction mix per iteration (:mod:`.mix`); :mod:`.analyse` adds registers, spills,
shared memory, occupancy and an issue-bound time estimate per kernel, :mod:`.vector` checks
that the kernel IR's float4 accesses are 128-bit in SASS, :mod:`.records` holds the typed
results and prints them.

    from polyfuse.cuda.toolchain.sass import analyse
    report = analyse(compiled.cuda_source, ("sm_80", "sm_90"), kernels=compiled.kernels)
    print(report)                       # per-kernel blocks and the table
    report.to_dict()                    # JSON form
"""

from polyfuse.cuda.toolchain.sass.analyse import DEFAULT_ARCHS, analyse, analyse_function, estimate
from polyfuse.cuda.toolchain.sass.loops import (
    TENSOR_MMA,
    HmmaLoop,
    HotLoop,
    Loop,
    find_loops,
    hmma_loop,
    hot_loop,
)
from polyfuse.cuda.toolchain.sass.mix import CLASSES, InstrMix, classify
from polyfuse.cuda.toolchain.sass.parse import Block, Instruction, SassFunction, parse_listing
from polyfuse.cuda.toolchain.sass.records import (
    Estimate,
    KernelSass,
    Launch,
    SassReport,
    VectorAccess,
    VectorCheck,
    format_table,
)
from polyfuse.cuda.toolchain.sass.tools import (
    INSTALL_HINT,
    Disassembler,
    DisassemblerNotFound,
    DisassemblyError,
    find_disassembler,
)
from polyfuse.cuda.toolchain.sass.trips import TripCount
from polyfuse.cuda.toolchain.sass.vector import vector_check

__all__ = [
    "CLASSES",
    "DEFAULT_ARCHS",
    "INSTALL_HINT",
    "Block",
    "Disassembler",
    "DisassemblerNotFound",
    "DisassemblyError",
    "Estimate",
    "HmmaLoop",
    "HotLoop",
    "InstrMix",
    "Instruction",
    "KernelSass",
    "Launch",
    "Loop",
    "SassFunction",
    "SassReport",
    "TripCount",
    "VectorAccess",
    "VectorCheck",
    "analyse",
    "analyse_function",
    "classify",
    "estimate",
    "find_disassembler",
    "find_loops",
    "format_table",
    "hmma_loop",
    "TENSOR_MMA",
    "hot_loop",
    "parse_listing",
    "vector_check",
]
