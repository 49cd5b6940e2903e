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

from polyfuse import ops, te  # noqa: E402
from polyfuse.compiled import CompiledGraph  # noqa: E402
from polyfuse.driver import compile  # noqa: E402,A004
from polyfuse.errors import PolyfuseError  # noqa: E402
from polyfuse.version import __version__  # noqa: E402

__all__ = ["CompiledGraph", "PolyfuseError", "__version__", "compile", "ops", "te"]
