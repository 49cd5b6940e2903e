"""The exceptions polyfuse raises (the user-facing path of :mod:`polyfuse.base.errors`).

``except polyfuse.errors.CallError`` catches what the compiler raises: the classes are the same
objects as in :mod:`polyfuse.base.errors`, where the layers import them from. Every error a
user can cause is a :class:`PolyfuseError` whose message is one line naming the op or tensor
involved and what to do about it.
"""

from polyfuse.base.errors import (
    ArtifactError,
    CallError,
    CompilerNotFound,
    CudaCompileError,
    DeviceError,
    DtypeError,
    EmulatorError,
    ExpressionError,
    PolyfuseError,
    RaceError,
    ScheduleError,
    UnsupportedDtypeError,
    UnsupportedOpError,
)

__all__ = [
    "ArtifactError",
    "CallError",
    "CompilerNotFound",
    "CudaCompileError",
    "DeviceError",
    "DtypeError",
    "EmulatorError",
    "ExpressionError",
    "PolyfuseError",
    "RaceError",
    "ScheduleError",
    "UnsupportedDtypeError",
    "UnsupportedOpError",
]
