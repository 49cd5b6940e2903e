"""polyfuse: a polyhedral fusion compiler for deep-learning graphs.

Write tensor expressions with :mod:`polyfuse.te` (or use the composites in :mod:`polyfuse.ops`),
then ``polyfuse.compile(inputs=[...], outputs=[...])`` partitions the graph into micrographs,
lets isl fuse and tile each one, and emits CUDA C that runs on a GPU through pycuda or on the
CPU emulator (``device="emulate"``).
"""

from polyfuse import te
from polyfuse.errors import PolyfuseError

__version__ = "0.1.0"

__all__ = ["PolyfuseError", "te", "__version__"]

from polyfuse import ops  # noqa: E402
from polyfuse.compiled import CompiledGraph  # noqa: E402
from polyfuse.driver import compile  # noqa: E402,A004

__all__ += ["CompiledGraph", "compile", "ops"]
