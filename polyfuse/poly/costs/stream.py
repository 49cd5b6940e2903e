"""Descriptions of memory-bound kernels from their element counts (before any kernel exists).

Layer 1 decisions that weigh launch shapes of memory-bound kernels — elements per thread
(:mod:`polyfuse.poly.coarsen`), two-stage reductions (:mod:`polyfuse.poly.split`) — describe
each alternative as a *stream*: ``blocks`` x ``threads`` threads that read and write given
bytes, by 4-byte or 128-bit accesses, a few FP32 operations per element, and a serial loop of
``serial`` elements per thread where a lane strides a row. A thread keeps the loads of four
elements in flight (a serial loop, unrolled four times by NVRTC; or its few elements), unless
told otherwise.
"""

from __future__ import annotations

from polyfuse.poly.costs.desc import KernelDesc, Mix
from polyfuse.poly.costs.ops import ADDRESS
from polyfuse.poly.policy import ASSUMED_REGISTERS

#: loads one thread keeps in flight (a serial loop unrolled by four)
INFLIGHT_LOADS = 4
_INDEX = 10  # slots to decompose the block and thread index
_LOOP = 3  # slots per iteration of a serial loop


def stream_desc(
    name: str,
    blocks: int,
    threads: int,
    bytes_read: int,
    bytes_written: int,
    *,
    vector: bool = False,
    word_bytes: int = 16,
    itemsize: int = 4,
    serial: int = 1,
    fp_per_element: float = 2.0,
    combine_lanes: int = 0,
    registers: int = ASSUMED_REGISTERS,
    shared_bytes: int = 0,
    barriers: bool = False,
) -> KernelDesc:
    """A memory-bound kernel of ``blocks`` x ``threads`` threads moving the given bytes
    (``vector``: by whole-word accesses of ``word_bytes``; otherwise one ``itemsize``-byte
    element per access), each thread looping over ``serial`` elements and, when
    ``combine_lanes`` > 1, combining partial results across that many lanes."""
    per = max(1, blocks * threads)
    width = word_bytes if vector else itemsize
    rd, wr = bytes_read / per, bytes_written / per
    elements = max(rd, wr) / itemsize
    slots = _INDEX + (rd + wr) / width * (1 + ADDRESS) + fp_per_element * elements
    if serial > 1:
        slots += _LOOP * serial / INFLIGHT_LOADS
    mix = Mix(slots=slots, ffma=fp_per_element * elements / 2, fadd=fp_per_element * elements / 2,
              ldg=rd, stg=wr)  # fmt: skip
    if combine_lanes > 1:
        steps = max(1, combine_lanes.bit_length() - 1)
        warp = Mix(slots=3 * steps, fadd=steps, shfl=steps)
        block = Mix(slots=8, sts=4, lds=4, bar=2) if combine_lanes > 32 else Mix()
        mix = mix + warp + block
    inflight = min(rd, INFLIGHT_LOADS * width) if rd else 0.0
    return KernelDesc(
        name=name,
        source="stream estimate",
        blocks=blocks,
        threads=threads,
        registers=registers,
        shared_bytes=shared_bytes,
        mix=mix,
        bytes_read=int(bytes_read),
        bytes_written=int(bytes_written),
        vector_bytes=int(bytes_read + bytes_written) if vector else 0,
        inflight_bytes=inflight,
        barriers=barriers or combine_lanes > 32,
    )
