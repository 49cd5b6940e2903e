"""What the program fuzzers share (``polyfuse fuzz --torch``, :mod:`.torch_programs`;
``--onnx``, :mod:`.onnx_programs`): the draw-and-check loop and how a crash reads."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any, TypeVar

O = TypeVar("O")  # noqa: E741 - an outcome


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
