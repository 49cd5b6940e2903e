"""The run fill of an implicit GEMM's gathered input (issue 21 item 1:
:func:`polyfuse.cuda.codegen.lower_mma_fills.digit_fill`): which guard terms a run of k
moves is read from the subscripts' coefficients (:meth:`TileFill.inside_terms`), not by
matching the generated condition text. A hand-built 3x3 pad-1 conv input tile, NCHW
``(1, 32, 11, 9)``, its reduction flattened in two orders."""

from __future__ import annotations

from polyfuse.cuda.codegen.c_text import c_index
from polyfuse.cuda.codegen.lower_mma_fills import TileFill, digit_fill
from polyfuse.cuda.codegen.printer import _Emitter
from polyfuse.poly.swizzle import SharedLayout
from polyfuse.poly.tensorize import MmaOperand

EXTENT = {"kh": 3, "kw": 3, "c": 32}


def _x_fill(order: tuple[str, ...], block_k: int) -> TileFill:
    """The input's tile (stored in k rows, 16 output columns, 128 threads) of the update over
    data dims ``(n, o, oh, ow)`` and the reduction dims in ``order``: subscripts
    ``x[n, c, oh + kh - 1, ow + kw - 1]``, zero outside the array."""

    def coeffs(data: tuple[int, ...], red: dict[str, int]) -> tuple[int, ...]:
        return data + tuple(red.get(r, 0) for r in order)

    index = (
        (coeffs((1, 0, 0, 0), {}), 0),
        (coeffs((0, 0, 0, 0), {"c": 1}), 0),
        (coeffs((0, 0, 1, 0), {"kh": 1}), -1),
        (coeffs((0, 0, 0, 1), {"kw": 1}), -1),
    )
    op = MmaOperand("x", (1, 32, 11, 9), index, 3, False, gather=True, guarded=True)
    red = tuple((0, EXTENT[r] - 1) for r in order)
    k_vals = tuple(f"pf_v{j}" for j in range(len(order)))
    batch = ("pf_g0", "0", "pf_g1", "0")
    layout = SharedLayout(block_k, 16, 16)
    return TileFill(
        op, layout, "s_x", "x", 16, block_k, "pf_n0", 8, 287, batch, 128, "float16", k_vals, red
    )


def _lines(order: tuple[str, ...], block_k: int) -> list[str]:
    """The fill's nodes printed by the kernel printer."""
    return _Emitter({})(digit_fill(_x_fill(order, block_k), "pf_k0"), 0)


def _line(lines: list[str], start: str) -> str:
    (line,) = [x.strip() for x in lines if x.strip().startswith(start)]
    return line


def test_inside_terms_name_the_values_they_read():
    """The height and width guards read (oh, kh) and (ow, kw); the channel's box lies inside
    the array (no term), the batch dim is never guarded."""
    f = _x_fill(("kh", "kw", "c"), 32)
    assert [(c_index(c), reads) for c, reads in f.inside_terms()] == [
        ("((unsigned)((pf_g1 + pf_v0 + (-1))) < 11u)", frozenset({2, 4})),
        ("((unsigned)((pf_r + pf_v1 + (-1))) < 9u)", frozenset({3, 5})),
    ]
    assert f.inside_conds() == [c for c, _ in f.inside_terms()]


def test_channel_innermost_runs_test_the_padding_once_per_run():
    """(kh, kw, c) with runs of 4 channels: neither padding guard moves along a run, so both
    go into one predicate before it with the row guard; only k is tested per element."""
    lines = _lines(("kh", "kw", "c"), 32)
    assert _line(lines, "const bool pf_run") == (
        "const bool pf_run = ((pf_r <= 8) & ((unsigned)((pf_g1 + pf_d0 + (-1))) < 11u)"
        " & ((unsigned)((pf_r + pf_d1 + (-1))) < 9u));"
    )
    assert _line(lines, "if (") == "if (((pf_k <= 287) & pf_run)) pf_v = x[pf_off];"
    assert _line(lines, "pf_d2 +=") == "pf_d2 += 1;"


def test_width_innermost_run_keeps_its_moving_guard_per_element():
    """(c, kh, kw) with runs of one k: the width guard reads kw, the dim a run steps, so it
    stays in the per-element test; the height guard is hoisted."""
    lines = _lines(("c", "kh", "kw"), 8)
    assert _line(lines, "const bool pf_run") == (
        "const bool pf_run = ((pf_r <= 8) & ((unsigned)((pf_g1 + pf_d1 + (-1))) < 11u));"
    )
    assert _line(lines, "if (") == (
        "if (((pf_k <= 287) & ((unsigned)((pf_r + pf_d2 + (-1))) < 9u) & pf_run))"
        " pf_v = x[pf_off];"
    )


def test_runs_that_wrap_carry_and_test_every_term():
    """(c, kh, kw) with runs of 4 across kw's extent of 3: the digits carry by selects and
    every guard is tested per element (no hoisted predicate)."""
    lines = _lines(("c", "kh", "kw"), 32)
    assert not any("pf_run" in x for x in lines)
    assert _line(lines, "if (") == (
        "if (((pf_r <= 8) & (pf_k <= 287) & ((unsigned)((pf_g1 + pf_d1 + (-1))) < 11u)"
        " & ((unsigned)((pf_r + pf_d2 + (-1))) < 9u))) pf_v = x[pf_off];"
    )
    assert _line(lines, "pf_d0 +=") == "pf_d0 += pf_c1;"
