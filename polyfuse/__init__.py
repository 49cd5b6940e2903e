"""polyfuse: a polyhedral fusion compiler for deep-learning graphs.

Write tensor expressions with :mod:`polyfuse.te` (or use the composites in :mod:`polyfuse.ops`),
then ``polyfuse.compile(inputs=[...], outputs=[...])`` partitions the graph into micrographs,
lets isl fuse and tile each one, and emits CUDA C that runs on a GPU through pycuda or on the
CPU emulator (``device="emulate"``).
"""

import os as _os

# In a source checkout the layer folders (graph/, poly/, stitch/, cuda/) sit beside this
# package and pyproject.toml maps them to polyfuse.graph etc. on install; make the same names
# importable when the checkout itself is on sys.path (e.g. `python -m pytest` from the root).
_here = _os.path.dirname(_os.path.abspath(__file__))
_root = _os.path.dirname(_here)
if not _os.path.isdir(_os.path.join(_here, "graph")) and _os.path.isfile(
    _os.path.join(_root, "graph", "__init__.py")
):
    __path__.append(_root)  # noqa: F821

import importlib as _importlib  # noqa: E402
from typing import Any as _Any  # noqa: E402

from polyfuse.artifact import load  # noqa: E402
from polyfuse.errors import PolyfuseError  # noqa: E402
from polyfuse.version import __version__  # noqa: E402

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
