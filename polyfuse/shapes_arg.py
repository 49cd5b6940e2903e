"""``--shapes NAME=DIMS``: fixing the dynamic input dims of an ONNX model on the command line.

Every ``polyfuse`` verb that loads a model (``zoo``, ``viz``, ``explain``) takes it; the value
becomes ``polyfuse.onnx.load(..., shapes={NAME: DIMS})``. DIMS is ``1,3,224,224`` or
``1x3x224x224``; the option repeats for several inputs.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from polyfuse.errors import PolyfuseError

__all__ = ["add_shapes_argument", "check_shapes_apply", "parse_shapes"]

_KIND_NAMES = {
    "zoo": "a built-in zoo model",
    "example": "a built-in example",
    "pyfile": "a .py model",
    "python": "a module:function builder",
}


def parse_shapes(items: Sequence[str] | None) -> dict[str, tuple[int, ...]]:
    """``["x=1,3,8", "m=2x4"]`` -> ``{"x": (1, 3, 8), "m": (2, 4)}``; bad items raise."""
    out: dict[str, tuple[int, ...]] = {}
    for item in items or ():
        name, eq, dims = item.partition("=")
        try:
            if not eq or not name:
                raise ValueError
            shape = tuple(int(d) for d in dims.replace("x", ",").split(",") if d.strip())
            if any(d < 0 for d in shape):
                raise ValueError
        except ValueError:
            raise PolyfuseError(
                f"--shapes '{item}': write NAME=D0,D1,... (e.g. input=1,3,224,224)"
            ) from None
        out[name] = shape
    return out


def add_shapes_argument(p: argparse.ArgumentParser) -> None:
    """Add the repeatable ``--shapes NAME=DIMS`` option to a verb's parser."""
    p.add_argument(
        "--shapes",
        action="append",
        metavar="NAME=DIMS",
        default=[],
        help="fix an .onnx model input's dynamic dims, e.g. --shapes input=1,3,224,224 "
        "(repeatable; an error for other models, whose shapes are fixed)",
    )


def check_shapes_apply(models: Sequence[Any], shapes: dict[str, tuple[int, ...]]) -> None:
    """``--shapes`` fixes the dims of ONNX inputs: given for models none of which is an
    ``.onnx`` file (``models``: records with ``kind`` and ``label``), it is an error."""
    if not shapes or any(m.kind == "onnx" for m in models):
        return
    first = next(iter(models), None)
    what = f"'{first.label}' is {_KIND_NAMES.get(first.kind, 'not an .onnx file')}" if first else ""
    raise PolyfuseError(
        f"--shapes fixes the dynamic input dims of .onnx models; {what} (its shapes are "
        "fixed): drop --shapes"
    )
