"""``--shapes NAME=DIMS``: fixing the dynamic input dims of an ONNX model on the command line.

Every ``polyfuse`` verb that loads a model (``zoo``, ``viz``, ``explain``) takes it; the value
becomes ``polyfuse.onnx.load(..., shapes={NAME: DIMS})``. DIMS is ``1,3,224,224`` or
``1x3x224x224``; the option repeats for several inputs.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from polyfuse.errors import PolyfuseError

__all__ = ["add_shapes_argument", "parse_shapes"]


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
        help="fix an ONNX input's dynamic dims, e.g. --shapes input=1,3,224,224 (repeatable)",
    )
