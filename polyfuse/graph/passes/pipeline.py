"""Run the graph passes in order, round after round, until none changes the graph.

One round runs every selected pass once, in :data:`DEFAULT_PASSES` order: simplification first
(so folding sees ``x * 1`` gone), constant folding (so batch-norm scales are constants before
the batch-norm fold looks for them), CSE, the batch-norm fold, the merge of sibling
contractions (after the batch-norm fold: a scale folds into a weight before the weight is
concatenated; before the layout fold: the slices it leaves fold in the same round), the stack
of sibling reductions applying one computation to constant offsets of one input (an RNN's
per-step input projections: one GEMM; it sees those offsets once the layout fold has folded the
slices into the reads, so in a later round), the layout fold, the split of reduction axes the
layout fold left read by ``k // D`` and ``k % D``, and dead-code elimination last (it sweeps
what the others left behind). A fold can enable another (a collapsed chain then folds into its
convolution), so rounds repeat until one changes nothing — at most :data:`MAX_ROUNDS` (each
pass only ever removes primitives or turns one form into a simpler one, so a fixed point comes
in a few rounds; the bound is a guard, and hitting it is recorded).
Refusals repeat every round; each is recorded once. ``channels_last`` and ``bytes_k_inner``
(:data:`AFTER_ROUNDS`) run once after the rounds, for the target ``arch``: the layout fold
would fold their copies back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

from polyfuse.base.errors import ExpressionError
from polyfuse.graph.graph import Graph
from polyfuse.graph.passes.batchnorm_fold import batchnorm_fold
from polyfuse.graph.passes.bytes_k_inner import bytes_k_inner
from polyfuse.graph.passes.channels_last import channels_last
from polyfuse.graph.passes.constant_fold import constant_fold
from polyfuse.graph.passes.cse import cse
from polyfuse.graph.passes.dce import dce
from polyfuse.graph.passes.layout_fold import layout_fold
from polyfuse.graph.passes.merge_siblings import merge_siblings
from polyfuse.graph.passes.record import PassAction, PassRecord
from polyfuse.graph.passes.rewrite import Evaluator
from polyfuse.graph.passes.simplify import simplify
from polyfuse.graph.passes.split_reduction import split_reduction
from polyfuse.graph.passes.stack_siblings import stack_siblings

#: Every pass, in the order a round runs them.
DEFAULT_PASSES: tuple[str, ...] = (
    "simplify",
    "constant_fold",
    "cse",
    "batchnorm_fold",
    "merge_siblings",
    "stack_siblings",
    "layout_fold",
    "split_reduction",
    "dce",
    "channels_last",
    "bytes_k_inner",
)
#: Passes run once after the rounds, for a target (``arch``): the layout decisions for tensor
#: cores the folds would undo (:mod:`polyfuse.graph.passes.channels_last`,
#: :mod:`polyfuse.graph.passes.bytes_k_inner`)
AFTER_ROUNDS = ("channels_last", "bytes_k_inner")
_AFTER: dict[str, Callable[[Graph, str], Graph]] = {
    "channels_last": channels_last,
    "bytes_k_inner": bytes_k_inner,
}
#: Passes that evaluate constants at compile time (they need an evaluator).
EVALUATING = ("constant_fold", "batchnorm_fold")
MAX_ROUNDS = 8


def check_passes(passes: bool | Sequence[str]) -> tuple[str, ...]:
    """The passes ``compile(passes=...)`` selects: True → all, False → none, or names (run
    in :data:`DEFAULT_PASSES` order); an unknown name raises a one-line error."""
    if passes is True:
        return DEFAULT_PASSES
    if passes is False or passes is None:
        return ()
    if isinstance(passes, str):
        passes = [passes]
    names = list(passes) if isinstance(passes, Sequence | set | frozenset) else [passes]
    unknown = [n for n in names if n not in DEFAULT_PASSES]
    if unknown:
        raise ExpressionError(
            f"compile: unknown graph pass {unknown[0]!r}; use any of {', '.join(DEFAULT_PASSES)}"
            " (or passes=True / False)"
        )
    return tuple(n for n in DEFAULT_PASSES if n in names)


def run_passes(
    graph: Graph,
    passes: Sequence[str] = DEFAULT_PASSES,
    evaluate: Evaluator | None = None,
    max_rounds: int = MAX_ROUNDS,
    arch: str | None = None,
) -> Graph:
    """``graph`` after running ``passes`` to a fixed point (at most ``max_rounds`` rounds),
    then those of :data:`AFTER_ROUNDS` once for ``arch`` (none without it).

    ``evaluate`` computes constant primitives (``polyfuse.reference`` semantics); the folding
    passes need it. The result's ``pass_records`` end with one summary record.
    """
    names = check_passes(passes)
    after = [n for n in names if n in AFTER_ROUNDS]
    names = tuple(n for n in names if n not in AFTER_ROUNDS)
    if not names and not (after and arch):
        return graph
    if evaluate is None and any(n in EVALUATING for n in names):
        folding = ", ".join(n for n in names if n in EVALUATING)
        raise ExpressionError(
            f"run_passes: {folding} evaluate constants: pass evaluate= (polyfuse.reference "
            "semantics, as polyfuse.compile does)"
        )
    fns: dict[str, Callable[[Graph], Graph]] = {
        "simplify": simplify,
        "constant_fold": partial(constant_fold, evaluate=evaluate),
        "cse": cse,
        "batchnorm_fold": partial(batchnorm_fold, evaluate=evaluate),
        "merge_siblings": merge_siblings,
        "stack_siblings": stack_siblings,
        "layout_fold": layout_fold,
        "split_reduction": split_reduction,
        "dce": dce,
    }
    if not names:  # only the passes after the rounds
        return _after_rounds(graph, after, arch)
    start = len(graph.pass_records)
    prims0, consts0 = len(graph.prims), len(graph.constants)
    g = graph
    rounds = 0
    for rounds in range(1, max_rounds + 1):  # noqa: B007
        changed = False
        for n in names:
            before = len(g.pass_records)
            g = fns[n](g)
            changed |= any(r.changed for r in g.pass_records[before:])
        if not changed:
            break
    else:
        rounds = max_rounds + 1
    g = _after_rounds(g, after, arch)
    records = list(dict.fromkeys(g.pass_records[start:]))
    bound = f" (stopped at the bound of {max_rounds} rounds)" if rounds > max_rounds else ""
    summary = PassRecord(
        "pipeline",
        PassAction.SUMMARY,
        (),
        f"{', '.join(names)}: {prims0} -> {len(g.prims)} primitives, {consts0} -> "
        f"{len(g.constants)} constants, {min(rounds, max_rounds)} rounds{bound}",
    )
    return replace(g, pass_records=[*graph.pass_records[:start], *records, summary])


def _after_rounds(graph: Graph, after: Sequence[str], arch: str | None) -> Graph:
    """``graph`` after the passes of :data:`AFTER_ROUNDS` in ``after``, for ``arch`` (none
    without a target)."""
    for n in after if arch else ():
        graph = _AFTER[n](graph, arch)
    return graph
