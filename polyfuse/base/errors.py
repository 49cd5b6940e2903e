"""The exceptions polyfuse raises.

Every error a user can cause is a :class:`PolyfuseError` whose message is one line naming the
op or tensor involved and what to do about it.
"""

from __future__ import annotations


class PolyfuseError(Exception):
    """Base class of every error polyfuse raises on purpose."""


class ExpressionError(PolyfuseError, ValueError):
    """A tensor expression is malformed: shape mismatch, non-affine index, bad reduce axis."""


class DtypeError(PolyfuseError, TypeError):
    """A dtype is unknown or not supported."""


class UnsupportedDtypeError(DtypeError):
    """A valid dtype that code generation cannot handle yet (``polyfuse.compile`` of a graph
    with a float16 tensor); ``polyfuse.reference.evaluate`` still runs it."""


class UnsupportedOpError(PolyfuseError):
    """An operator or operator configuration polyfuse cannot compile."""


class ScheduleError(PolyfuseError):
    """isl could not schedule a micrograph even after feedback splitting."""


class CallError(PolyfuseError, ValueError):
    """A compiled graph was called with missing or mis-shaped arguments."""


class CompilerNotFound(PolyfuseError):
    """Neither NVRTC nor nvcc (or the host C++ compiler for the emulator) is available."""


class CudaCompileError(PolyfuseError):
    """NVRTC/nvcc rejected generated CUDA source (a polyfuse bug: please report it)."""


class EmulatorError(PolyfuseError):
    """The CPU emulator failed: a kernel crashed, deadlocked or diverged at a barrier."""


class RaceError(EmulatorError):
    """The emulator's race detector (``race_check="shadow"``) found two conflicting accesses.

    Two threads of one launch touched the same shared or global memory, at least one writing,
    with nothing ordering them (no ``__syncthreads()`` between, or different blocks). The
    message names the kernel, the memory, both threads and both source lines; the same facts
    are attributes: ``kernel``, ``kind`` ("read-after-write", "write-after-read" or
    "write-after-write"), ``space`` ("shared" or "global"), ``memory`` (variable or buffer
    name), ``element``, ``threads`` (two ``((tx, ty, tz), (bx, by, bz))``) and ``lines``.
    """


class DeviceError(PolyfuseError):
    """The GPU (through cuda-bindings or pycuda) is unavailable, or a driver call failed."""


class ArtifactError(PolyfuseError):
    """A saved compiled graph (``fn.save`` / ``polyfuse.load``) cannot be written or read: a
    missing, corrupt, truncated or other-version file, or one with no binary for the GPU."""
