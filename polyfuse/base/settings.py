"""Settings read from the environment, parsed in one place.

``POLYFUSE_CACHE``: the root of every on-disk cache (compile entries, CUDA binaries, emulator
libraries, zoo reports); ``off``, ``0``, ``none`` or ``false`` (any case) disable the persistent
caches; unset or empty: ``~/.cache/polyfuse``; ``~`` expands.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "POLYFUSE_CACHE"
DEFAULT_CACHE_ROOT = Path.home() / ".cache" / "polyfuse"
_OFF = ("off", "0", "none", "false")


def cache_root() -> Path | None:
    """The cache root from ``$POLYFUSE_CACHE``; None when it is ``off``."""
    root = os.environ.get(CACHE_ENV, "").strip()
    if root.lower() in _OFF:
        return None
    return Path(root).expanduser() if root else DEFAULT_CACHE_ROOT
