"""One operand of a tensorized GEMM as the update reads it (:class:`MmaOperand`: its affine
subscripts, storage order and how its shared tile is filled), and whether a cp.async fill of
it is 16-byte aligned (:func:`fill_alignment`). :mod:`polyfuse.poly.tensorize` matches the
operands; the fills are lowered by :mod:`polyfuse.cuda.codegen.lower_mma_pipeline`."""

from __future__ import annotations

from dataclasses import dataclass

from polyfuse.graph import expr
from polyfuse.poly.tensorize_gather import linear_alignment

HALF_DTYPES = ("float16", "bfloat16")
#: byte operands (``m16n8k32``, int32 accumulators), each factor ``int32(x)`` of a byte read
BYTE_DTYPES = expr.BYTE_DTYPES
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "int8": 1, "uint8": 1}


@dataclass(frozen=True)
class MmaOperand:
    """One mma operand as the update reads it: per array dimension its affine subscript
    (coefficients over the update's dims ``[d0 .. d_{nd-1}, k]`` and a constant)."""

    tensor: str
    shape: tuple[int, ...]
    index: tuple[tuple[tuple[int, ...], int], ...]
    outer_dim: int  # the data dim it shares with the result: m (A) or n (B)
    k_inner: bool  # k is the array's innermost dim (else the m / n dim is)
    #: the array's innermost dim, trailing dims of extent 1 skipped (a 1x1 conv's weight)
    inner_dim: int = -1
    #: filled element by element through the full subscript (an implicit GEMM's im2col:
    #: :mod:`polyfuse.poly.tensorize_gather`), scalar, single-stage
    gather: bool = False
    #: the fill zero-fills elements outside the array (a padding select proven redundant)
    guarded: bool = False
    #: a gathered operand whose array offset is ``data part + s * k + constant``, contiguous
    #: along its tile's innermost dim (:func:`polyfuse.poly.tensorize_gather.linear_k`):
    #: filled by 16-byte chunks
    linear: tuple[tuple[int, ...], int, int] | None = None
    #: a gathered operand stored k-innermost whose runs of :attr:`chunk` consecutive k are
    #: 16-byte aligned runs of its innermost dim
    #: (:func:`polyfuse.poly.tensorize_gather.chunked_k`: a channels-last conv input): filled
    #: by 16-byte chunks, each one gather
    chunked: bool = False
    #: a byte operand stored m- or n-innermost whose tile is filled k-innermost element by
    #: element (``ldmatrix`` has no ``.trans`` of 8-bit elements)
    transposed_fill: bool = False
    #: elements per 16-byte chunk: 8 of 16 bits, 16 bytes
    chunk: int = 8

    @property
    def scalar(self) -> bool:
        """Filled element by element (a gather with no contiguous run along k)."""
        return self.gather and self.linear is None and not self.chunked

    @property
    def trans(self) -> bool:
        """Loaded with ``ldmatrix.trans``: stored m- or n-innermost (both fragments hold
        pairs of consecutive k in a register)."""
        return not self.k_inner


#: elements of a 16-byte chunk of a 16-bit operand
CHUNK = 8


def fill_alignment(op: MmaOperand, lo: int, chunk: int = CHUNK) -> str:
    """Why ``op``'s shared tile cannot be filled by 16-byte chunks, or "" when every chunk's
    first element is 16-byte aligned: the array's innermost extent is a multiple of
    :data:`CHUNK` (every row starts aligned, the base being aligned like every allocation),
    and the innermost subscript (trailing dims of extent 1 skipped) at a chunk's start
    (``lo``, the lower bound of the dim it runs along, plus its constant, then steps of
    ``CHUNK``) is a multiple of ``CHUNK``
    (``chunk``: the elements of 16 bytes, 4 for float32)."""
    if op.linear is not None:
        return linear_alignment(
            op.tensor, op.linear, chunk, None if op.k_inner else op.outer_dim, lo
        )
    inner = op.shape[op.inner_dim]
    if inner % chunk:
        return f"{op.tensor}'s innermost extent {inner} is not a multiple of {chunk} elements"
    off = lo + op.index[op.inner_dim][1]
    if off % chunk:
        return f"{op.tensor}'s tile rows start at element {off} mod {chunk} (not 16-byte aligned)"
    return ""
