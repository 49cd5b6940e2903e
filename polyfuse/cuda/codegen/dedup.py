"""One ``__global__`` function per distinct kernel, by a structural hash of its IR.

The twelve layers of a transformer produce kernels that differ only in the buffers they read
and write. Printed with canonical names (tensor parameters ``pfT0``… by position in the
structural key, :mod:`polyfuse.cuda.codegen.namer`) their functions
(:class:`polyfuse.cuda.codegen.kernel_function.KFunction`: parameters, launch bounds and
coordinates,
allocations and statements, without a name) are equal records, and a Layer 3 dispatch
(:class:`polyfuse.cuda.codegen.kernel_dispatch.KDispatch`) is its layout, which of its parameters
each
part reads (by position) and its parts' canonical functions (part and kernel names are not
part of it). :func:`structural_hash` hashes that record, so two kernels share a function only
when their IR prints identically under any names; they then run one function with different
arguments: the translation unit holds each distinct function once, named
``pf_<digest>``, printed under that name
(:func:`polyfuse.cuda.codegen.kernel_dispatch.print_kernel`),
and NVRTC/nvcc compile ~20 functions instead of ~230.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

from polyfuse.cuda.codegen.kernel_ast import Kernel
from polyfuse.cuda.codegen.kernel_dispatch import dispatch_of, print_kernel


def structural_hash(kernel: Kernel) -> str | None:
    """The hex digest of ``kernel``'s structure with canonical names (None when it has no
    canonical form: a kernel written by hand, or a pack with such a part)."""
    d = dispatch_of(kernel)
    if d is None:
        if kernel.canonical is None:
            return None
        record: object = ["function", kernel.canonical.to_json()]
    else:
        if any(p.canonical is None for p in d.parts):
            return None
        parts = [
            [p.first, p.blocks, p.fold, p.grid, p.threads, p.local_thread, list(p.args)]
            + [p.canonical.to_json()]  # type: ignore[union-attr]
            for p in d.parts
        ]
        record = ["dispatch", d.block, [p.ctype for p in d.params], parts]
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def function_name(digest: str) -> str:
    """The shared function's name: a prefix of the structural hash."""
    return "pf_" + digest[:20]


class FunctionTable:
    """The distinct ``__global__`` functions of one translation unit, in first-use order."""

    def __init__(self) -> None:
        self.sources: dict[str, str] = {}
        self.users: dict[str, list[str]] = {}

    def add(self, kernel: Kernel) -> Kernel:
        """``kernel`` running the function of its structure (added if new, printed from
        ``kernel`` under the function's name): a copy whose ``function`` and ``source`` are
        the shared function's. A kernel without a canonical form keeps a function of its
        own. Structurally identical kernels differ only in their buffers, which are
        parameters, so any user's function computes every user's result."""
        digest = structural_hash(kernel)
        if digest is None:
            self.sources[kernel.name] = kernel.source
            self.users[kernel.name] = [kernel.name]
            return kernel
        name = function_name(digest)
        if name not in self.sources:  # its first user's names keep the text readable
            self.sources[name] = print_kernel(kernel, name)
            self.users[name] = []
        self.users[name].append(kernel.name)
        return replace(kernel, function=name, source=self.sources[name])

    def source(self) -> str:
        """Every distinct function once."""
        return "\n".join(self.sources.values())

    def __len__(self) -> int:
        return len(self.sources)
