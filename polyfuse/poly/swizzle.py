"""Shared-memory layouts of the 16-bit mma operand tiles: XOR swizzle, padding as the fallback.

A tensorized GEMM's operand tile (``outer`` rows of ``inner`` elements, the array's innermost
dim innermost; :mod:`polyfuse.poly.tensorize`) is written by 16-byte ``cp.async`` chunks and
read by ``ldmatrix``, whose 8 lanes of a quarter-warp each give one 16-byte row of an 8x8
matrix: 8 consecutive tile rows at the same 16-byte chunk. Shared memory serves 16-byte
accesses a quarter-warp per wavefront, conflict-free when its 8 chunks fall in 8 distinct
*bank groups* (4 banks, 16 bytes; the group is the chunk's byte address / 16 mod 8). Dense rows
of 32, 64 or 128 bytes put those 8 rows on 2, 4 or 1 groups (4-, 2-, 8-way conflicts).

**The rule** (:func:`swizzle_rule`, CUTLASS's ``Swizzle<B, 4, S>`` in bytes): in rows of
``row_bytes`` (a power-of-two number ``C`` of 16-byte chunks), chunk ``c`` of row ``r`` is
stored at chunk ``c ^ ((r >> S) & (2^B - 1))`` of that row, with ``B = log2(min(C, 8))`` XOR
bits and ``S = 3 - B``: the ``2^S`` rows that share one 128-byte line of banks already lie on
distinct groups, and the next ``B`` row bits permute the chunks. 8 consecutive rows
(``2^S``-aligned) at one logical chunk then cover all 8 groups (ldmatrix, and the fill's
quarter-warps, which write 8 consecutive rows of one chunk column), and the chunks of one row
stay a permutation of the row (a 128-byte span written row-major is conflict-free too).

**The rows it is applied to** (:func:`operand_layout`): swizzled rows of
:data:`SWIZZLE_ROW_BYTES` = 32 bytes (16 elements: one mma k-step of a k-innermost tile, a pair
of 8-column mma tiles or one 16-row tile of an m/n-innermost tile), ``B = 1``, ``S = 2``: the
chunk bit XORed with row bit 2. A tile wider than that is stored as ``inner / 16`` such
32-byte-row blocks, one after the other (like Hopper's 32-byte swizzle atoms): element
``(r, c)`` at ``(c / 16) * outer * 16 + r * 16 + (((c / 8) & 1) ^ ((r >> 2) & 1)) * 8 + c % 8``.
Every mma tile or k-step then moves an ``ldmatrix`` address by whole rows (multiples of 8) or
whole blocks, which the XOR does not see: the lane's offset is computed once and the loads keep
immediate offsets (the k-tile loop's SASS is that of the padded layout). Wider swizzled rows
(64 or 128 bytes) are as conflict-free but XOR a k-step's chunks into the lane's own
(CUTLASS's per-k-step ``byte_offset ^=``), an instruction per operand and k-step.

**Padding** (:data:`ROW_PAD` elements per row: rows stay 16-byte aligned and 8 consecutive
rows fall on 8 distinct groups) is the fallback where the swizzle does not apply: a tile whose
innermost extent is not a multiple of 16 elements (no whole 32-byte rows), or an m/n-innermost
tile read by 8-column mma tiles (``ldmatrix.x2`` of an odd count of 8-column tiles per warp:
an 8-column step flips the XOR bit, the address would need a register per tile). It costs
``ROW_PAD`` elements per row: the 128x128x32 tile's two operands take 20480 bytes per stage
padded, 16384 swizzled.
"""

from __future__ import annotations

from dataclasses import dataclass

#: elements added to every padded shared row (the fallback layout)
ROW_PAD = 8
#: bytes of one 16-byte chunk (a cp.async, one ldmatrix row) and of a line of the 32 banks
CHUNK_BYTES = 16
BANK_LINE_BYTES = 128
#: bytes of the rows the swizzle is applied to (see the module doc)
SWIZZLE_ROW_BYTES = 32


def swizzle_rule(row_bytes: int) -> tuple[int, int] | None:
    """``(B, S)`` of the XOR swizzle for rows of ``row_bytes``: chunk ``c`` of row ``r`` goes
    to chunk ``c ^ ((r >> S) & (2^B - 1))``; None where no XOR swizzle of whole chunks keeps
    the row (not a power-of-two number of 16-byte chunks)."""
    chunks, rest = divmod(row_bytes, CHUNK_BYTES)
    if rest or chunks < 1 or chunks & (chunks - 1):
        return None
    bits = min(chunks, BANK_LINE_BYTES // CHUNK_BYTES).bit_length() - 1
    return bits, 3 - bits


@dataclass(frozen=True)
class SharedLayout:
    """An operand tile of ``outer`` rows by ``inner`` elements in shared memory: stored as
    ``inner / row`` blocks of ``outer`` rows of ``row`` (+ ``pad``) elements; within a row
    chunk ``c`` of row ``r`` is at chunk ``c ^ ((r >> shift) & mask)`` (``mask`` 0: none)."""

    outer: int
    inner: int
    row: int  # elements per stored row (one block's width)
    pad: int = 0
    mask: int = 0
    shift: int = 0
    chunk: int = 8  # elements per 16-byte chunk
    reason: str = ""

    @property
    def swizzled(self) -> bool:
        return self.mask > 0

    @property
    def blocked(self) -> bool:
        """Stored as several blocks of narrower rows (else one block of whole rows)."""
        return self.row != self.inner

    @property
    def stride(self) -> int:
        """Elements between consecutive stored rows."""
        return self.row + self.pad

    @property
    def block(self) -> int:
        """Elements of one block (``outer`` stored rows)."""
        return self.outer * self.stride

    @property
    def elements(self) -> int:
        """Elements of the tile (one stage)."""
        return self.inner // self.row * self.block

    def offset(self, r: int, c: int) -> int:
        """The element offset of tile element (row ``r``, column ``c``)."""
        q = (c % self.row) // self.chunk ^ (r >> self.shift) & self.mask
        return c // self.row * self.block + r * self.stride + q * self.chunk + c % self.chunk

    def offset_text(self, r: str, c: str, aligned: bool = True) -> str:
        """:meth:`offset` as C text of a row ``r`` and a column ``c`` (C expressions of
        non-negative ints; ``aligned``: the column is a multiple of :attr:`chunk`)."""
        if not (self.swizzled or self.blocked):
            return f"({r}) * {self.stride} + {c}"
        per_row = self.row // self.chunk
        rest = "" if aligned else f" + ({c}) % {self.chunk}"
        return (
            f"({c}) / {self.row} * {self.block} + ({r}) * {self.stride} + "
            f"(((({c}) / {self.chunk}) & {per_row - 1}) ^ ((({r}) >> {self.shift}) & "
            f"{self.mask})) * {self.chunk}{rest}"
        )

    def step_coefficients(self, row_unit: int, col_unit: int) -> tuple[int, int]:
        """Element offsets of moving an access by ``row_unit`` rows and by ``col_unit``
        columns, as immediates: valid where a row step is a multiple of the rows the XOR reads
        (``2^(shift + bits)``) and a column step a multiple of a stored row (swizzled)."""
        if not (self.swizzled or self.blocked):
            return row_unit * self.stride, col_unit
        assert row_unit % (self.mask + 1 << self.shift) == 0, (row_unit, self)
        assert col_unit * self.block % self.row == 0, (col_unit, self)
        return row_unit * self.stride, col_unit * self.block // self.row

    def describe(self) -> str:
        if not self.pad:
            row_bytes = self.row * CHUNK_BYTES // self.chunk
            return (
                f"XOR-swizzled {row_bytes}-byte rows (16-byte chunk ^= (row >> {self.shift}) & "
                f"{self.mask}), {self.inner // self.row} block(s) of {self.outer} rows"
            )
        return f"rows padded by {self.pad} elements ({self.reason})"


def operand_layout(outer: int, inner: int, itemsize: int, col_step: int) -> SharedLayout:
    """The layout of an operand tile of ``outer`` rows by ``inner`` elements of ``itemsize``
    bytes whose ``ldmatrix`` addresses move by ``col_step`` columns between mma tiles (0 when
    they move by rows): swizzled rows of :data:`SWIZZLE_ROW_BYTES`, else padded with the
    reason (see the module doc)."""
    chunk = CHUNK_BYTES // itemsize
    row = SWIZZLE_ROW_BYTES // itemsize
    rule = swizzle_rule(SWIZZLE_ROW_BYTES)
    assert rule is not None
    bits, shift = rule
    if inner % row:
        why = f"innermost extent {inner} is not a multiple of {row} elements"
    elif col_step % row:
        why = f"{col_step}-column mma tiles split a {SWIZZLE_ROW_BYTES}-byte swizzled row"
    elif outer % (1 << bits + shift):
        why = f"{outer} rows are not a multiple of {1 << bits + shift}"
    else:
        return SharedLayout(outer, inner, row, 0, (1 << bits) - 1, shift, chunk)
    return SharedLayout(outer, inner, inner, ROW_PAD, chunk=chunk, reason=why)


__all__ = ["ROW_PAD", "SWIZZLE_ROW_BYTES", "SharedLayout", "operand_layout", "swizzle_rule"]
