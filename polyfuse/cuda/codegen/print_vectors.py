"""CUDA C of a vector group (:class:`polyfuse.cuda.codegen.kernel_ast.KVector`): whole-word
loads and stores of its lanes, and native 16-bit pair arithmetic
(:mod:`polyfuse.cuda.codegen.lower_half2`). Part of the one printer
(:mod:`polyfuse.cuda.codegen.printer`), which calls :func:`vector_lines` per group."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from polyfuse.cuda.codegen.body_printer import c_type, c_value
from polyfuse.cuda.codegen.c_wide import WORDS, narrow_load, narrow_store, word_load, word_store
from polyfuse.cuda.codegen.kernel_access import KPairConst, KPairLane, KPairOp, KPairSplat, KVal
from polyfuse.cuda.codegen.kernel_ast import KNode, KStmt, KVector
from polyfuse.cuda.codegen.literals import c_float
from polyfuse.cuda.codegen.lower_dtypes import FLOAT_TO_HALF, HALF_TO_FLOAT
from polyfuse.graph.dtypes import NARROW_INTS

#: prints a body at a depth (the printer's emitter)
Emit = Callable[[Sequence[KNode], int], list[str]]


def _half2(dtype: str) -> tuple[str, str]:
    """The pair type of a 16-bit float dtype and its rounding constructor from two floats."""
    if dtype == "float16":
        return "__half2", "__floats2half2_rn"
    return "__nv_bfloat162", "__floats2bfloat162_rn"


def _vector_load(pad: str, ref: str, dtype: str, width: int, qs: list[str]) -> tuple[list, str]:
    """Lines loading ``width`` lanes at ``ref`` as 128-bit (or, for four 16-bit lanes,
    64-bit) words, and the initializer of the lane array (of the dtype's register type)."""
    if dtype in WORDS:  # int4, double2, longlong2
        return word_load(pad, ref, dtype, qs)
    if dtype in NARROW_INTS:  # one word of 4, 8 or 16 bytes
        return narrow_load(pad, ref, dtype, width, qs[0])
    if dtype not in HALF_TO_FLOAT and width == 2:  # a tensor-core epilogue's pair: float2
        return [f"{pad}  const float2 {qs[0]} = *reinterpret_cast<const float2*>(&{ref});"], (
            f"{qs[0]}.x, {qs[0]}.y"
        )
    if dtype not in HALF_TO_FLOAT:  # float32: one float4 per four lanes
        lines = [
            f"{pad}  const float4 {q} = *reinterpret_cast<const float4*>(&{ref}"
            + (f" + {4 * j}" if j else "")
            + ");"
            for j, q in enumerate(qs)
        ]
        return lines, ", ".join(f"{q}.{c}" for q in qs for c in "xyzw")
    (q,) = qs[:1]
    pair = _half2(dtype)[0]
    if width == 2:  # one pair: a 32-bit word
        line = f"{pad}  const unsigned {q} = *reinterpret_cast<const unsigned*>(&{ref});"
        words = [f"&{q}"]
    else:
        word, comps = ("uint4", "xyzw") if width == 8 else ("uint2", "xy")
        line = f"{pad}  const {word} {q} = *reinterpret_cast<const {word}*>(&{ref});"
        words = [f"&{q}.{c}" for c in comps[: width // 2]]
    vals = ", ".join(
        f"__{half}2float(*reinterpret_cast<const {pair}*>({w}))"
        for w in words
        for half in ("low", "high")
    )
    return [line], vals


def _vector_store(pad: str, ref: str, dtype: str, width: int, src: str) -> list[str]:
    """Lines storing lane array ``src`` (``width`` lanes) at ``ref`` as whole words."""
    if dtype in WORDS:
        return word_store(pad, ref, dtype, width, src)
    if dtype in NARROW_INTS:
        return narrow_store(pad, ref, dtype, width, src)
    if dtype not in FLOAT_TO_HALF:
        if width == 2:  # a tensor-core epilogue's pair of columns
            return [f"{pad}  *reinterpret_cast<float2*>(&{ref}) = make_float2({src}[0], {src}[1]);"]
        return [
            f"{pad}  *reinterpret_cast<float4*>(&{ref}"
            + (f" + {4 * j}" if j else "")
            + ") = make_float4("
            + ", ".join(f"{src}[{4 * j + k}]" for k in range(4))
            + ");"
            for j in range(width // 4)
        ]
    make = _half2(dtype)[1]
    values = [f"{make}({src}[{2 * i}], {src}[{2 * i + 1}])" for i in range(width // 2)]
    return _pair_store(pad, ref, dtype, src, values)


def _pair_store(pad: str, ref: str, dtype: str, src: str, values: list[str]) -> list[str]:
    """Lines storing pairs ``values`` (C expressions of the dtype's pair type) at ``ref`` as
    one 32-, 64- or 128-bit word."""
    pair = _half2(dtype)[0]
    if len(values) == 1:
        return [f"{pad}  *reinterpret_cast<{pair}*>(&{ref}) = {values[0]};"]
    word = "uint4" if len(values) == 4 else "uint2"
    pairs = [f"{src}_h{i}" for i in range(len(values))]
    lines = [f"{pad}  {{"]
    lines += [f"{pad}    const {pair} {h} = {v};" for h, v in zip(pairs, values, strict=True)]
    words = ", ".join(f"*reinterpret_cast<const unsigned*>(&{h})" for h in pairs)
    lines.append(f"{pad}    *reinterpret_cast<{word}*>(&{ref}) = make_{word}({words});")
    return lines + [f"{pad}  }}"]


def vector_lines(n: KVector, depth: int, emit: Emit) -> list[str]:
    """A group of ``n.width`` lanes (its loads and stores lowered by
    :mod:`polyfuse.cuda.codegen.lower_accesses`): whole-word loads (float4; 16-bit lanes eight or
    four
    per word), the lanes on float registers, whole-word stores."""
    pad = "  " * depth
    if n.native:
        return _native_lines(n, depth, emit)
    out = [f"{pad}{{"]
    for lane in n.lane_loads:
        ref, dtype = c_value(lane.target), lane.target.buffer.dtype
        lines, vals = _vector_load(pad, ref, dtype, n.width, list(lane.words))
        out += lines
        out.append(f"{pad}  {c_type(lane.lanes.dtype)} {lane.lanes.name}[{n.width}] = {{{vals}}};")
    loaded = {x.lanes.name for x in n.lane_loads}  # a staged input's lanes: stored as loaded
    out += [
        f"{pad}  {c_type(x.lanes.dtype)} {x.lanes.name}[{n.width}];"
        for x in n.lane_stores
        if x.lanes.name not in loaded
    ]
    out.append(f"{pad}  for (int {n.var} = 0; {n.var} < {n.width}; {n.var} += 1) {{")
    out += emit(n.body, depth + 2)
    out.append(f"{pad}  }}")
    for x in n.lane_stores:
        out += _vector_store(pad, c_value(x.target), x.target.buffer.dtype, n.width, x.lanes.name)
    out.append(f"{pad}}}")
    return out


#: the pair intrinsics of the native operations; the ``_rn`` forms are never contracted into
#: an fma by ptxas (the float32 path rounds a product before the sum that uses it)
PAIR_INTRINSICS = {"add": "__hadd2_rn", "sub": "__hsub2_rn", "mul": "__hmul2_rn", "neg": "__hneg2"}


def c_pair(v: KVal, words: dict[str, str], comp: str) -> str:
    """C text of pair tree ``v`` at word component ``comp`` (``words``: lane array name →
    its loaded word)."""
    if isinstance(v, KPairLane):
        return f"*reinterpret_cast<const {_half2(v.dtype)[0]}*>(&{words[v.lanes]}.{comp})"
    if isinstance(v, KPairConst):
        fn = "__float2half2_rn" if v.dtype == "float16" else "__float2bfloat162_rn"
        return f"{fn}({c_float(v.value)})"
    if isinstance(v, KPairSplat):
        fn = "__half2half2" if v.dtype == "float16" else "__bfloat162bfloat162"
        return f"{fn}({c_value(v.load)})"
    assert isinstance(v, KPairOp), v
    return f"{PAIR_INTRINSICS[v.op]}({', '.join(c_pair(a, words, comp) for a in v.args)})"


def _native_lines(n: KVector, depth: int, emit: Emit) -> list[str]:
    """A group whose stored lane arrays ``n.native`` are computed in native 16-bit pairs
    (:mod:`polyfuse.cuda.codegen.lower_half2`): its words loaded and kept as pairs, each such
    word computed pair by pair; statements left in float32 (if any) run on widened lanes in
    the loop as usual."""
    pad = "  " * depth
    values = {p.lanes: p.value for p in n.native}
    rest = [
        s
        for s in n.body
        if not (
            isinstance(s, KStmt) and s.stores and {t.buffer.name for t in s.stores} <= set(values)
        )
    ]
    out = [f"{pad}{{"]
    words: dict[str, str] = {}
    for lane in n.lane_loads:
        ref, dtype = c_value(lane.target), lane.target.buffer.dtype
        lines, vals = _vector_load(pad, ref, dtype, n.width, list(lane.words))
        out += lines
        words[lane.lanes.name] = lane.words[0]
        if rest:
            arr = f"{c_type(lane.lanes.dtype)} {lane.lanes.name}[{n.width}]"
            out.append(f"{pad}  {arr} = {{{vals}}};")
    if rest:
        out += [
            f"{pad}  {c_type(x.lanes.dtype)} {x.lanes.name}[{n.width}];"
            for x in n.lane_stores
            if x.lanes.name not in values
        ]
        out.append(f"{pad}  for (int {n.var} = 0; {n.var} < {n.width}; {n.var} += 1) {{")
        out += emit(rest, depth + 2)
        out.append(f"{pad}  }}")
    for x in n.lane_stores:
        ref, dtype = c_value(x.target), x.target.buffer.dtype
        if x.lanes.name not in values:
            out += _vector_store(pad, ref, dtype, n.width, x.lanes.name)
            continue
        tree = values[x.lanes.name]
        pairs = [c_pair(tree, words, "xyzw"[i]) for i in range(n.width // 2)]
        out += _pair_store(pad, ref, dtype, x.lanes.name, pairs)
    out.append(f"{pad}}}")
    return out
