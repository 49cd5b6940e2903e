"""Before/after tests of poly/gemm_codegen.py: the padding record of a tiling and the code
generation decisions a tiled kernel gets (copy loops, select-free operands, the records)."""

from __future__ import annotations

from poly_inputs import matmul, one

from polyfuse import ops, te
from polyfuse.base.decision import DecisionKind
from polyfuse.poly.device import H100
from polyfuse.poly.gemm_codegen import PADDING_LIMIT, padding_record, with_codegen
from polyfuse.poly.promote import build_gemm_kernel
from polyfuse.poly.tiling import choose_gemm_tiles, detect_gemm


def _kernel(inputs, out, tile):
    sm = one(inputs, out)
    shape = detect_gemm(sm)
    assert not isinstance(shape, str)
    gk = build_gemm_kernel(sm, shape, choose_gemm_tiles(shape, H100, forced=tile))
    assert not isinstance(gk, str)
    return with_codegen(gk, H100)


def test_padding_record_names_the_data_dims_past_their_extents():
    # 50 x 70 outputs in 32 x 32 blocks, K = 37 in k-tiles of 8: 64 x 96 x 40 run
    rec = padding_record([(0, 49), (0, 69), (0, 36)], [(0, 63), (0, 95), (0, 39)],
                         [(0, 49), (0, 69)], [32, 32])  # fmt: skip
    assert rec.kinds == (DecisionKind.GEMM_LOOP,)
    assert rec.data == {"what": "padding", "waste": 0.4731, "explained": True}
    assert rec.reason.startswith(
        "47.3% of the multiply-adds fall on padding (whole tiles past the extents): data dim 0 "
        "(extent 50) in block tiles of 32; data dim 1 (extent 70) in block tiles of 32; "
    )


def test_padding_record_below_the_limit_or_from_the_k_tiles_alone():
    small = padding_record([(0, 63), (0, 62), (0, 39)], [(0, 63), (0, 63), (0, 39)],
                           [(0, 63), (0, 62)], [32, 32])  # fmt: skip
    assert small.data["waste"] == 0.0156 < PADDING_LIMIT and small.data["explained"]
    assert (
        small.reason == "1.6% of the multiply-adds fall on padding (whole tiles past the extents)"
    )
    # K = 37 in k-tiles of 8 pads 7.5 %, which no data dim explains
    k_only = padding_record([(0, 63), (0, 63), (0, 36)], [(0, 63), (0, 63), (0, 39)],
                            [(0, 63), (0, 63)], [32, 32])  # fmt: skip
    assert k_only.data == {"what": "padding", "waste": 0.075, "explained": False}


def test_partial_matmul_tiles_get_copy_loops_records_and_no_select():
    gk = _kernel(*matmul(50, 37, 70), (32, 32, 4, 4, 8))
    # rows of 37 floats: scalar copies, 256 elements over 64 threads = 4 each
    whats = [(d.data["what"], d.data.get("tensor")) for d in gk.codegen]
    assert whats == [
        ("unroll", None),
        ("unroll copies", "a"),
        ("unroll copies", "b"),
        ("strength reduction", None),
        ("padding", None),  # no launch bound: 4 blocks give an SM one at most
    ]
    assert [d.data["copies"] for d in gk.codegen if d.data["what"] == "unroll copies"] == [4, 4]
    assert gk.select_free == {}
    assert gk.loops.unroll[0] == ("kk0", "S_c_update", 8, 0)
    assert gk.notes[-len(gk.codegen) :] == [d.reason for d in gk.codegen]


def test_conv_drops_its_padding_select_and_records_it():
    x = te.placeholder((1, 8, 56, 56), name="x")
    w = te.placeholder((16, 8, 3, 3), name="w")
    gk = _kernel([x, w], ops.conv2d(x, w, padding=1), (16, 64, 2, 4, 8))
    assert list(gk.select_free) == ["x"]
    free = [d for d in gk.codegen if d.data["what"] == "select free"]
    assert [d.data["tensor"] for d in free] == ["x"] and free[0].reason == gk.select_free["x"]
    (pad,) = [d for d in gk.codegen if d.data["what"] == "padding"]
    assert pad.data == {"what": "padding", "waste": 0.125, "explained": True}  # 56 of 64
