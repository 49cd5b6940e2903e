"""What the program fuzzers share (``polyfuse fuzz --torch``, :mod:`.torch_programs`;
``--onnx``, :mod:`.onnx_programs`): the draw-and-check loop, how a crash reads, and the shapes
of the inputs they draw."""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

O = TypeVar("O")  # noqa: E741 - an outcome


#: The largest tensor a program keeps by default, and the dims its inputs draw then.
SMALL_ELEMENTS = 4096
SMALL_DIMS = (1, 2, 3, 4, 5, 7, 8)
#: Dims of inputs beyond :data:`SMALL_ELEMENTS` (``--max-elements``): around warp, block,
#: tile and row-length thresholds, so tensors reach the multi-block, elements-per-thread and
#: long-reduction paths (two compiles that ran for hours were found only there).
LARGE_DIMS = (1, 3, 8, 17, 64, 130, 256, 513)


def input_shape(rng: Any, max_rank: int, max_elements: int = SMALL_ELEMENTS) -> tuple[int, ...]:
    """An input's shape of rank 1..``max_rank``: of :data:`SMALL_DIMS` (the default), or of
    :data:`LARGE_DIMS` with 8 to ``max_elements`` elements when that exceeds
    :data:`SMALL_ELEMENTS`."""
    if max_elements <= SMALL_ELEMENTS:
        return tuple(rng.choice(SMALL_DIMS) for _ in range(rng.randint(1, max_rank)))
    while True:
        shape = tuple(rng.choice(LARGE_DIMS) for _ in range(rng.randint(1, max_rank)))
        if 8 <= math.prod(shape) <= max_elements:
            return shape


def crash_detail(e: BaseException) -> str:
    """A crash as one line (the exception's last line, at most 500 characters)."""
    return traceback.format_exception_only(type(e), e)[-1].strip()[:500]


def pick_operands(
    rng: Any, kinds: str, values: dict[str, Any], fits: Callable[[str, Any], bool]
) -> tuple[str, str] | None:
    """Names of a step's operands ``a`` (mostly one of the last three values) and ``b`` (of
    ``kinds[1]``, or ``a``), or None where ``a`` is not of ``kinds[0]`` (the draw is
    skipped)."""
    names = list(values)
    a = rng.choice(names[-3:] if rng.random() < 0.7 else names)
    if not fits(kinds[0], values[a]):
        return None
    b = a
    if len(kinds) > 1:
        ok = [n for n in names if fits(kinds[1], values[n])]
        b = rng.choice(ok) if ok else a
        if not fits(kinds[1], values[b]):
            return None
    return a, b


def run_programs(
    n: int,
    seed: int,
    draw: Callable[[int], Any],
    check: Callable[[Any], O],
    progress: Callable[[int, O], None] | None = None,
) -> list[O]:
    """Draw and check ``n`` programs from ``seed`` on, reporting each to ``progress``."""
    outcomes = []
    for k in range(n):
        o = check(draw(seed + k))
        outcomes.append(o)
        if progress is not None:
            progress(k + 1, o)
    return outcomes
