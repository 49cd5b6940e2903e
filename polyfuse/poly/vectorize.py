"""128-bit vector access, allowed only where isl proves it: contiguity, alignment, no straddle.

A copy of a box of a row-major global array reads whole rows of the box, so its innermost
dimension is contiguous (stride 1) in the array. It may read ``width`` consecutive elements at
once (a ``float4``: one 128-bit load) when, for every block and k-tile (the parameters of the
footprint, within their ranges):

1. the box's innermost extent is a multiple of ``width`` (the vectors tile each row);
2. every vector's first element has a linear index that is a multiple of ``width`` — isl
   computes ``{ linear(e) mod width : e a vector start }`` over all parameter values and it
   must be ``{0}`` (with a 16-byte aligned base pointer, every vector is 16-byte aligned; the
   array's row length enters through the linear index);
3. no vector straddles the array's edge (a vector is wholly inside or wholly outside, so a
   guard on its first element decides it: outside elements are filled with zeros);
4. the footprint is the whole box (a copy of a holey footprint, e.g. a strided conv's input,
   copies single elements).

Otherwise the copy stays scalar; the reason says which condition failed. The proof is a
function of an isl set and an array shape only, so memory-bound kernels can use it too.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

VECTOR_WIDTH = 4  # float32 elements in 128 bits


@dataclass(frozen=True)
class VectorProof:
    """The vector width a copy may use (1: scalar) and why.

    ``why`` is the cause alone (for callers that state it in their own words, e.g. an epilogue
    that stores scalars); :attr:`reason` is the copy's full reason as the plan prints it.
    """

    width: int
    why: str

    @property
    def reason(self) -> str:
        if self.width == 1:
            return f"scalar copy: {self.why}"
        return f"{self.width * 32}-bit vector copy: {self.why}"


def _set(fp: isl.Set, es: list[str], cons: str) -> isl.Set:
    """``{ name[es] : cons }`` in the space of ``fp`` (same parameters and tuple name)."""
    params = [fp.get_dim_name(isl.dim_type.param, i) for i in range(fp.dim(isl.dim_type.param))]
    name = fp.get_tuple_name() if fp.has_tuple_id() else ""
    text = f"[{', '.join(params)}] -> {{ {name}[{', '.join(es)}] : {cons} }}"
    return isl.Set(text, context=fp.get_ctx())


def prove_vector_copy(
    fp: isl.Set,
    lo: list[str],
    size: list[int],
    shape: tuple[int, ...],
    width: int = VECTOR_WIDTH,
) -> VectorProof:
    """Whether the copy of footprint ``fp`` (params: block and k-tile coordinates, restricted to
    their ranges) as its box ``lo``/``size`` may move ``width`` elements at once."""
    if not size or len(size) != len(shape):
        return VectorProof(1, "the footprint is not a box of the array")
    if size[-1] % width:
        return VectorProof(1, f"row extent {size[-1]} is not a multiple of {width}")
    ctx = fp.get_ctx()
    es = [f"e{i}" for i in range(len(size))]
    box = _set(
        fp,
        es,
        " and ".join(f"{b} <= {e} < {b} + {s}" for e, b, s in zip(es, lo, size, strict=True)),
    ).intersect_params(fp.params())
    if not fp.is_equal(box):
        return VectorProof(1, "the footprint has holes inside its box")
    starts = box.intersect(_set(fp, es, f"({es[-1]} - ({lo[-1]})) mod {width} = 0"))
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    strides.reverse()
    lin = " + ".join(f"{s} * {e}" for s, e in zip(strides, es, strict=True))
    name = fp.get_tuple_name() if fp.has_tuple_id() else ""
    to_mod = isl.Map(f"{{ {name}[{', '.join(es)}] -> [v] : v = ({lin}) mod {width} }}", context=ctx)
    residues = starts.apply(to_mod)
    residues = residues.project_out(isl.dim_type.param, 0, residues.dim(isl.dim_type.param))
    if not residues.is_equal(isl.Set("{ [0] }", context=ctx)):
        return VectorProof(
            1,
            f"vector starts are not {4 * width}-byte aligned "
            f"(row length {shape[-1]}; start offsets mod {width} take more than 0)",
        )
    last = es[-1]
    edge = shape[-1]
    straddle = starts.intersect(
        _set(
            fp,
            es,
            f"({last} < {edge} and {last} + {width - 1} >= {edge}) "
            f"or ({last} < 0 and {last} + {width - 1} >= 0)",
        )
    )
    if not straddle.is_empty():
        return VectorProof(1, "a vector would straddle the array's edge")
    return VectorProof(
        width,
        f"rows contiguous, extent {size[-1]} a multiple of "
        f"{width}, isl proves every start {4 * width}-byte aligned",
    )
