"""Graph passes: each a function Graph → Graph, run before partitioning.

``cse`` (common subexpressions), ``constant_fold`` (computations on constants evaluated at
compile time), ``batchnorm_fold`` (per-channel scale/shift folded into the preceding
convolution's or matmul's weights and bias; chains collapsed), ``simplify`` (algebraic
identities, copies forwarded, transposes of transposes and reshapes of reshapes composed),
``layout_fold`` (primitives that only move data — reshape, transpose, slice, expand, concat —
folded into their readers' loads or, as graph outputs, into their producer's store),
``merge_siblings`` (contractions of one input with different constant weights — attention's Q,
K, V — merged into one over the concatenated weights, each a slice of it), ``stack_siblings``
(reductions applying one computation to constant offsets of one input — an RNN's per-step input
projections — stacked into one over a new leading axis) and ``dce`` (dead primitives and unread
constants); after them, for a target with tensor cores, ``channels_last`` (a 16-bit
convolution's input and weight read through channels-last copies, so the im2col fill takes
16-byte chunks) and ``bytes_k_inner`` (a byte GEMM's constant or privately computed operands
stored k-innermost, so no fill transposes them).
:func:`run_passes` runs them to a fixed point; every pass records what it did
(:class:`PassRecord`), and the plan prints the records.
"""

from polyfuse.graph.passes.batchnorm_fold import batchnorm_fold
from polyfuse.graph.passes.constant_fold import constant_fold
from polyfuse.graph.passes.cse import cse
from polyfuse.graph.passes.dce import dce
from polyfuse.graph.passes.layout_fold import layout_fold
from polyfuse.graph.passes.merge_siblings import merge_siblings
from polyfuse.graph.passes.pipeline import DEFAULT_PASSES, check_passes, run_passes
from polyfuse.graph.passes.record import PassAction, PassRecord
from polyfuse.graph.passes.rewrite import Evaluator
from polyfuse.graph.passes.simplify import simplify
from polyfuse.graph.passes.stack_siblings import stack_siblings

__all__ = [
    "DEFAULT_PASSES",
    "Evaluator",
    "PassAction",
    "PassRecord",
    "batchnorm_fold",
    "check_passes",
    "constant_fold",
    "cse",
    "dce",
    "layout_fold",
    "merge_siblings",
    "run_passes",
    "simplify",
    "stack_siblings",
]
