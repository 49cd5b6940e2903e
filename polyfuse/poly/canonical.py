"""Reduction canonical forms (PANAMERA-style flattening into a 2-D space).

A reduction micrograph's statements split into *kept* dimensions — the coincident members
of isl's outer band, which index the reduction results — and *reduced* dimensions, the rest.
Flattening each group gives a 2-D problem of one of three forms:

- ``all``: nothing is kept (a full reduction to a scalar);
- ``y``: the innermost (contiguous) dimension of the reduced input is reduced: rows are kept,
  each row is reduced (softmax, layer norm, row sums). Space [outer = kept, inner = reduced];
- ``x``: the innermost dimension is kept: columns are kept, the outer dimension is reduced
  (column sums, per-channel statistics of NHWC data). Space [outer = reduced, inner = kept].

Two reduction micrographs may be stitched (rule 8) only when their forms are identical.
"""

from __future__ import annotations

from dataclasses import dataclass

from polyfuse.graph.expr import IterVar, Read, Tensor, walk
from polyfuse.poly.schedule import ScheduledMicrograph


@dataclass(frozen=True)
class CanonicalForm:
    """The flattened 2-D view of a reduction micrograph."""

    kind: str  # "all" | "x" | "y"
    kept: tuple[int, ...]  # extents of the kept dimensions (outer band members)
    reduced: int  # flattened extent of the reduced dimensions

    @property
    def kept_extent(self) -> int:
        n = 1
        for k in self.kept:
            n *= k
        return n

    @property
    def shape2d(self) -> tuple[int, int]:
        """[outer, inner] as DESIGN.md defines it for this form."""
        if self.kind == "x":
            return (self.reduced, self.kept_extent)
        return (self.kept_extent, self.reduced)

    def same_as(self, other: CanonicalForm) -> bool:
        return self.kind == other.kind and self.kept == other.kept

    def __str__(self) -> str:
        o, i = self.shape2d
        return f"{self.kind}-reduce [{o}, {i}]"


def _main_update(sm: ScheduledMicrograph):
    ups = [s for s in sm.model.statements if s.role == "update"]
    return ups[-1] if ups else None


def canonical_form(sm: ScheduledMicrograph) -> CanonicalForm | None:
    """The canonical form of a reduction micrograph (its last reduction), or None."""
    upd = _main_update(sm)
    return None if upd is None else form_of(upd.tensor)


def form_of(t: Tensor) -> CanonicalForm:
    """The canonical form of reduction primitive ``t`` (from its axes and its largest read)."""
    assert t.op is not None and t.op.reduce is not None
    kept = tuple(a.extent for a in t.op.axes if a.extent > 1)
    red = 1
    for a in t.op.reduce_axes:
        red *= a.extent
    if not kept:
        return CanonicalForm("all", (), red)
    # The form follows the layout of the largest tensor the reduction reads.
    reads = [n for n in walk(t.op.reduce.body) if isinstance(n, Read) and n.tensor.ndim]
    main = max(reads, key=lambda r: r.tensor.size, default=None)
    kind = "y"
    if main is not None:
        red_ids = {a.uid for a in t.op.reduce_axes}
        dims = [d for d, n in enumerate(main.tensor.shape) if n > 1]
        if dims:
            last = main.indices[dims[-1]]
            uses = {n.uid for n in walk(last) if isinstance(n, IterVar)}
            kind = "y" if uses & red_ids else "x"
    return CanonicalForm(kind, kept, red)
