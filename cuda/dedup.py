"""One ``__global__`` function per distinct kernel body.

The twelve layers of a transformer produce kernels that differ only in the buffers they read
and write. Their sources in canonical form (tensor identifiers ``pfT0``…, kernel name
``pfKERNEL``, as the compile cache stores them) are then identical, so they can run the same
function with different arguments: the CUDA translation unit holds each distinct body once,
named ``pf_<digest of the body>``, and NVRTC/nvcc compile ~20 functions instead of ~230.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace

from polyfuse.cache import rename
from polyfuse.cuda.kernel_ast import Kernel


def function_name(canonical_source: str) -> str:
    """The shared function's name: a digest of the canonical body."""
    return "pf_" + hashlib.sha256(canonical_source.encode()).hexdigest()[:20]


class FunctionTable:
    """The distinct ``__global__`` functions of one translation unit, in first-use order."""

    def __init__(self) -> None:
        self.sources: dict[str, str] = {}
        self.users: dict[str, list[str]] = {}

    def bind(self, kernel: Kernel, canonical_source: str) -> Kernel:
        """``kernel`` running the function of its canonical body (added if new, as
        ``kernel``'s own source renamed): a copy whose ``function`` and ``source`` are the
        shared function's. Structurally identical kernels differ only in their buffers,
        which are parameters, so any user's text computes every user's result."""
        name = function_name(canonical_source)
        if name not in self.sources:  # its first user's names keep the text readable
            text = rename(kernel.source, {kernel.name: name})
            # a pack's part functions are named <kernel>_p<i> (polyfuse.cuda.pack)
            text = re.sub(rf"\b{re.escape(kernel.name)}_p(\d+)\b", rf"{name}_p\1", text)
            self.sources[name] = text
            self.users[name] = []
        self.users[name].append(kernel.name)
        return replace(kernel, function=name, source=self.sources[name])

    def own(self, kernel: Kernel) -> None:
        """Add ``kernel``'s source as a function of its own (e.g. a packed launch)."""
        self.sources[kernel.name] = kernel.source
        self.users[kernel.name] = [kernel.name]

    def source(self) -> str:
        """Every distinct function once."""
        return "\n".join(self.sources.values())

    def __len__(self) -> int:
        return len(self.sources)
