"""polyfuse: a polyhedral fusion compiler for deep-learning graphs.

Write tensor expressions with :mod:`polyfuse.te` (or use the composites in :mod:`polyfuse.ops`),
then ``polyfuse.compile(inputs=[...], outputs=[...])`` partitions the graph into micrographs,
lets isl fuse and tile each one, and emits CUDA C that runs on a GPU through pycuda or on the
CPU emulator (``device="emulate"``).
"""

import importlib as _importlib
from typing import Any as _Any

from polyfuse.artifact import load
from polyfuse.errors import PolyfuseError
from polyfuse.version import __version__

# The compiler (islpy and every layer) is imported on first use of these names, so that
# ``import polyfuse`` and ``polyfuse.load`` work with the runtime alone (numpy and the driver
# bindings): a machine that runs saved artifacts needs no islpy.
_LAZY = {
    "compile": ("polyfuse.driver", "compile"),
    "CompiledGraph": ("polyfuse.compiled", "CompiledGraph"),
    "ops": ("polyfuse.ops", None),
    "te": ("polyfuse.te", None),
}


def __getattr__(name: str) -> _Any:
    """The lazily imported names above, and any submodule (``polyfuse.zoo``) by attribute."""
    module, attr = _LAZY.get(name, (f"polyfuse.{name}", None))
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        mod = _importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:  # the module exists but an import inside it failed
            raise
        raise AttributeError(f"module 'polyfuse' has no attribute '{name}'") from None
    value = getattr(mod, attr) if attr else mod
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = ["CompiledGraph", "PolyfuseError", "__version__", "compile", "load", "ops", "te"]
