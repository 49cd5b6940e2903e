"""Kernel launches and argument marshalling, shared by the CPU emulator and the GPU runtime.

A compiled graph is a CUDA translation unit plus an ordered list of :class:`Launch` records.
Each launch names a ``__global__`` function, its grid and block, the dynamic shared memory it
needs, and its arguments: either the name of a global buffer (a numpy array the caller owns)
or a scalar literal. Both runtimes call :func:`marshal` so that the argument order, dtype and
contiguity checks are the same whether the kernel runs on a GPU or in the emulator.
"""

from __future__ import annotations

import heapq
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


def dependence_preds(accesses: list[tuple[set[str], set[str]]]) -> list[set[int]]:
    """The kernel DAG's edges as predecessor sets: ``preds[j]`` holds every ``i`` that must run
    before ``j`` (``accesses`` as for :func:`dependence_order`, whose rules these are).
    Linear in the accesses: each buffer's writers are listed once."""
    n = len(accesses)
    writers: dict[str, list[int]] = {}  # buffer -> kernels writing it, in index order
    for i, (_, w) in enumerate(accesses):
        for buf in w:
            writers.setdefault(buf, []).append(i)
    preds: list[set[int]] = [set() for _ in range(n)]
    for j, (rj, wj) in enumerate(accesses):
        for buf in rj - wj:  # i produces what j only reads: i first
            preds[j].update(i for i in writers.get(buf, ()) if i != j)
        for buf in wj:  # two writers of one buffer: keep the given order
            for i in writers[buf]:
                if i >= j:
                    break
                preds[j].add(i)
    return preds


def dependence_order(accesses: list[tuple[set[str], set[str]]], names: list[str]) -> list[int]:
    """A launch order that respects every dependence through a buffer: ``accesses[i]`` is
    (buffers kernel ``i`` reads, buffers it writes). A kernel that reads or writes a buffer
    runs after every kernel that writes it without reading it (its producer); kernels that
    write the same buffer keep their given order, and so do independent kernels.
    Raises :class:`CallError` when the dependences form a cycle (no order exists).
    """
    n = len(accesses)
    preds = dependence_preds(accesses)
    succs: list[list[int]] = [[] for _ in range(n)]
    for j, ps in enumerate(preds):
        for i in ps:
            succs[i].append(j)
    # Kahn's algorithm taking the lowest ready index first: the given order where it can.
    indeg = [len(ps) for ps in preds]
    ready = [k for k in range(n) if indeg[k] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for j in succs[k]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, j)
    if len(order) < n:
        done = set(order)
        stuck = [names[k] for k in range(n) if k not in done]
        raise CallError(f"kernels {', '.join(stuck)} depend on each other in a cycle")
    return order


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
