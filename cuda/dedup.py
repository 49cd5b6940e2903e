"""One ``__global__`` function per distinct kernel body.

The twelve layers of a transformer produce kernels that differ only in the buffers they read
and write. Their sources in canonical form (tensor names ``pfT0``…, kernel name ``pfKERNEL``:
printed so by the namer, :mod:`polyfuse.cuda.namer`, as the compile cache stores them) are
then identical, so they can run the same function with different arguments: the CUDA
translation unit holds each distinct body once, named ``pf_<digest of the body>``, and
NVRTC/nvcc compile ~20 functions instead of ~230. The function's text is its first user's
with the kernel's name (and its pack parts' names) replaced as whole identifiers: kernel names
lie in the namer's generated space, so no tensor or local is renamed with them.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

from polyfuse.cuda.kernel_ast import Kernel
from polyfuse.cuda.namer import part_function, rename_identifiers
from polyfuse.cuda.pack import pack_parts


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
            names = {kernel.name: name}
            for i in range(len(pack_parts(kernel))):  # a pack's part functions
                names[part_function(kernel.name, i)] = part_function(name, i)
            self.sources[name] = rename_identifiers(kernel.source, names)
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
