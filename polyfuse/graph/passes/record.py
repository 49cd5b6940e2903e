"""What a graph pass did, as a typed record the plan prints.

Every pass appends one :class:`PassRecord` per change it made (and per candidate it refused,
with the reason), so ``print(fn.plan)`` shows how the graph that was partitioned differs from
the graph that was written. ``action`` is for programs (tests, reports); ``reason`` is for
people.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class PassAction(StrEnum):
    """What a pass did to the primitives a record names."""

    MERGED = "merged"  # CSE: a duplicate replaced by an equal computation
    FOLDED = "folded"  # evaluated at compile time, or folded into another primitive
    SIMPLIFIED = "simplified"  # a body rewritten into an equal, simpler one
    FORWARDED = "forwarded"  # a primitive equal to another tensor: its readers read that one
    REMOVED = "removed"  # dead: no output depends on it
    REFUSED = "refused"  # a candidate left alone, with the reason
    SUMMARY = "summary"  # the pipeline's before/after line


@dataclass(frozen=True)
class PassRecord:
    """One thing a pass did: the pass, the action, the primitives involved, and why."""

    pass_name: str
    action: PassAction
    prims: tuple[str, ...]
    reason: str

    @property
    def changed(self) -> bool:
        """Whether the record describes a change of the graph (not a refusal or summary)."""
        return self.action not in (PassAction.REFUSED, PassAction.SUMMARY)

    def __str__(self) -> str:
        return f"{self.pass_name}: {self.action.value}: {self.reason}"
