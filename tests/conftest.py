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
from collections.abc import Generator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _is_root(entry: str) -> bool:
    try:
        return Path(entry or ".").resolve() == ROOT
    except OSError:
        return False


sys.path[:] = [p for p in sys.path if not _is_root(p)]
os.environ.setdefault("PYTHONSAFEPATH", "1")


# Tests that need an optional extra (README, "Optional extras") carry ``pytest.mark.extra``:
# CI's extras step runs only those (``-m "extra and not slow"``) once PyTorch and Chromium are
# installed. A test that skips for a missing extra without the mark would never run there, so
# the skip fails instead, naming the fix.
EXTRA_SKIP_REASONS = ("could not import 'torch'", "chromium/chromium-driver not installed")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Generator:
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or item.get_closest_marker("extra") is not None:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if any(r in reason for r in EXTRA_SKIP_REASONS):
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} skips for a missing optional extra ({reason}) but is not marked "
            "pytest.mark.extra: mark it, or CI's extras step never runs it"
        )


@pytest.fixture
def main_tilings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensorized GEMMs tiled by :data:`polyfuse.poly.tensorize_tiling.TILINGS` alone: the
    tests of a mechanism shown at a size whose 64x64 tiles leave SMs idle (where the cost model
    would take a 32-row or 32-column tile of ``SMALL_TILINGS``)."""
    import polyfuse.poly.tensorize_tiling as tzt

    monkeypatch.setattr(tzt, "SMALL_TILINGS", ())
