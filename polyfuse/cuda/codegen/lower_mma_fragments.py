"""The fragment loop of a tensorized GEMM kernel: one k-tile's k-steps, single- or
double-buffered in registers (ALCOP's shared -> register level; the decision:
:mod:`polyfuse.poly.tensorize_fragments`).

A k-step (:class:`KStep`) is the text :mod:`polyfuse.cuda.codegen.lower_mma` writes for one
``pf_ks``: ``ldmatrix`` (or tf32 32-bit) loads of the A and B fragments (``pf_fa``,
``pf_fb``) from the k-tile's stage (pointers ``pf_sa``, ``pf_sb``), then the ``mma.sync`` of
every fragment pair. Single-buffered (:func:`single_buffered`), each k-step declares its
fragments, loads them and multiplies them, inside the k-tile loop of
:func:`polyfuse.cuda.codegen.lower_mma_pipeline.k_tile_loop`, whose barrier at the top of each
k-tile keeps every load of k-tile ``kt`` behind it.

Double-buffered (:func:`double_buffered_loop`, S >= 2 cp.async stages), the fragments get a
leading buffer dimension of 2, k-step ``kk`` multiplies buffer ``kk % 2`` after issuing the
loads of ``kk + 1`` into the other, and the k-tile loop is rotated so the wait and barrier sit
at the end of each k-tile::

    fill k-tiles 0..S-2 (one commit group each); wait_group(S-2); barrier
    load k-step 0 of k-tile 0 into buffer 0                         // prologue
    for each k-tile kt:
        fill k-tile kt+S-1 into the stage k-tile kt-1 used; commit
        for each k-step kk but the last:
            load k-step kk+1 into buffer (kk+1) % 2; mma on buffer kk % 2
        wait_group(S-2); barrier         // k-tile kt+1 has landed; k-tile kt is read
        load k-step 0 of k-tile kt+1 into buffer 0                  // across the boundary
        mma on the last k-step's buffer

Every read of k-tile ``kt`` (its last k-step's loads included) comes before the barrier that
ends iteration ``kt``, and the fill that overwrites its stage (iteration ``kt + 1``) after it;
k-tile ``kt + 1``'s group is group ``kt + 1`` of ``kt + S`` committed, so the wait count is
S-2 as in the rotated-out form. The loads of the next k-tile's first k-step run under the
last k-step's mma. The k-steps per k-tile are even, so k-step 0 is always buffer 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from polyfuse.cuda.codegen import lower_mma_pipeline
from polyfuse.cuda.codegen.lower_dtypes import C_TYPES
from polyfuse.cuda.codegen.lower_mma_pipeline import TileFill, fill, prologue


@dataclass(frozen=True)
class KStep:
    """One k-step of a k-tile as C text at the k-step loop's body depth (6 spaces), the
    k-step's first k ``pf_ks``: the fragment arrays (name, C extents), their loads from the
    stage pointers ``pf_sa`` / ``pf_sb`` (from an unroll pragma), the mma on them; the
    k-tile's depth and the intrinsic's k."""

    fragments: tuple[tuple[str, str], ...]
    loads: tuple[str, ...]
    mma: tuple[str, ...]
    block_k: int
    mma_k: int

    @property
    def steps(self) -> int:
        return self.block_k // self.mma_k


def buffered(step: KStep, lines: tuple[str, ...], buf: str, ks: str, shift: int = 0) -> list[str]:
    """``lines`` of ``step`` on fragment buffer ``buf`` (C text) at k-step ``ks`` (C text for
    ``pf_ks``), indented by ``shift`` spaces (negative: fewer)."""
    names = "|".join(re.escape(n) for n, _ in step.fragments)
    out = []
    for line in lines:
        line = re.sub(r"\bpf_ks\b", ks, line)  # first: ``buf`` may name the loop's pf_ks
        line = re.sub(rf"\b({names})\[", rf"\1[{buf}][", line)
        if not line.startswith("#"):
            line = " " * shift + line if shift >= 0 else line[-shift:]
        out.append(line)
    return out


def single_buffered(step: KStep) -> list[str]:
    """The k-steps of one k-tile, each declaring, loading and multiplying its fragments (the
    compute of :func:`polyfuse.cuda.codegen.lower_mma_pipeline.k_tile_loop`)."""
    decl = ", ".join(f"{n}{ext}" for n, ext in step.fragments)
    return [
        "#pragma unroll",
        f"    for (int pf_ks = 0; pf_ks < {step.block_k}; pf_ks += {step.mma_k}) {{",
        f"      unsigned {decl};",
        *step.loads,
        *step.mma,
        "    }",
    ]


def mma_buffers(step: KStep) -> tuple[str, str]:
    """The buffer k-step ``pf_ks`` of the k-step loop multiplies (C text), and the last
    k-step's (its loads went in before the boundary)."""
    return f"(pf_ks / {step.mma_k}) & 1", str((step.steps - 1) % 2)


def double_buffered_loop(
    fills: tuple[TileFill, TileFill],
    bases: tuple[tuple[str, str], tuple[str, str]],
    step: KStep,
    stages: int,
    k_lo: int,
    k_tiles: int,
) -> list[str]:
    """The k-tile loop of an S-stage (S >= 2) cp.async pipeline with double-buffered
    fragments (the module doc); ``fills``, ``bases``, ``k_lo`` and ``k_tiles`` as for
    :func:`polyfuse.cuda.codegen.lower_mma_pipeline.k_tile_loop` (its steady state fills
    without a k guard, its rolled tail with one)."""
    assert stages >= 2 and step.steps % 2 == 0, (stages, step.steps)
    bk, mk = step.block_k, step.mma_k
    ahead = stages - 1
    wait = lower_mma_pipeline.wait_pending(stages)
    now, last = mma_buffers(step)
    decl = ", ".join(f"{n}[2]{ext}" for n, ext in step.fragments)
    point = [
        f"{b} = {f.buf} + pf_rs * {f.elements} + {off};"
        for f, (b, off) in zip(fills, bases, strict=True)
    ]
    full = min(k_tiles, (fills[0].k_hi - k_lo + 1) // bk)  # k-tiles wholly inside

    def body(inside: bool) -> list[str]:
        """One k-tile; ``inside``: its fill lies inside the reduction, and a next k-tile
        exists (the steady state)."""
        fill_ = [ln for f in fills for ln in fill(f, "pf_kf", "pf_ws", "      ", inside)]
        first = buffered(step, step.loads, "0", "0", -2 if inside else 0)
        return [
            f"    const int pf_k0 = {k_lo} + pf_kt * {bk};",
            "    {" if inside else f"    if (pf_kt + {ahead} < {k_tiles}) {{",
            f"      const int pf_kf = pf_k0 + {ahead * bk};",
            *fill_,
            "    }",
            "    __pipeline_commit();  // one group per k-tile (empty past the last)",
            "#pragma unroll",
            f"    for (int pf_ks = 0; pf_ks < {bk - mk}; pf_ks += {mk}) {{  // all but the last",
            *buffered(step, step.loads, f"(pf_ks / {mk} + 1) & 1", f"(pf_ks + {mk})"),
            *buffered(step, step.mma, now, "pf_ks"),
            "    }",
            f"    __pipeline_wait_prior({wait});  // k-tile pf_kt + 1 has landed",
            "    __syncthreads();  // ... for every thread; k-tile pf_kt is read",
            f"    pf_rs = pf_rs == {stages - 1} ? 0 : pf_rs + 1;",
            f"    pf_ws = pf_ws == {stages - 1} ? 0 : pf_ws + 1;",
            *[f"    {p}" for p in point],
            *(first if inside else [f"    if (pf_kt + 1 < {k_tiles}) {{", *first, "    }"]),
            *buffered(step, step.mma, last, str(bk - mk), -2),
        ]

    def loop(lo: int, hi: int, inside: bool) -> list[str]:
        if lo >= hi:
            return []
        head = [] if inside else ["#pragma unroll 1"]
        return [*head, f"  for (int pf_kt = {lo}; pf_kt < {hi}; ++pf_kt) {{", *body(inside), "  }"]

    ctype = C_TYPES[fills[0].dtype]
    main = max(0, full - ahead)  # iterations whose fill lies wholly inside
    return [
        *prologue(fills, ahead, k_tiles, k_lo, bk),
        f"  __pipeline_wait_prior({wait});  // k-tile 0 has landed",
        "  __syncthreads();  // ... for every thread",
        f"  unsigned {decl};  // two fragment buffers",
        f"  const {ctype} " + ", ".join(f"*{p[:-1]}" for p in point) + ";",
        *buffered(step, step.loads, "0", "0", -4),  # k-step 0 of k-tile 0
        *loop(0, main, True),
        *loop(main, k_tiles, False),
    ]


__all__ = ["KStep", "buffered", "double_buffered_loop", "mma_buffers", "single_buffered"]
