"""Tests import the installed package, never the checkout's folders (DESIGN.md "Layout").

``python -m pytest`` (and ``python -c`` run in the root) puts the repository root on sys.path.
From there the checkout's ``polyfuse/`` would shadow a (non-editable) install, and the tests
would check the source tree instead of what was installed (package data, the wheel's package
list). So the root leaves sys.path before any test module is imported; ``pytest`` and
``python -m pytest`` then see the same modules. The Pythons the tests start (``python -c``,
``python -m polyfuse`` in the root) get ``PYTHONSAFEPATH`` (Python's ``-P``) for the same reason:
they do not put their working directory on sys.path.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _is_root(entry: str) -> bool:
    try:
        return Path(entry or ".").resolve() == ROOT
    except OSError:
        return False


sys.path[:] = [p for p in sys.path if not _is_root(p)]
os.environ.setdefault("PYTHONSAFEPATH", "1")
