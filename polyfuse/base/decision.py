"""Decisions as typed records: one record for every choice made or refused, one refusal type.

Every stage states why it decided what it did (partition edges, stitches, placements,
recomputes, layouts, packs, splits). :class:`Decided` is the one record: its kinds (for
programs: the visualizer's filters, reports), its subject (what it is about, by name), whether
the choice was made or refused, the reason as one line of prose (for people:
``print(fn.plan)``) and its typed data (a small frozen dataclass per decision family,
:mod:`polyfuse.base.decision_data`). Rewording a reason changes nothing else.

The stages keep their own decision classes (a partition edge, a stitch, a pack, a placement, a
split, a coarsening); each *carries* the record as ``.record`` rather than *being* it, because
their fields are what the stage reads next (the stitcher's groups, the packer's kernels, the
viz's edge endpoints) and one generic class would hide those types behind ``data``.

A function that may decline returns :class:`Refusal` (kind, subject, reason) instead of a bare
string (Inductor's ``WhyNoFuse``): ``isinstance(r, Refusal)`` is the check, ``str(r)`` the
reason, ``r.record`` the refused decision.

A choice that the plan shows as a note (a register fragment, a promoted tile's box, tensor
cores, pipeline stages, a graph rewrite) is a :class:`DecisionNote`: the note's text is its
record's reason, so lists of notes print and serialise as text did, and ``note.record`` is the
record (:func:`note_records` filters a list of notes; ``plan.records()`` includes the kernels').
Notes that are no choice (the cost model's figures, the SASS instrument's remarks) stay text.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum

from polyfuse.base.decision_data import NO_DATA, DecisionData, typed_data


class DecisionKind(StrEnum):
    """Why two primitives ended up together or apart (the visualizer's reason kinds)."""

    FUSED = "fused"  # same micrograph, by a partition rule
    STITCHED = "stitched"  # same kernel, by a Layer 2 stitch rule
    NO_RULE = "no rule"  # no partition / stitch rule for the kinds
    CYCLE = "cycle"  # merging or stitching would create a cycle
    ISL_FEEDBACK = "isl feedback"  # isl could not schedule them together within budget
    FORM_MISMATCH = "form mismatch"  # canonical forms or launch shapes differ
    TILE_MISMATCH = "tile mismatch"  # outer dimensions or tiles do not match / no layout
    FOOTPRINT = "footprint"  # per-block footprint too large for shared memory
    COST_MODEL = "cost model"  # decided by a cost model (recompute, not spill; pack or not)
    PARALLEL_STITCH = "parallel stitch"  # a Layer 3 decision: independent kernels in one launch
    PACKED = "packed"  # Layer 3 packed the kernels into one launch
    SHARED_BUFFER = "shared buffer"  # Layer 3 kept kernels apart that touch a common buffer
    ELEMENTS_PER_THREAD = "elements per thread"  # and float4 accesses (poly/coarsen.py)
    SPLIT_REDUCTION = "split reduction"  # a reduction split across blocks (poly/split.py)
    REDUCTION_LAYOUT = "reduction layout"  # a reduction kernel's launch shape (poly/cost.py)
    GEMM_TILE = "gemm tile"  # a GEMM's block / register / k tiles (poly/tiling.py)
    GEMM_LOOP = "gemm loop"  # how a GEMM's loops are emitted (poly/gemm_loops.py)
    REGISTER_FRAGMENT = "register fragment"  # a GEMM operand read from registers per kk step
    TENSOR_CORES = "tensor cores"  # a GEMM on warp-level MMA or not (poly/kernel_map.py)
    PIPELINE_STAGES = "pipeline stages"  # shared-memory stages of a GEMM's operand tiles


@dataclass(frozen=True)
class Decided:
    """One decision: its kinds, the reason as the plan prints it, its typed data, what it is
    about (``subject``: primitives, micrographs, kernels or tensors by name) and whether the
    choice was made (False: refused).

    ``data`` given as a plain dict (the compile cache's JSON, or a module not yet converted)
    is turned into its family's typed record by the kinds (:func:`typed_data`); a dict no
    family claims is an error, so ``data`` is always typed."""

    kinds: tuple[DecisionKind, ...]
    reason: str
    data: DecisionData = NO_DATA
    subject: tuple[str, ...] = ()
    made: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.data, dict):
            object.__setattr__(self, "data", typed_data(self.kinds, self.data))
        elif not isinstance(self.data, DecisionData):
            raise TypeError(f"decision data must be a DecisionData, not {type(self.data)}")
        object.__setattr__(self, "subject", tuple(self.subject))

    def __str__(self) -> str:
        return f"[{', '.join(k.value for k in self.kinds)}] {self.reason}"


@dataclass(frozen=True)
class Refusal:
    """Why a choice was not made (Inductor's ``WhyNoFuse``): returned where a function may
    decline, instead of a bare string. ``str(refusal)`` is the reason, so messages that
    embed it read as before."""

    kind: DecisionKind
    reason: str
    subject: tuple[str, ...] = field(default=())
    data: DecisionData = NO_DATA  # the figures behind a refusal (shared bytes of a pack)

    def __post_init__(self) -> None:
        object.__setattr__(self, "subject", tuple(self.subject))

    def __str__(self) -> str:
        return self.reason

    @property
    def record(self) -> Decided:
        """This refusal as a refused decision."""
        return Decided((self.kind,), self.reason, self.data, self.subject, made=False)


def refused(
    kind: DecisionKind, reason: str, *subject: str, data: DecisionData = NO_DATA
) -> Refusal:
    """A :class:`Refusal` of ``kind`` about ``subject`` (names), for ``reason``."""
    return Refusal(kind, reason, subject, data)


class DecisionNote(str):
    """A plan note that is a choice made or refused: its text is its record's reason, so a
    list of notes prints, joins and serialises as plain text did, and ``record`` is the typed
    :class:`Decided` that programs filter on (:func:`note_records`). Notes that are no choice
    (measurements, the cost model's figures, the SASS instrument's remarks) stay plain
    strings."""

    record: Decided

    def __new__(cls, record: Decided) -> DecisionNote:
        note = super().__new__(cls, record.reason)
        note.record = record
        return note

    def __reduce__(self) -> tuple[type, tuple[Decided]]:  # pickles as its record
        return (DecisionNote, (self.record,))

    def prefixed(self, prefix: str) -> DecisionNote:
        """The same record with ``prefix`` before its reason (a pack's ``<kernel>: ``)."""
        return DecisionNote(replace(self.record, reason=prefix + self.record.reason))


def noted(
    kinds: DecisionKind | tuple[DecisionKind, ...],
    reason: str,
    *subject: str,
    made: bool = True,
    data: DecisionData = NO_DATA,
) -> DecisionNote:
    """A plan note recording a choice (``made``) or a refusal of ``kinds`` about ``subject``."""
    kinds = (kinds,) if isinstance(kinds, DecisionKind) else tuple(dict.fromkeys(kinds))
    return DecisionNote(Decided(kinds, reason, data, subject, made))


def refusal_note(kind: DecisionKind, reason: str, refusal: Refusal) -> DecisionNote:
    """A note refusing a choice of ``kind`` for ``refusal`` (whose kind, subject and data the
    record keeps), worded ``reason`` (which usually quotes it)."""
    kinds = tuple(dict.fromkeys((kind, refusal.kind)))
    return DecisionNote(Decided(kinds, reason, refusal.data, refusal.subject, made=False))


def prefixed(note: str, prefix: str) -> str:
    """``prefix + note``, keeping a :class:`DecisionNote`'s record."""
    return note.prefixed(prefix) if isinstance(note, DecisionNote) else prefix + note


def note_records(notes: Iterable[str]) -> list[Decided]:
    """The records of the notes that are decisions, in order."""
    return [n.record for n in notes if isinstance(n, DecisionNote)]


__all__ = [
    "Decided",
    "DecisionData",
    "DecisionKind",
    "DecisionNote",
    "NO_DATA",
    "Refusal",
    "note_records",
    "noted",
    "prefixed",
    "refusal_note",
    "refused",
]
