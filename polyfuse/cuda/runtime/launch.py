"""Kernel launches and argument marshalling, shared by the CPU emulator and the GPU runtime.

A compiled graph is a CUDA translation unit plus an ordered list of :class:`Launch` records.
Each launch names a ``__global__`` function, its grid and block, the dynamic shared memory it
needs, and its arguments: either the name of a global buffer (a numpy array the caller owns)
or a scalar literal. Both runtimes call :func:`marshal` so that the argument order, dtype and
contiguity checks are the same whether the kernel runs on a GPU or in the emulator.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from polyfuse.base.errors import CallError

Dim3 = tuple[int, int, int]


@dataclass(frozen=True)
class ScalarArg:
    """A scalar kernel argument passed by value (``int``, ``long long`` or ``float``)."""

    value: int | float
    ctype: str = "int"  # "int" | "long long" | "float"

    def as_numpy(self) -> np.generic:
        return {"int": np.int32, "long long": np.int64, "float": np.float32}[self.ctype](self.value)


@dataclass(frozen=True)
class Launch:
    """One kernel launch: ``kernel<<<grid, block, shared_bytes>>>(args...)``.

    ``args`` holds buffer names (str) or :class:`ScalarArg`, in the kernel's parameter order.
    ``kernel`` is the logical kernel (one per fused group, named in messages and traffic);
    ``function`` the ``__global__`` function it runs, when that differs: structurally
    identical kernels share one function and differ only in their arguments.
    """

    kernel: str
    grid: Dim3
    block: Dim3
    args: tuple[str | ScalarArg, ...]
    shared_bytes: int = 0
    function: str = ""

    @property
    def entry(self) -> str:
        """The name of the ``__global__`` function to launch."""
        return self.function or self.kernel

    def __str__(self) -> str:
        args = ", ".join(a if isinstance(a, str) else str(a.value) for a in self.args)
        return f"{self.kernel}<<<{self.grid}, {self.block}, {self.shared_bytes}>>>({args})"


@dataclass
class LaunchTraffic:
    """Global-memory traffic of one launch, per buffer: distinct bytes (unique elements touched ×
    element size) and requested bytes (every load and store, repeats included)."""

    kernel: str
    reads: dict[str, int] = field(default_factory=dict)
    writes: dict[str, int] = field(default_factory=dict)
    requested_reads: dict[str, int] = field(default_factory=dict)
    requested_writes: dict[str, int] = field(default_factory=dict)
    # the emulator's shared-memory bank report (emulator.banks.BankAccess per access site),
    # filled by runs with banks=True
    shared_banks: list = field(default_factory=list)

    @property
    def bytes_requested(self) -> int:
        """Bytes of every global load and store of the launch (repeats included)."""
        return sum(self.requested_reads.values()) + sum(self.requested_writes.values())

    @property
    def bytes_read(self) -> int:
        return sum(self.reads.values())

    @property
    def bytes_written(self) -> int:
        return sum(self.writes.values())

    @property
    def bytes_total(self) -> int:
        return self.bytes_read + self.bytes_written


def marshal(launch: Launch, buffers: dict[str, np.ndarray]) -> list[np.ndarray | np.generic]:
    """Resolve a launch's arguments against ``buffers``, in parameter order.

    Buffers must be C-contiguous numpy arrays; scalars become sized numpy scalars. Raises
    :class:`CallError` naming the kernel and buffer when something does not fit.
    """
    out: list[np.ndarray | np.generic] = []
    for arg in launch.args:
        if isinstance(arg, ScalarArg):
            out.append(arg.as_numpy())
            continue
        if arg not in buffers:
            raise CallError(f"kernel {launch.kernel}: no buffer named '{arg}' was provided")
        arr = buffers[arg]
        if not isinstance(arr, np.ndarray) or not arr.flags.c_contiguous:
            raise CallError(
                f"kernel {launch.kernel}: buffer '{arg}' must be a C-contiguous numpy array"
            )
        out.append(arr)
    return out
