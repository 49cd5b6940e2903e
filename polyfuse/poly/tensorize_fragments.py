"""Whether a tensorized kernel double-buffers its register fragments (ALCOP's second level).

ALCOP pipelines two levels: global -> shared over S stages (:mod:`polyfuse.poly.costs.stages`,
:func:`polyfuse.poly.tensorize.map_tensor_core`), and shared -> registers over the k-steps of
a k-tile: two fragment buffers, the ``ldmatrix`` loads of k-step ``kk + 1`` issued before the
``mma.sync`` of k-step ``kk``, the first k-step's loaded before the k-tile loop and, across a
k-tile boundary, the next k-tile's first fragments loaded right after its ``wait_group`` and
barrier, before the last k-step's mma (the code: :mod:`polyfuse.cuda.codegen.lower_mma_fragments`).
The loads' shared-memory latency then runs under mma work instead of in front of it, the
barrier's included.

The price is one more k-step's fragments live per thread (``4 tiles_m + 2 tiles_n``
registers); :func:`choose_fragment_buffers` takes two buffers where that stays inside the
register budget and the k-tile loop has the shape the second level needs, else one, with the
reason either way (a plan note of kind ``register fragment``; the tensorize record's
``fragment_buffers``).

The same register budget decides whether a pipelined kernel's steady k-tile loop is unrolled by
its S stages (:func:`stage_unroll`): then every stage a k-tile reads or fills is a constant
(``(kt + i) mod S`` of an unrolled loop, folded by NVRTC) instead of two wrapping counters
whose products with the stage size are added to each shared address at run time — 12-14
SASS instructions of a k-tile that issues 16 HMMA on a 64x64 tile of four warps (BERT-base's
FFN down: 2.88 non-HMMA instructions per HMMA rolled, 1.70 unrolled, sm_80). The price is
registers (each stage's addresses live at once); tiles whose 64x64 warp tiles already take
most of them stay rolled.
"""

from __future__ import annotations

from dataclasses import replace

from polyfuse.base.decision import DecisionKind, DecisionNote, noted
from polyfuse.base.decision_data import TensorCoreData
from polyfuse.poly.device import DeviceSpec
from polyfuse.poly.tensorize import CHUNK, TensorCoreKernel
from polyfuse.poly.tensorize_tiling import MmaTiling

#: the note's kinds: a decision about tensor cores' register fragments
KINDS = (DecisionKind.TENSOR_CORES, DecisionKind.REGISTER_FRAGMENT)


#: registers ptxas keeps past the model's count for a double-buffered loop (calibrated on
#: NVRTC 13.0: the 128x256x32 bf16 tile, modelled 232, took 246 (sm_80) / 250 (sm_90)) and per
#: k-step past two (its 64-deep k-tile, and tf32's 32-deep one, spilled 24-276 bytes at 255)
PTXAS_MARGIN, PTXAS_PER_STEP = 18, 12


#: registers the steady state unrolled by its stages keeps past the rolled loop's model
#: (NVRTC 13.0: attention's PV at 128x64 of four 64x32 warps, double-buffered, modelled 170,
#: took 196 unrolled on sm_90; the 64x64 tile of four warps, 122, took 124). The 64x64-warp
#: tiles stay rolled with it: unrolled they took all 255 registers and spilled 8-240 bytes
#: (4096^3 at S = 3, the 3x3 conv, attention, double-buffered at a modelled 250; 4096^3 with
#: single-buffered fragments, modelled 218, spilled 8 bytes on sm_90)
UNROLL_MARGIN = 40


def ptxas_margin(steps: int) -> int:
    """Registers a double-buffered loop of ``steps`` k-steps needs past the model's count."""
    return PTXAS_MARGIN + PTXAS_PER_STEP * max(0, steps - 2)


def fold_registers(tk: TensorCoreKernel) -> int:
    """Registers a folded, chunk-gathered B fill keeps live across the k-tile loop: one per
    chunk a thread copies (the fold's second row coordinate, ``pf_r % width``, beside the
    row's own part of the offset). Calibrated on NVRTC 13.0, sm_80, the bf16 3x3 convs of N
    32, 64 -> 64 channels, 56x56 (columns folded: 56 x 56 at stride 1, 28 x 28 at stride 2),
    a 64x256x32 tile double-buffered at a modelled 250 registers: ptxas took all 255 at
    stride 1 and spilled 48 bytes at stride 2. With this term both are modelled at 258 and
    keep single-buffered fragments (242 registers, no spill). The chunks' precomputed row
    offsets and padding masks (:func:`polyfuse.cuda.codegen.lower_mma_gather_chunks.gather_
    setup`: two registers per chunk, in place of the row's two coordinates) took them to 225;
    double-buffered they take 254 of 255 without a spill (NVRTC 13.0, sm_80 and sm_90), too
    close to the limit to drop the term."""
    t, b = tk.tiling, tk.b
    if tk.fold is None or t is None or b is None or not b.chunked:
        return 0
    return t.block_n * t.block_k // CHUNK // (32 * t.warps)


def fragment_registers(t: MmaTiling) -> int:
    """32-bit registers one k-step's fragments take per thread: A 4 per 16x16 mma tile, B 2
    per 16x8 one."""
    return 4 * t.tiles_m + 2 * t.tiles_n


def fragment_buffers(
    tk: TensorCoreKernel, device: DeviceSpec, forced: int | None = None
) -> tuple[int, str]:
    """The fragment buffers of ``tk`` (2: double-buffered across the k-steps; 1: each
    k-step's loaded before its mma) and the reason; ``forced``: 1 or 2 asked by the user
    (``MappingConfig.mma_fragment_buffers``; 2 is still refused where it does not apply)."""
    t = tk.tiling
    assert t is not None
    if forced not in (None, 1, 2):
        raise ValueError(f"mma_fragment_buffers={forced}: 1 or 2 (None: the model decides)")
    if forced == 1:
        return 1, "single-buffered fragments (forced: mma_fragment_buffers=1)"
    how = "forced" if forced else "the register model"
    steps = t.block_k // t.mma_k
    extra = fragment_registers(t) + fold_registers(tk)
    margin = ptxas_margin(steps)
    need = t.registers + extra + margin
    if not tk.vector_fill or tk.stages < 2:
        return 1, (
            f"single-buffered fragments: double buffering refused ({how}): one shared stage "
            "(the next k-tile's fragments are only ready after the fill that overwrites it)"
        )
    if tk.stages < 3:
        return 1, (
            f"single-buffered fragments: double buffering refused ({how}): {tk.stages} shared "
            "stages (the next k-tile is waited for before the last k-step, half a k-tile early: "
            "measured on an H100, 4096^3 bf16, 0.684 ms against 0.589 single-buffered; at three "
            "stages 0.477)"
        )
    if steps % 2:
        return 1, (
            f"single-buffered fragments: double buffering refused ({how}): {steps} k-steps "
            "per k-tile (odd: the next k-tile's first k-step would not start in buffer 0)"
        )
    if need > device.max_regs_per_thread:
        return 1, (
            f"single-buffered fragments: double buffering refused ({how}): {t.registers} + "
            f"{extra} + {margin} (ptxas, {steps} k-steps) = {need} modelled registers > "
            f"{device.max_regs_per_thread} per thread"
        )
    return 2, (
        f"fragments double-buffered across the {steps} k-steps ({how}): k-step kk+1's "
        "fragment loads before k-step kk's mma, the next k-tile's first after its wait_group and "
        f"barrier; {t.registers} + {extra} + {margin} (ptxas, {steps} k-steps) = {need} "
        "modelled registers <= "
        f"{device.max_regs_per_thread} per thread"
    )


def stage_unroll(
    tk: TensorCoreKernel, device: DeviceSpec, forced: bool | None = None
) -> tuple[bool, str]:
    """Whether ``tk``'s steady k-tile loop is unrolled by its stages (see the module doc) and
    why ("" where there are no stages to unroll); ``forced``: asked by the user
    (``MappingConfig.mma_stage_unroll``)."""
    t = tk.tiling
    assert t is not None
    if not tk.vector_fill or tk.stages < 2:
        return False, ""
    if forced is False:
        return False, "steady k-tile loop rolled (forced: mma_stage_unroll=False)"
    steps = t.block_k // t.mma_k
    double = fragment_registers(t) if tk.fragment_buffers == 2 else 0
    need = t.registers + double + fold_registers(tk) + ptxas_margin(steps)
    total = need + UNROLL_MARGIN
    figures = f"{need} + {UNROLL_MARGIN} (unrolled) = {total} modelled registers"
    if forced is None and total > device.max_regs_per_thread:
        return False, (
            f"steady k-tile loop rolled, its stages counted at run time: unrolled by its "
            f"{tk.stages} stages, {figures} > {device.max_regs_per_thread} per thread"
        )
    how = "forced" if forced else "the register model"
    return True, (
        f"steady k-tile loop unrolled by its {tk.stages} stages ({how}): every stage read and "
        f"filled at a constant shared offset, no stage counters; {figures} "
        f"{'>' if total > device.max_regs_per_thread else '<='} "
        f"{device.max_regs_per_thread} per thread"
    )


def _decided(tk: TensorCoreKernel, why: str, made: bool, **fields) -> TensorCoreKernel:
    """``tk`` with ``fields`` set, on the kernel and in its tensorize record's data, and the
    note ``why`` (``made``: a decision taken, else a refusal) after its notes."""
    note = noted(KINDS, f"tensor cores: {why}", tk.scheduled.name, made=made)
    layout = tk.layout
    if layout is not None and isinstance(layout.data, TensorCoreData):
        layout = replace(layout, data=replace(layout.data, **fields))
        notes = [DecisionNote(layout), *tk.notes[1:], note]
    else:
        notes = [*tk.notes, note]
    return replace(tk, **fields, layout=layout, notes=notes)


def with_stage_unroll(
    tk: TensorCoreKernel, device: DeviceSpec, forced: bool | None = None
) -> TensorCoreKernel:
    """``tk`` with its steady loop's unroll decided (:func:`stage_unroll`): the flag, the
    note (none without stages) and the tensorize record's ``stage_unroll``."""
    unroll, why = stage_unroll(tk, device, forced)
    return _decided(tk, why, unroll, stage_unroll=unroll) if why else tk


def with_fragment_buffers(
    tk: TensorCoreKernel, device: DeviceSpec, forced: int | None = None
) -> TensorCoreKernel:
    """``tk`` with its fragment buffers decided (:func:`fragment_buffers`): the note, and the
    count in the tensorize record's data."""
    n, why = fragment_buffers(tk, device, forced)
    return _decided(tk, why, n == 2, fragment_buffers=n)


__all__ = [
    "fold_registers",
    "fragment_buffers",
    "fragment_registers",
    "stage_unroll",
    "with_fragment_buffers",
    "with_stage_unroll",
]
