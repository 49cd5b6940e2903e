"""The CUDA driver operations polyfuse's GPU runtime needs, and how a driver library is chosen.

:class:`Driver` is the one interface the rest of the runtime talks to: device pointers,
streams, events and graphs are plain ``int`` handles (modules, functions, packed parameters
and graphs are opaque objects of the backend). Two backends implement it:

``cuda-bindings``
    NVIDIA's ``cuda.bindings.driver`` (the ``cuda-bindings`` / ``cuda-python`` wheels; no
    build, works with any driver of CUDA 12 or newer). Supports foreign stream handles
    (``torch.cuda.Stream``, CuPy streams) and CUDA graphs.
``pycuda``
    ``pycuda.driver`` (the ``[cuda]`` extra; builds against a CUDA toolkit). Launches on its
    own streams or the default stream, without CUDA graphs.

:func:`select_driver` picks one: ``POLYFUSE_CUDA_RUNTIME=cuda-bindings|pycuda`` (or the
``runtime=`` argument) names it; otherwise the first that imports, cuda-bindings first.
Every failure is a :class:`~polyfuse.base.errors.DeviceError` with a one-line reason.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from polyfuse.base.errors import DeviceError

__all__ = ["DRIVERS", "ENV_VAR", "Driver", "ParamKind", "one_line"]

#: The environment variable that names the driver library.
ENV_VAR = "POLYFUSE_CUDA_RUNTIME"

#: Backends in preference order, with the pip extra that installs each.
DRIVERS = {
    "cuda-bindings": "pip install 'polyfuse[cuda-bindings]'",
    "pycuda": "pip install 'polyfuse[cuda]'",
}

#: Kernel parameter kinds: a device pointer or one of the scalar C types of ScalarArg.
ParamKind = str  # "ptr" | "int" | "long long" | "float"

#: The numpy type each parameter kind is passed as (its size and layout in the kernel).
PARAM_DTYPES = {"ptr": np.uint64, "int": np.int32, "long long": np.int64, "float": np.float32}


def one_line(e: BaseException) -> str:
    """An exception's first line (driver messages can span several)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class Driver(ABC):
    """The driver calls the runtime makes; one subclass per driver library.

    A method that fails raises :class:`DeviceError` whose message starts with the driver
    call and its error name (``cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY ...``); callers add the
    kernel or buffer it concerned.
    """

    #: ``"cuda-bindings"`` or ``"pycuda"``.
    name: str = ""
    #: Whether kernels may be launched on stream handles the caller's framework created.
    foreign_streams: bool = False
    #: Whether stream capture into CUDA graphs is available.
    graphs: bool = False
    #: Whether :meth:`pointer_device` can tell device memory from anything else.
    knows_pointers: bool = False

    def owns_stream(self, stream: int) -> bool:
        """Whether kernels may be launched on ``stream`` through this driver."""
        return True

    # -- devices and contexts -------------------------------------------------------------
    @abstractmethod
    def device_count(self) -> int: ...

    @abstractmethod
    def device_name(self, ordinal: int) -> str: ...

    @abstractmethod
    def compute_capability(self, ordinal: int) -> tuple[int, int]: ...

    @abstractmethod
    def driver_version(self) -> int:
        """``cuDriverGetVersion``: e.g. 13000 for CUDA 13.0."""

    @abstractmethod
    def retain_primary_context(self, ordinal: int) -> Any:
        """The device's primary context (the one PyTorch, CuPy and JAX use), retained."""

    @abstractmethod
    def release_primary_context(self, ordinal: int, context: Any) -> None: ...

    @abstractmethod
    def set_current(self, context: Any) -> None:
        """Make ``context`` current on the calling thread (cheap when it already is)."""

    # -- memory ---------------------------------------------------------------------------
    @abstractmethod
    def mem_alloc(self, nbytes: int) -> int: ...

    @abstractmethod
    def mem_free(self, ptr: int) -> None: ...

    @abstractmethod
    def memcpy_htod(self, dst: int, src: np.ndarray, stream: int) -> None:
        """Copy the C-contiguous host array ``src`` to device pointer ``dst``, ordered on
        ``stream`` (the host array may be reused when the call returns)."""

    @abstractmethod
    def memcpy_dtoh(self, dst: np.ndarray, src: int, stream: int) -> None:
        """Copy to the C-contiguous host array ``dst``, ordered on ``stream``; the data is
        there only after the stream is synchronised."""

    @abstractmethod
    def memcpy_dtod(self, dst: int, src: int, nbytes: int, stream: int) -> None: ...

    def pointer_device(self, ptr: int) -> int | None:
        """The ordinal of the device that owns ``ptr``, or None when the driver does not know
        the pointer (host memory) or cannot tell."""
        return None

    # -- modules and launches -------------------------------------------------------------
    @abstractmethod
    def module_load(self, image: bytes) -> Any:
        """``cuModuleLoadData`` on a cubin or NUL-terminated PTX."""

    @abstractmethod
    def module_unload(self, module: Any) -> None: ...

    @abstractmethod
    def module_function(self, module: Any, name: str) -> Any: ...

    @abstractmethod
    def set_max_dynamic_shared(self, function: Any, nbytes: int) -> None:
        """Opt a function in to more than 48 KB of dynamic shared memory."""

    @abstractmethod
    def pack(self, function: Any, params: Sequence[tuple[ParamKind, int | float]]) -> Any:
        """Kernel parameters in the form :meth:`launch` takes, built once and reusable."""

    @abstractmethod
    def launch(
        self,
        function: Any,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared: int,
        stream: int,
        params: Any,
    ) -> None: ...

    # -- streams and events ---------------------------------------------------------------
    @abstractmethod
    def stream_create(self) -> int:
        """A new non-blocking stream."""

    @abstractmethod
    def stream_destroy(self, stream: int) -> None: ...

    @abstractmethod
    def stream_synchronize(self, stream: int) -> None: ...

    @abstractmethod
    def event_create(self, timing: bool = False) -> Any: ...

    @abstractmethod
    def event_destroy(self, event: Any) -> None: ...

    @abstractmethod
    def event_record(self, event: Any, stream: int) -> None: ...

    @abstractmethod
    def event_synchronize(self, event: Any) -> None: ...

    @abstractmethod
    def event_elapsed_ms(self, start: Any, end: Any) -> float: ...

    @abstractmethod
    def stream_wait_event(self, stream: int, event: Any) -> None: ...

    # -- CUDA graphs (only where ``graphs`` is True) ----------------------------------------
    def begin_capture(self, stream: int) -> None:
        raise DeviceError(f"the {self.name} runtime does not capture CUDA graphs")

    def end_capture(self, stream: int) -> Any:
        raise DeviceError(f"the {self.name} runtime does not capture CUDA graphs")

    def graph_instantiate(self, graph: Any) -> Any:
        raise DeviceError(f"the {self.name} runtime does not capture CUDA graphs")

    def graph_launch(self, graph_exec: Any, stream: int) -> None:
        raise DeviceError(f"the {self.name} runtime does not capture CUDA graphs")

    def graph_destroy(self, graph: Any, graph_exec: Any) -> None:  # noqa: B027 (optional)
        """Release a captured graph and its executable (either may be None)."""
