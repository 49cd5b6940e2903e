"""Arrays of other frameworks: what a call argument is, where it lives, and outputs to match.

A compiled graph is called on numpy arrays (host memory: copied in, numpy out) or on device
arrays of any framework, read in place through one of the two standard protocols:

* ``__cuda_array_interface__`` (version 2/3: ``data``, ``shape``, ``typestr``, ``strides``,
  ``stream``) — PyTorch, CuPy, Numba, JAX;
* DLPack (``__dlpack__`` / ``__dlpack_device__``): the capsule's ``DLTensor`` is read with
  ctypes; the capsule stays alive for the call and is released unconsumed, so the producer
  keeps ownership.

:func:`describe` turns an argument into an :class:`ArrayInfo` (pointer, shape, dtype, strides,
device, framework, producer stream). :func:`empty_like_framework` allocates an output in the
caller's framework on the same device (``torch.empty``, ``cupy.empty``), or as a
:class:`DeviceArray` — polyfuse's own allocation, which exports both protocols and which JAX
imports without a copy.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from polyfuse.base.errors import CallError

if TYPE_CHECKING:
    from .device import Device

__all__ = [
    "ArrayInfo",
    "DeviceArray",
    "describe",
    "empty_like_framework",
    "framework_of",
    "default_stream",
    "stream_handle",
]

#: DLPack device types (dlpack.h ``DLDeviceType``).
KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED = 1, 2, 3, 13
#: ``__cuda_array_interface__`` stream values with a fixed meaning (0 is not allowed).
CAI_LEGACY_STREAM, CAI_PER_THREAD_STREAM = 1, 2
#: The driver's handle of the per-thread default stream (``CU_STREAM_PER_THREAD``).
CU_STREAM_PER_THREAD = 2


# --------------------------------------------------------------------------------------------
# DLPack structures (dlpack.h, ABI 0.x/1.x; the unversioned capsule "dltensor")
# --------------------------------------------------------------------------------------------


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


_DL_CODES = {0: "i", 1: "u", 2: "f", 4: "bfloat", 6: "b"}  # DLPack's DLDataTypeCode
_CAPSULE_NAME = b"dltensor"

_capi = ctypes.pythonapi
_capi.PyCapsule_GetPointer.restype = ctypes.c_void_p
_capi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capi.PyCapsule_IsValid.restype = ctypes.c_int
_capi.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_capi.PyCapsule_New.restype = ctypes.py_object
_capi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]
# The same two functions on a raw ``PyObject*`` (a capsule being destroyed has no references
# left, so it must not be wrapped in a py_object).
_raw_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", _capi)
)
_raw_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _capi)
)


# --------------------------------------------------------------------------------------------
# What an argument is
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class ArrayInfo:
    """One call argument as the runtime sees it.

    ``device`` is None for host memory, else the CUDA device ordinal (-1 when the object did
    not say and the driver must be asked). ``strides`` are in bytes (None: C-contiguous).
    ``stream`` is the producer's stream from ``__cuda_array_interface__`` (a driver handle),
    None when the producer asked for no synchronisation. ``keep`` holds what must stay alive
    while the kernels may read the memory (a DLPack capsule).
    """

    obj: Any
    framework: str
    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype | str  # a str for dtypes numpy lacks (torch.bfloat16: "bfloat16")
    strides: tuple[int, ...] | None
    device: int | None
    stream: int | None = None
    readonly: bool = False
    keep: Any = None

    @property
    def nbytes(self) -> int:
        itemsize = self.dtype.itemsize if isinstance(self.dtype, np.dtype) else 2
        return math.prod(self.shape) * itemsize

    @property
    def dtype_name(self) -> str:
        return self.dtype.name if isinstance(self.dtype, np.dtype) else str(self.dtype)

    @property
    def c_contiguous(self) -> bool:
        if self.strides is None:
            return True
        expect = self.dtype.itemsize if isinstance(self.dtype, np.dtype) else 2
        for n, s in zip(reversed(self.shape), reversed(self.strides), strict=True):
            if n != 1 and s != expect:
                return False
            expect *= n
        return True

    @property
    def where(self) -> str:
        """``numpy (host)``, ``torch.Tensor on cuda:0`` ..."""
        kind = f"{type(self.obj).__module__.split('.')[0]}.{type(self.obj).__name__}"
        if self.framework == "numpy":
            kind = "numpy array"
        return f"{kind} ({'host' if self.device is None else f'cuda:{self.device}'})"


def framework_of(obj: Any) -> str:
    """``numpy``, ``torch``, ``cupy``, ``jax``, ``polyfuse`` or ``cuda`` (any other producer)."""
    if isinstance(obj, np.ndarray):
        return "numpy"
    if isinstance(obj, DeviceArray):
        return "polyfuse"
    root = type(obj).__module__.split(".")[0]
    if root in ("torch", "cupy"):
        return root
    if root in ("jax", "jaxlib"):
        return "jax"
    return "cuda"


def _cai_stream(value: Any) -> int | None:
    """A ``__cuda_array_interface__`` stream entry as a driver stream handle."""
    if value is None:
        return None
    value = int(value)
    if value == CAI_LEGACY_STREAM:
        return 0
    if value == CAI_PER_THREAD_STREAM:
        return CU_STREAM_PER_THREAD
    return value


_TYPESTRS: dict[str, np.dtype] = {}


def _from_cai(obj: Any, cai: dict) -> ArrayInfo:
    shape = tuple(cai["shape"])
    typestr = cai["typestr"]
    dtype = _TYPESTRS.get(typestr)
    if dtype is None:
        dtype = _TYPESTRS[typestr] = np.dtype(typestr)
    strides = cai.get("strides")
    ptr, readonly = cai["data"]
    device = -1
    dl_device = getattr(obj, "__dlpack_device__", None)
    if dl_device is not None:
        try:
            kind, ident = dl_device()
            device = int(ident) if int(kind) == KDL_CUDA else -1
        except Exception:
            device = -1
    return ArrayInfo(
        obj=obj,
        framework=framework_of(obj),
        ptr=int(ptr or 0),
        shape=shape,
        dtype=dtype,
        strides=None if strides is None else tuple(int(s) for s in strides),
        device=device,
        stream=_cai_stream(cai.get("stream")) if int(cai.get("version", 0)) >= 3 else None,
        readonly=bool(readonly),
    )


def read_dlpack_capsule(capsule: Any) -> tuple[DLTensor, Any]:
    """The ``DLTensor`` inside an unconsumed "dltensor" capsule (which must stay alive)."""
    if not _capi.PyCapsule_IsValid(capsule, _CAPSULE_NAME):
        raise CallError("not an unconsumed DLPack capsule (name 'dltensor')")
    address = _capi.PyCapsule_GetPointer(capsule, _CAPSULE_NAME)
    managed = DLManagedTensor.from_address(address)
    return managed.dl_tensor, capsule


def _from_dlpack(obj: Any, consumer_stream: int) -> ArrayInfo:
    kind, ident = (int(v) for v in obj.__dlpack_device__())
    if kind == KDL_CUDA:
        # DLPack's stream argument: 1 is the legacy default stream, 0 is not allowed.
        s = CAI_LEGACY_STREAM if consumer_stream == 0 else consumer_stream
        capsule = obj.__dlpack__(stream=s)
    elif kind in (KDL_CPU, KDL_CUDA_HOST):
        capsule = obj.__dlpack__()
    else:
        raise CallError(f"DLPack device type {kind} is not supported (CPU or CUDA only)")
    t, keep = read_dlpack_capsule(capsule)
    if t.dtype.code not in _DL_CODES or t.dtype.lanes != 1:
        raise CallError(f"DLPack dtype code {t.dtype.code}/{t.dtype.bits} bits is not supported")
    dtype = _dl_dtype(t.dtype.code, t.dtype.bits)
    shape = tuple(int(t.shape[i]) for i in range(t.ndim))
    strides = None
    if t.strides:
        strides = tuple(int(t.strides[i]) * dtype.itemsize for i in range(t.ndim))
    return ArrayInfo(
        obj=obj,
        framework=framework_of(obj),
        ptr=int(t.data or 0) + int(t.byte_offset),
        shape=shape,
        dtype=dtype,
        strides=strides,
        device=ident if kind == KDL_CUDA else None,
        keep=keep,
    )


def _dl_dtype(code: int, bits: int) -> np.dtype:
    """The numpy dtype of a DLPack (code, bits); bfloat16 through ml_dtypes."""
    if code == 6:
        return np.dtype(bool)
    if code == 4:
        if bits != 16:
            raise CallError(f"DLPack bfloat of {bits} bits is not supported (bfloat16 only)")
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(f"{_DL_CODES[code]}{bits // 8}")


def _dl_code(dtype: np.dtype) -> int:
    """DLPack's type code of a numpy dtype (bfloat16: 4, bool: 6)."""
    if dtype.name == "bfloat16":
        return 4
    code = {"f": 2, "i": 0, "u": 1, "b": 6}.get(dtype.kind)
    if code is None:
        raise CallError(f"dtype {dtype} has no DLPack type code")
    return code


_TORCH_DTYPES: dict[Any, np.dtype | str] = {}


def _torch_dtype(dtype: Any) -> np.dtype | str:
    found = _TORCH_DTYPES.get(dtype)
    if found is None:
        name = str(dtype).rpartition(".")[2]
        try:
            found = np.dtype(name)
        except TypeError:
            found = name
        _TORCH_DTYPES[dtype] = found
    return found


def _from_torch(t: Any) -> ArrayInfo | None:
    """A ``torch.Tensor`` read through its own accessors (its ``__cuda_array_interface__``
    builds a dict in Python, refuses tensors that require grad, and omits the device).
    Positional construction and ``get_device()``: this runs on every call's hot path."""
    index = t.get_device()  # -1 on the CPU
    if index < 0 and not t.is_cpu:
        return None  # meta, mps, ...: not polyfuse's
    strides = None if t.is_contiguous() else tuple(s * t.element_size() for s in t.stride())
    device = index if index >= 0 else None
    return ArrayInfo(t, "torch", t.data_ptr(), t.shape, _torch_dtype(t.dtype), strides, device)


#: Fast describers by exact class (filled on first sight of a class).
_FAST: dict[type, Any] = {}


def default_stream(obj: Any) -> int:
    """The stream ``obj``'s framework is currently issuing work on: for a CUDA
    ``torch.Tensor`` its device's current stream, for CuPy the current stream, else the
    legacy default stream (0)."""
    root = type(obj).__module__.partition(".")[0]
    if root == "torch" and getattr(obj, "is_cuda", False):
        import torch

        index = obj.device.index or 0
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:
            return int(raw(index))
        return int(torch.cuda.current_stream(obj.device).cuda_stream)
    if root == "cupy":
        import cupy

        return int(cupy.cuda.get_current_stream().ptr)
    return 0


def describe(obj: Any, consumer_stream: int = 0) -> ArrayInfo | None:
    """What ``obj`` is as an array, or None when it is not one.

    numpy arrays are host memory. ``__cuda_array_interface__`` is preferred over DLPack (no
    capsule to build); a DLPack producer on CUDA is asked to make its data ready on
    ``consumer_stream``. A CPU DLPack producer (a CPU ``torch.Tensor``) counts as host memory.
    """
    cls = type(obj)
    fast = _FAST.get(cls)
    if fast is None:
        torch_like = cls.__module__.startswith("torch") and hasattr(obj, "get_device")
        fast = _FAST[cls] = _from_torch if torch_like else False
    if fast:
        info = fast(obj)
        if info is not None:
            return info
    if isinstance(obj, np.ndarray):
        return ArrayInfo(
            obj=obj,
            framework="numpy",
            ptr=int(obj.ctypes.data),
            shape=tuple(obj.shape),
            dtype=obj.dtype,
            strides=None if obj.flags.c_contiguous else tuple(obj.strides),
            device=None,
        )
    try:
        cai = getattr(obj, "__cuda_array_interface__", None)
    except RuntimeError:  # a torch.Tensor that requires grad: read its detached view
        cai = obj.detach().__cuda_array_interface__ if hasattr(obj, "detach") else None
    if cai is not None:
        return _from_cai(obj, cai)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _from_dlpack(obj, consumer_stream)
    return None


# --------------------------------------------------------------------------------------------
# Streams of other frameworks
# --------------------------------------------------------------------------------------------


def stream_handle(stream: Any) -> int:
    """A driver stream handle from ``stream=``: None/0 (the legacy default stream), an int
    handle, ``torch.cuda.Stream``, a CuPy stream, a pycuda ``Stream``, or any object with the
    ``__cuda_stream__`` protocol (cuda.core)."""
    if stream is None:
        return 0
    if isinstance(stream, (int, np.integer)):
        return int(stream)
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        value = protocol() if callable(protocol) else protocol
        return int(value[1])
    for attr in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attr, None)
        if isinstance(value, (int, np.integer)):
            return int(value)
    raise CallError(
        f"stream={type(stream).__name__}: not a CUDA stream (pass an int handle, a "
        "torch.cuda.Stream, a CuPy stream or an object with __cuda_stream__)"
    )


# --------------------------------------------------------------------------------------------
# Outputs
# --------------------------------------------------------------------------------------------

_exports: dict[int, Any] = {}
_export_ids = itertools.count(1)
_exports_lock = threading.Lock()


@_DELETER
def _dl_deleter(address: int) -> None:
    """DLPack deleter of an exported :class:`DeviceArray`: drop the reference the export held."""
    managed = DLManagedTensor.from_address(address)
    with _exports_lock:
        _exports.pop(int(managed.manager_ctx or 0), None)


@_CAPSULE_DESTRUCTOR
def _capsule_destructor(capsule: int) -> None:
    """An export nobody consumed: call its deleter (the DLPack rule for "dltensor" capsules)."""
    if _raw_is_valid(capsule, _CAPSULE_NAME):
        _dl_deleter(_raw_get_pointer(capsule, _CAPSULE_NAME))


class DeviceArray:
    """A float32 (or other) array in device memory that polyfuse allocated.

    Returned as an output when the inputs came from a framework polyfuse cannot allocate in;
    it exports ``__cuda_array_interface__`` (v3) and DLPack, so ``torch.as_tensor(a,
    device="cuda")``, ``cupy.asarray(a)`` and ``jax.dlpack.from_dlpack(a)`` view it without a
    copy. The memory is freed when the last reference (including a consumer's DLPack import)
    goes away. ``ready`` is an event recorded after the kernels that wrote it.
    """

    def __init__(self, device: Device, shape: tuple[int, ...], dtype: Any = np.float32) -> None:
        self.device = device
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize
        self.ptr = device.alloc(self.nbytes)
        self.stream = 0
        self.ready: Any = None
        self._freed = False

    def __del__(self) -> None:
        self.free()

    def free(self) -> None:
        if not self._freed:
            self._freed = True
            try:
                self.device.free(self.ptr)
                if self.ready is not None:
                    self.device.driver.event_destroy(self.ready)
            except Exception:
                pass

    def __repr__(self) -> str:
        return f"DeviceArray({self.shape}, {self.dtype}, cuda:{self.device.ordinal}, {self.ptr:#x})"

    @property
    def __cuda_array_interface__(self) -> dict:
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "strides": None,
            "version": 3,
            "stream": CAI_LEGACY_STREAM if self.stream == 0 else self.stream,
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        return (KDL_CUDA, self.device.ordinal)

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        """A "dltensor" capsule; the consumer's ``stream`` waits for the kernels that wrote
        this array (None: the host waits)."""
        if self.ready is not None:
            if stream is None or stream == -1:
                self.device.driver.event_synchronize(self.ready)
            else:
                consumer = 0 if stream == CAI_LEGACY_STREAM else int(stream)
                self.device.driver.stream_wait_event(consumer, self.ready)
        ident = next(_export_ids)
        shape = (ctypes.c_int64 * max(1, len(self.shape)))(*self.shape)
        managed = DLManagedTensor()
        managed.dl_tensor.data = self.ptr
        managed.dl_tensor.device = DLDevice(KDL_CUDA, self.device.ordinal)
        managed.dl_tensor.ndim = len(self.shape)
        managed.dl_tensor.dtype = DLDataType(_dl_code(self.dtype), self.dtype.itemsize * 8, 1)
        managed.dl_tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        managed.dl_tensor.strides = None
        managed.dl_tensor.byte_offset = 0
        managed.manager_ctx = ident
        managed.deleter = _dl_deleter
        with _exports_lock:
            _exports[ident] = (self, managed, shape)  # alive until the deleter runs
        return _capi.PyCapsule_New(ctypes.addressof(managed), _CAPSULE_NAME, _capsule_destructor)


def empty_like_framework(
    like: ArrayInfo, shape: tuple[int, ...], dtype: np.dtype, device: Device
) -> tuple[Any, int]:
    """An uninitialised output of ``shape`` in ``like``'s framework on ``device``: returns the
    object and its device pointer. torch and CuPy allocate through their own allocators;
    everything else gets a :class:`DeviceArray` (JAX wraps it after the kernels ran)."""
    if like.framework == "torch":
        import torch

        t = torch.empty(shape, dtype=getattr(torch, dtype.name), device=like.obj.device)
        return t, int(t.data_ptr())
    if like.framework == "cupy":
        import cupy

        with cupy.cuda.Device(device.ordinal):
            a = cupy.empty(shape, dtype=dtype)
        return a, int(a.data.ptr)
    a = DeviceArray(device, shape, dtype)
    return a, a.ptr


def finish_output(like: ArrayInfo, obj: Any) -> Any:
    """What the caller gets for an output allocated by :func:`empty_like_framework`."""
    if like.framework == "jax" and isinstance(obj, DeviceArray):
        import jax

        return jax.dlpack.from_dlpack(obj)
    return obj
