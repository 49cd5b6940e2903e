"""The tensor-core vocabulary's expressions and statements: constructors fold constants, a
layout offset built as an expression evaluates like :meth:`SharedLayout.offset`, and the one
printer writes each tensor-core node."""

from __future__ import annotations

import itertools

import pytest

from polyfuse.cuda.codegen.c_text import c_index
from polyfuse.cuda.codegen.kernel_arith import add, bor, layout_offset, mul, select, shl, shr
from polyfuse.cuda.codegen.kernel_ast import (
    KAssign,
    KChunkCopy,
    KFragmentLoad,
    KGuardedCopy,
    KInt,
    KLdmatrix,
    KLet,
    KMma,
    KRef,
    KRegisters,
    KVar,
)
from polyfuse.cuda.codegen.printer import _Emitter
from polyfuse.poly.swizzle import operand_layout


def test_constructors_fold_constants_and_identities():
    assert add(3, 4) == KInt(7)
    assert add("x", 0) == KVar("x")
    assert c_index(add("x", 2, "y", 3)) == "(x + y + 5)"
    assert mul("x", 1) == KVar("x") and mul(0, "x") == KInt(0)
    assert shr("x", 0) == KVar("x")
    assert c_index(select(KVar("p"), 1, 0)) == "(p ? 1 : 0)"
    assert shl("x", 0) == KVar("x")
    assert c_index(bor("m", shl(1, "b"))) == "(m | (1 << b))"


@pytest.mark.parametrize(
    "outer,inner,col_step", [(32, 64, 0), (64, 32, 16), (32, 24, 0), (32, 128, 8)]
)
def test_layout_offset_expression_evaluates_like_the_layout(outer, inner, col_step):
    """C's integer semantics on non-negative values are Python's: evaluate the printed text."""
    lay = operand_layout(outer, inner, 2, col_step)
    text = c_index(layout_offset(lay, "r", "c", aligned=False))
    for r, c in itertools.product(range(outer), range(inner)):
        got = eval(text.replace("/", "//"), {"r": r, "c": c})  # noqa: S307
        assert got == lay.offset(r, c), (r, c, text)


def test_the_printer_writes_each_tensor_core_node():
    frag = KRef("pf_fa", (KVar("pf_i"),))
    nodes = [
        KLet("pf_la", add("pf_lane", 8)),
        KLet("pf_p", None, "const __nv_bfloat16*", const=False),
        KAssign(KRef("pf_rs"), KInt(0)),
        KRegisters("pf_fa", "unsigned", (2, 4), "fragment"),
        KLdmatrix(frag, KRef("pf_sa", (KVar("pf_la"),)), 4, trans=True),
        KFragmentLoad(KRef("pf_fb", (KInt(0), KInt(1))), KRef("pf_sb", (KInt(3),))),
        KMma("pf_mma_bf16", (16, 8, 16), KRef("pf_acc", (KInt(0), KInt(1))), frag,
             KRef("pf_fb", (KInt(0), KInt(0)))),
        KChunkCopy(KRef("s", (KInt(8),)), KRef("g", (KVar("o"),)), mul(2, "pf_n")),
        KGuardedCopy(KRef("s", (KInt(0),)), KRef("g", (KVar("o"),)), KVar("ok"), "bfloat16",
                     "pf_v"),
    ]  # fmt: skip
    text = "\n".join(_Emitter({})(nodes, 1))
    assert text == "\n".join(
        [
            "  const int pf_la = (pf_lane + 8);",
            "  const __nv_bfloat16* pf_p;",
            "  pf_rs = 0;",
            "  unsigned pf_fa[2][4];",
            "  pf_ldmatrix_x4_trans(pf_fa[pf_i], &pf_sa[pf_la]);",
            "  pf_fb[0][1] = __float_as_uint(pf_sb[3]);",
            "  pf_mma_bf16(pf_acc[0][1], pf_fa[pf_i], &pf_fb[0][0], pf_acc[0][1]);",
            "  pf_cp_async16(&s[8], &g[o], (2 * pf_n));",
            "  __nv_bfloat16 pf_v = __float2bfloat16_rn(0.0f);",
            "  if (ok) pf_v = g[o];",
            "  s[0] = pf_v;",
        ]
    )
