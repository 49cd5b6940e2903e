"""Select-free GEMM updates: ``where(c, x[..], 0) * w[..]`` read as ``x[..] * w[..]``, by isl.

A convolution's padding is a select in its reduction body: the term is ``x`` where the input
element exists and 0 where it falls on the padding. Printed as such, the compiler cannot form
a fused multiply-add (``acc + (c ? x : 0) * w`` is not ``fma(x, w, acc)`` where ``w`` is
infinite), and the hot loop becomes FMUL + FADD + FSEL per term (issue 20: 0 % FFMA).

When ``x`` is promoted to a shared tile (:mod:`polyfuse.poly.promote`), the tile holds zeros
for every footprint element outside the array. If, on the padded tiles the kernel runs,
every update instance where ``c`` fails reads an element outside the array, the tile already
holds the select's 0 there: the term is ``x_tile * w`` in both cases, bit for bit (0 * inf is
NaN either way). isl proves it: the read's access function (the one the tile's copies and
readers use) is defined on ``{ padded update instances : not c }``, and their image under it
has no element inside the array. (Where the guard pins an input dim of extent 1 — a padded
conv over one row — that function keeps the guard's equality, is undefined where the select
fails, and the select stays.) Then the select is dropped for that
operand (:attr:`polyfuse.cuda.codegen.kernel_ast.KTile.select_free`) and the update is one FFMA.
"""

from __future__ import annotations

import islpy as isl

from polyfuse.graph.access import affine_condition, axis_names, loop_names
from polyfuse.graph.expr import Binary, Read, Select, zero_padded_read
from polyfuse.poly.tiling import GemmShape


def _factors(e) -> list:
    if isinstance(e, Binary) and e.op == "mul":
        return _factors(e.a) + _factors(e.b)
    return [e]


def _zero_select(e) -> Read | None:
    """The read of a factor ``where(c, read, 0)`` (``read`` may be a widened byte read; None
    for any other factor)."""
    return zero_padded_read(e) if isinstance(e, Select) else None


def select_free_operands(
    shape: GemmShape,
    padded: list[tuple[int, int]],
    zero_filled: dict[str, tuple[int, ...]],
    access: dict[str, isl.Map],
) -> dict[str, str]:
    """Per operand of ``zero_filled`` (tensor -> array shape: shared tiles holding zeros
    outside the array) whose every select-to-zero in the update isl proves redundant on the
    ``padded`` iteration box (``[lo, hi]`` per update dim), the reason; ``access``: each
    operand's access function (the copies' footprint function)."""
    up = shape.update
    t = up.tensor
    assert t.op is not None and t.op.reduce is not None
    names = axis_names(t)
    data, red = loop_names(t)
    dims = data + red
    box = " and ".join(f"{lo} <= {d} <= {hi}" for d, (lo, hi) in zip(dims, padded, strict=True))
    ctx = up.domain.get_ctx()
    found: dict[str, list[str]] = {}
    refused: set[str] = set()
    for f in _factors(t.op.reduce.body):
        r = _zero_select(f)
        if r is None:
            continue
        tensor = next((n for n, m in shape.operands if _is_read(up, r, m)), None)
        if tensor is None or tensor not in zero_filled or tensor not in access:
            continue
        cond = affine_condition(f.cond, names)
        if cond is None:
            refused.add(tensor)
            continue
        failing = isl.Set(
            f"{{ {up.name}[{', '.join(dims)}] : {box} and not ({cond}) }}", context=ctx
        )
        arr = zero_filled[tensor]
        es = [f"e{i}" for i in range(len(arr))]
        inside = isl.Set(
            f"{{ {tensor}[{', '.join(es)}] : "
            + " and ".join(f"0 <= {e} < {n}" for e, n in zip(es, arr, strict=True))
            + " }",
            context=ctx,
        )
        if not failing.is_subset(access[tensor].domain()):
            # the footprint function is not defined where the select fails: the guard made
            # it an equality (an input dim of extent 1 padded: `h + r - 1 = 0`), so the tile
            # holds no zeros for those reads, which alias the rows it does hold
            refused.add(tensor)
            continue
        hit = failing.apply(access[tensor]).intersect(inside)
        if hit.is_empty():
            found.setdefault(tensor, []).append(cond)
        else:
            refused.add(tensor)
    return {
        t: (
            f"{t}: the update's select where({' and '.join(conds)}, {t}[..], 0) dropped: isl "
            f"proves every padded update instance where it fails reads outside {t}, which the "
            "shared tile holds as zeros; the term is one fused multiply-add"
        )
        for t, conds in found.items()
        if t not in refused
    }


def _is_read(up, r: Read, m: isl.Map) -> bool:
    """Whether ``m`` is the update's access map of read ``r``."""
    return any(rr is r and mm is m for rr, mm in up.reads)
