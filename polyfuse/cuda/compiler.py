"""Compile a CUDA translation unit with NVRTC (preferred) or nvcc, and read ptxas's report.

One call compiles one translation unit: callers pass every kernel of a model at once, so the
fixed cost of a compile (≈ 0.2 s for NVRTC, ≈ 1.5 s for nvcc) is paid once per model.

Compilers, in preference order:

``nvrtc``
    ``libnvrtc.so`` loaded through :mod:`ctypes`. The pip wheels (``pip install
    'polyfuse[nvrtc]'``, i.e. ``nvidia-cuda-nvrtc`` + ``nvidia-cuda-runtime`` for the headers
    such as ``cuda_pipeline.h``) need neither a GPU nor a CUDA toolkit. A system toolkit's
    ``libnvrtc`` (``CUDA_HOME``, ``CUDA_PATH``, ``/usr/local/cuda*``, the loader path) works too.
``nvcc``
    The toolkit's compiler driver, found on ``PATH``, in ``$CUDA_HOME/bin``, ``$CUDA_PATH/bin`` or
    ``/usr/local/cuda*/bin``. It needs a host C++ compiler as well.

For ``output="cubin"`` ptxas runs with ``-v``; its per-kernel report (registers, barriers,
static shared memory, spills, stack frame, constant memory) is parsed into
:class:`KernelResources`. Results are cached on disk under ``$POLYFUSE_CACHE/cuda`` (default
``~/.cache/polyfuse/cuda``), keyed by a hash of the source, arch, compiler and its version,
output kind and options; ``POLYFUSE_CACHE=off`` disables the cache.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from polyfuse.base.errors import CompilerNotFound, CudaCompileError
from polyfuse.base.settings import cache_root
from polyfuse.base.store import Store, write_atomic

__all__ = [
    "SUPPORTED_ARCHS",
    "COMPILERS",
    "CudaBinary",
    "KernelResources",
    "available_compilers",
    "cache_dir",
    "compile_cuda",
    "compiler_version",
    "cuda_roots",
    "nvidia_package_dirs",
    "parse_ptxas_report",
]

#: The architectures polyfuse targets (V100, T4, A100, A10/RTX 30, L4/RTX 40, H100).
#: Note that CUDA 13 compilers dropped sm_70 (Volta): it needs a CUDA 12 NVRTC or nvcc.
SUPPORTED_ARCHS = ("sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_90")

#: Every compiler polyfuse knows, in preference order.
COMPILERS = ("nvrtc", "nvcc")

#: Bump when the cache entry format changes.
_CACHE_FORMAT = 2

#: Name under which the translation unit is compiled (appears in compiler messages).
_TU_NAME = "polyfuse.cu"

_INSTALL_HINT = (
    "pip install 'polyfuse[nvrtc]' (NVRTC from PyPI, no GPU needed), or put nvcc on PATH"
)
_INSTALL_HINTS = {
    "nvrtc": "pip install 'polyfuse[nvrtc]'",
    "nvcc": "install the CUDA toolkit and put nvcc on PATH (or set CUDA_HOME)",
}

_ARCH_RE = re.compile(r"^sm_(\d+)([af]?)$")


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass
class KernelResources:
    """What ptxas reports for one ``__global__`` function (``-Xptxas -v``).

    ``shared_bytes`` is *static* shared memory (``__shared__`` declarations); dynamic shared
    memory is a launch parameter and does not appear here. ``cmem`` is the sum of the constant
    banks ptxas lists (``cmem[0]`` holds the kernel parameters), or ``None`` when it lists none
    (ptxas for sm_90 does not).
    """

    kernel: str
    registers: int = 0
    shared_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    barriers: int = 0
    stack_frame: int = 0
    cmem: int | None = None

    def __str__(self) -> str:
        return (
            f"{self.kernel}: {self.registers} regs, {self.shared_bytes} B smem, "
            f"{self.barriers} barriers, spills {self.spill_stores}/{self.spill_loads} B "
            f"(st/ld), stack {self.stack_frame} B"
        )


@dataclass
class CudaBinary:
    """A compiled translation unit.

    ``image`` is what ``cuModuleLoadData`` / ``pycuda.driver.module_from_buffer`` takes: the
    cubin, or for ``output="ptx"`` the NUL-terminated PTX text. ``ptx`` is the PTX text when the
    compiler produced it (NVRTC always does; nvcc only for ``output="ptx"``). ``resources`` maps
    each kernel name (the ``extern "C"`` name, else the mangled one) to its ptxas report; it is
    empty for PTX output, where ptxas has not run. ``seconds`` is the wall time of this call
    (a cache hit costs milliseconds); ``cached`` tells whether it came from the disk cache.
    """

    arch: str
    compiler: str
    output: str
    image: bytes
    ptx: str | None
    resources: dict[str, KernelResources]
    log: str
    seconds: float
    compiler_version: str = ""
    cached: bool = False
    options: tuple[str, ...] = field(default_factory=tuple)

    def __str__(self) -> str:
        head = (
            f"CudaBinary({self.output} for {self.arch}, {self.compiler} {self.compiler_version}, "
            f"{len(self.image)} B, {self.seconds:.3f} s{', cached' if self.cached else ''})"
        )
        return "\n".join([head, *(f"  {r}" for r in self.resources.values())])


# --------------------------------------------------------------------------------------------
# ptxas report
# --------------------------------------------------------------------------------------------

_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)'")
_PROPS_RE = re.compile(r"Function properties for (\S+)")
_STACK_RE = re.compile(r"(\d+) bytes stack frame")
_SPILL_ST_RE = re.compile(r"(\d+) bytes spill stores")
_SPILL_LD_RE = re.compile(r"(\d+) bytes spill loads")
_REGS_RE = re.compile(r"Used (\d+) registers")
_BARRIERS_RE = re.compile(r"used (\d+) barriers")
_SMEM_RE = re.compile(r"(\d+) bytes smem")
_CMEM_RE = re.compile(r"(\d+) bytes cmem\[\d+\]")


def parse_ptxas_report(log: str) -> dict[str, KernelResources]:
    """Parse ptxas's ``-v`` output (as printed by nvcc or returned in NVRTC's log).

    ptxas prints, per entry function::

        ptxas info    : Compiling entry function 'NAME' for 'sm_80'
        ptxas info    : Function properties for NAME
            0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
        ptxas info    : Used 12 registers, used 1 barriers, 1024 bytes smem, 372 bytes cmem[0]

    "Function properties" blocks of non-inlined device functions are ignored; fields ptxas
    leaves out (no smem, no barriers) are 0.
    """
    kernels: dict[str, KernelResources] = {}
    current: KernelResources | None = None
    props_for: str | None = None
    props: dict[str, tuple[int, int, int]] = {}
    for line in log.splitlines():
        if m := _ENTRY_RE.search(line):
            current = kernels.setdefault(m.group(1), KernelResources(m.group(1)))
            props_for = None
            continue
        if m := _PROPS_RE.search(line):
            props_for = m.group(1)
            continue
        if (m := _SPILL_ST_RE.search(line)) and props_for is not None:
            stack = _STACK_RE.search(line)
            loads = _SPILL_LD_RE.search(line)
            props[props_for] = (
                int(stack.group(1)) if stack else 0,
                int(m.group(1)),
                int(loads.group(1)) if loads else 0,
            )
            props_for = None
            continue
        if (m := _REGS_RE.search(line)) and current is not None:
            current.registers = int(m.group(1))
            if b := _BARRIERS_RE.search(line):
                current.barriers = int(b.group(1))
            if s := _SMEM_RE.search(line):
                current.shared_bytes = int(s.group(1))
            cmem = [int(c) for c in _CMEM_RE.findall(line)]
            current.cmem = sum(cmem) if cmem else None
    for name, res in kernels.items():
        if name in props:
            res.stack_frame, res.spill_stores, res.spill_loads = props[name]
    return kernels


# --------------------------------------------------------------------------------------------
# NVRTC through ctypes
# --------------------------------------------------------------------------------------------


def nvidia_package_dirs() -> list[Path]:
    """The directories of the ``nvidia`` namespace package (pip wheels), if installed."""
    try:
        pkg = importlib.import_module("nvidia")
    except ImportError:
        return []
    return [Path(p) for p in getattr(pkg, "__path__", [])]


def cuda_roots() -> list[Path]:
    """Toolkit roots: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda, /usr/local/cuda-* newest first."""
    roots: list[Path] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            roots.append(Path(os.environ[var]))
    roots.append(Path("/usr/local/cuda"))
    versioned = glob.glob("/usr/local/cuda-*")
    versioned.sort(key=lambda p: [int(x) for x in re.findall(r"\d+", p)], reverse=True)
    roots.extend(Path(p) for p in versioned)
    return roots


def _lib_major(path: str) -> int:
    m = re.search(r"libnvrtc\.so\.(\d+)", path)
    return int(m.group(1)) if m else 0


def _nvrtc_search_paths() -> list[str]:
    """Candidate ``libnvrtc`` libraries, most preferred first (paths, or a bare soname last).

    pip wheels first (``nvidia/cu13/lib``, ``nvidia/cu12/lib``, the CUDA 12 layout
    ``nvidia/cuda_nvrtc/lib``), newest major first; then the toolkit roots; then whatever
    ``ctypes.util.find_library("nvrtc")`` finds on the loader path.
    """
    found: list[str] = []
    wheel_libs: list[str] = []
    for base in nvidia_package_dirs():
        wheel_libs += glob.glob(str(base / "*" / "lib" / "libnvrtc.so.*"))
    wheel_libs = [p for p in wheel_libs if re.search(r"libnvrtc\.so\.\d+$", p)]
    wheel_libs.sort(key=_lib_major, reverse=True)
    found += wheel_libs
    for root in cuda_roots():
        for sub in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
            libs = glob.glob(str(root / sub / "libnvrtc.so*"))
            libs = [p for p in libs if "builtins" not in p and ".alt." not in p]
            libs.sort(key=lambda p: (_lib_major(p), -len(p)), reverse=True)
            found += libs[:1]
    name = _find_library("nvrtc")
    if name:
        found.append(name)
    out: list[str] = []
    for p in found:
        key = os.path.realpath(p) if os.sep in p else p
        if key not in {os.path.realpath(q) if os.sep in q else q for q in out}:
            out.append(p)
    return out


@functools.cache
def _find_library(name: str) -> str | None:
    """``ctypes.util.find_library``, memoised (it runs ``ldconfig``/``gcc``: tens of ms)."""
    return ctypes.util.find_library(name)


class _Nvrtc:
    """A loaded ``libnvrtc`` with the handful of entry points polyfuse uses."""

    def __init__(self, path: str) -> None:
        self.path = path
        libdir = Path(path).parent if os.sep in path else None
        if libdir is not None:
            # The builtins library must be loaded globally first, or every compile fails with
            # NVRTC_ERROR_BUILTIN_OPERATION_FAILURE.
            major = _lib_major(path)
            builtins = sorted(glob.glob(str(libdir / f"libnvrtc-builtins.so.{major}*")))
            for b in [b for b in builtins if ".alt." not in b]:
                ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
        lib = ctypes.CDLL(path)
        self.lib = lib
        c = ctypes
        lib.nvrtcGetErrorString.restype = c.c_char_p
        lib.nvrtcGetErrorString.argtypes = [c.c_int]
        lib.nvrtcVersion.argtypes = [c.POINTER(c.c_int), c.POINTER(c.c_int)]
        lib.nvrtcCreateProgram.argtypes = [
            c.POINTER(c.c_void_p),
            c.c_char_p,
            c.c_char_p,
            c.c_int,
            c.POINTER(c.c_char_p),
            c.POINTER(c.c_char_p),
        ]
        lib.nvrtcDestroyProgram.argtypes = [c.POINTER(c.c_void_p)]
        lib.nvrtcCompileProgram.argtypes = [c.c_void_p, c.c_int, c.POINTER(c.c_char_p)]
        for name in ("nvrtcGetPTXSize", "nvrtcGetCUBINSize", "nvrtcGetProgramLogSize"):
            getattr(lib, name).argtypes = [c.c_void_p, c.POINTER(c.c_size_t)]
        for name in ("nvrtcGetPTX", "nvrtcGetCUBIN", "nvrtcGetProgramLog"):
            getattr(lib, name).argtypes = [c.c_void_p, c.c_char_p]
        major, minor = c.c_int(), c.c_int()
        self._check(lib.nvrtcVersion(c.byref(major), c.byref(minor)), "nvrtcVersion")
        self.major, self.minor = major.value, minor.value
        try:
            size = os.path.getsize(os.path.realpath(path)) if libdir is not None else 0
        except OSError:
            size = 0
        # major.minor alone does not distinguish patch releases; the library size does.
        self.version = f"{self.major}.{self.minor}" + (f"+{size}" if size else "")
        self.archs = self._supported_archs()
        self.include_dirs = _nvrtc_include_dirs(libdir, self.major)

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            msg = self.lib.nvrtcGetErrorString(rc)
            raise OSError(f"{what} failed: {msg.decode() if msg else rc}")

    def _supported_archs(self) -> set[int]:
        c = ctypes
        try:
            n = c.c_int()
            self._check(self.lib.nvrtcGetNumSupportedArchs(c.byref(n)), "nvrtcGetNumSupportedArchs")
            arr = (c.c_int * n.value)()
            self._check(self.lib.nvrtcGetSupportedArchs(arr), "nvrtcGetSupportedArchs")
            return set(arr)
        except (AttributeError, OSError):  # NVRTC < 11.2 has no such query
            return set()

    def compile(
        self, source: str, options: Sequence[str]
    ) -> tuple[bool, str, str | None, bytes | None]:
        """Compile; return (ok, log, ptx, cubin). ``cubin`` is None for a virtual arch."""
        c = ctypes
        prog = c.c_void_p()
        self._check(
            self.lib.nvrtcCreateProgram(
                c.byref(prog), source.encode(), _TU_NAME.encode(), 0, None, None
            ),
            "nvrtcCreateProgram",
        )
        try:
            opts = [o.encode() for o in options]
            arr = (c.c_char_p * len(opts))(*opts)
            rc = self.lib.nvrtcCompileProgram(prog, len(opts), arr)
            log = self._read(prog, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog").decode(
                errors="replace"
            )
            if rc != 0:
                if not log.strip():
                    log = self.lib.nvrtcGetErrorString(rc).decode()
                return False, log, None, None
            ptx = self._read(prog, "nvrtcGetPTXSize", "nvrtcGetPTX").rstrip(b"\0").decode()
            cubin = self._read(prog, "nvrtcGetCUBINSize", "nvrtcGetCUBIN")
            return True, log, ptx or None, cubin or None
        finally:
            self.lib.nvrtcDestroyProgram(c.byref(prog))

    def _read(self, prog: ctypes.c_void_p, size_fn: str, get_fn: str) -> bytes:
        size = ctypes.c_size_t()
        if getattr(self.lib, size_fn)(prog, ctypes.byref(size)) != 0 or size.value == 0:
            return b""
        buf = ctypes.create_string_buffer(size.value)
        if getattr(self.lib, get_fn)(prog, buf) != 0:
            return b""
        return buf.raw[: size.value].rstrip(b"\0") if get_fn == "nvrtcGetProgramLog" else buf.raw


def _nvrtc_include_dirs(libdir: Path | None, major: int) -> list[str]:
    """Directories holding the CUDA headers NVRTC does not build in (cuda_pipeline.h, ...).

    The include folder beside the library (``nvidia/cu13/include`` once ``nvidia-cuda-runtime``
    is installed; a toolkit's ``include``), then the CUDA 12 wheel layout, then toolkit roots.
    """
    cands: list[Path] = []
    if libdir is not None:
        cands.append(libdir.parent / "include")
    for base in nvidia_package_dirs():
        cands += [base / f"cu{major}" / "include", base / "cuda_runtime" / "include"]
    cands += [root / "include" for root in cuda_roots()]
    out: list[str] = []
    for d in cands:
        if (d / "cuda_pipeline.h").is_file() or (d / "cuda_runtime_api.h").is_file():
            s = str(d)
            if s not in out:
                out.append(s)
    return out[:1]  # one version's headers only: mixing versions breaks the build


_lock = threading.Lock()
_nvrtc_loaded: dict[str, _Nvrtc | None] = {}


def _find_nvrtc() -> _Nvrtc | None:
    """Load the first working ``libnvrtc`` from :func:`_nvrtc_search_paths` (memoised per path)."""
    with _lock:
        for path in _nvrtc_search_paths():
            if path not in _nvrtc_loaded:
                try:
                    _nvrtc_loaded[path] = _Nvrtc(path)
                except (OSError, AttributeError):
                    _nvrtc_loaded[path] = None
            if _nvrtc_loaded[path] is not None:
                return _nvrtc_loaded[path]
    return None


# --------------------------------------------------------------------------------------------
# nvcc
# --------------------------------------------------------------------------------------------


def _nvcc_search_paths() -> list[str]:
    """Candidate nvcc executables: PATH, then the toolkit roots' ``bin``."""
    cands: list[str] = []
    on_path = shutil.which("nvcc")
    if on_path:
        cands.append(on_path)
    cands += [str(root / "bin" / "nvcc") for root in cuda_roots()]
    return cands


def _find_nvcc() -> str | None:
    for path in _nvcc_search_paths():
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


_nvcc_info: dict[str, tuple[str, set[int]]] = {}


def _nvcc_version_and_archs(nvcc: str) -> tuple[str, set[int]]:
    """(version line, supported real archs) of an nvcc, memoised per path."""
    if nvcc not in _nvcc_info:
        try:
            out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
            lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
            m = re.search(r"release (\d+\.\d+), V([\d.]+)", out.stdout)
            version = m.group(2) if m else (lines[-1] if lines else "unknown")
        except (OSError, subprocess.SubprocessError):
            version = "unknown"
        archs: set[int] = set()
        try:
            out = subprocess.run(
                [nvcc, "--list-gpu-arch"], capture_output=True, text=True, timeout=60
            )
            archs = {int(x) for x in re.findall(r"compute_(\d+)", out.stdout)}
        except (OSError, subprocess.SubprocessError):
            pass
        _nvcc_info[nvcc] = (version, archs)
    return _nvcc_info[nvcc]


def _run_nvcc(
    nvcc: str, source: str, arch: str, output: str, options: Sequence[str]
) -> tuple[bool, str, str | None, bytes | None, list[str]]:
    """Compile with nvcc in a temporary directory; return (ok, log, ptx, image, argv)."""
    with tempfile.TemporaryDirectory(prefix="polyfuse-nvcc-") as tmp:
        src = Path(tmp) / _TU_NAME
        src.write_text(source)
        out = Path(tmp) / ("polyfuse.cubin" if output == "cubin" else "polyfuse.ptx")
        argv = [nvcc, f"-arch={arch}", "-std=c++17"]
        argv += ["-cubin", "-Xptxas", "-v"] if output == "cubin" else ["-ptx"]
        argv += [*options, "-o", str(out), _TU_NAME]
        proc = subprocess.run(argv, cwd=tmp, capture_output=True, text=True, timeout=600)
        log = (proc.stdout + proc.stderr).replace(tmp + os.sep, "")
        if proc.returncode != 0 or not out.is_file():
            return False, log, None, None, argv
        data = out.read_bytes()
        if output == "ptx":
            return True, log, data.decode(), data + b"\0", argv
        return True, log, None, data, argv


# --------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------


def available_compilers() -> list[str]:
    """The compilers that can run here, a subset of ``["nvrtc", "nvcc"]`` in preference order."""
    out = []
    if _find_nvrtc() is not None:
        out.append("nvrtc")
    if _find_nvcc() is not None:
        out.append("nvcc")
    return out


def compiler_version(compiler: str) -> str:
    """The version string of an available compiler (part of the cache key)."""
    if compiler == "nvrtc":
        lib = _find_nvrtc()
        if lib is None:
            raise CompilerNotFound(f"NVRTC not found: {_INSTALL_HINTS['nvrtc']}")
        return lib.version
    if compiler == "nvcc":
        nvcc = _find_nvcc()
        if nvcc is None:
            raise CompilerNotFound(f"nvcc not found: {_INSTALL_HINTS['nvcc']}")
        return _nvcc_version_and_archs(nvcc)[0]
    raise ValueError(f"unknown CUDA compiler {compiler!r}; expected one of {COMPILERS}")


def cache_dir() -> Path | None:
    """Where compiled binaries are cached: ``$POLYFUSE_CACHE/cuda`` or ``~/.cache/polyfuse/cuda``.

    ``POLYFUSE_CACHE=off`` (or ``0``, ``none``, ``false``) disables the cache and returns None.
    """
    root = cache_root()
    return None if root is None else root / "cuda"


def _arch_number(arch: str) -> int:
    m = _ARCH_RE.match(arch)
    if not m:
        raise ValueError(f"bad CUDA arch {arch!r}: expected 'sm_XX' such as {SUPPORTED_ARCHS}")
    return int(m.group(1))


def _supports(compiler: str, arch_num: int) -> tuple[bool, str]:
    """Whether an available compiler supports an arch, and the version for messages."""
    if compiler == "nvrtc":
        lib = _find_nvrtc()
        assert lib is not None
        return (not lib.archs or arch_num in lib.archs), f"NVRTC {lib.major}.{lib.minor}"
    nvcc = _find_nvcc()
    assert nvcc is not None
    version, archs = _nvcc_version_and_archs(nvcc)
    return (not archs or arch_num in archs), f"nvcc {version}"


def _choose_compiler(arch: str, compiler: str | None) -> str:
    """Pick the compiler: the one asked for, else the first available that supports ``arch``."""
    arch_num = _arch_number(arch)
    if compiler is not None and compiler not in COMPILERS:
        raise ValueError(f"unknown CUDA compiler {compiler!r}; expected one of {COMPILERS}")
    avail = available_compilers()
    if compiler is not None and compiler not in avail:
        raise CompilerNotFound(
            f"CUDA compiler '{compiler}' was requested but not found: {_INSTALL_HINTS[compiler]}"
        )
    if not avail:
        raise CompilerNotFound(f"no CUDA compiler found (neither NVRTC nor nvcc): {_INSTALL_HINT}")
    tried = []
    for name in [compiler] if compiler else avail:
        ok, what = _supports(name, arch_num)
        if ok:
            return name
        tried.append(what)
    hint = (
        " (CUDA 13 dropped sm_70; use a CUDA 12 NVRTC: "
        "pip install 'nvidia-cuda-nvrtc-cu12==12.*' 'nvidia-cuda-runtime-cu12==12.*')"
    )
    raise CompilerNotFound(
        f"no installed CUDA compiler supports {arch} ({', '.join(tried)})"
        + (hint if arch_num < 75 else "")
    )


def _error_summary(log: str, source: str, compiler: str, arch: str) -> tuple[str, str | None]:
    """One line for a failed compile: the first error, and the kernel it is in if known."""
    lines = log.splitlines()
    first = next(
        (i for i, ln in enumerate(lines) if re.search(r"\b(error|fatal)\b", ln, re.IGNORECASE)),
        None,
    )
    if first is None:
        text = next((ln.strip() for ln in lines if ln.strip()), "compilation failed")
        return f"CUDA compile failed ({compiler}, {arch}): {text}", None
    err = lines[first].strip()
    kernel = None
    if m := re.search(r"(?:Entry )?[Ff]unction '([^']+)'", err):
        kernel = m.group(1)
    elif m := re.search(rf"{re.escape(_TU_NAME)}\((\d+)\)", err):
        kernel = _enclosing_kernel(source, int(m.group(1)))
    # The offending source line, as the compiler echoes it under the message.
    echo = ""
    if first + 1 < len(lines) and lines[first + 1].startswith(" ") and lines[first + 1].strip():
        echo = f" — `{lines[first + 1].strip()}`"
    where = f" in kernel '{kernel}'" if kernel else ""
    msg = f"CUDA compile failed ({compiler}, {arch}){where}: {err}{echo}"
    if "cannot open source file" in err and compiler == "nvrtc":
        msg += f" (CUDA headers come with nvidia-cuda-runtime: {_INSTALL_HINTS['nvrtc']})"
    return msg, kernel


def _enclosing_kernel(source: str, lineno: int) -> str | None:
    """The name of the last ``__global__`` function declared at or before ``lineno``."""
    head = "\n".join(source.splitlines()[:lineno])
    head = re.sub(r"__launch_bounds__\s*\([^)]*\)", "", head)
    names = re.findall(r"__global__[^(;{]*?\b([A-Za-z_]\w*)\s*\(", head)
    return names[-1] if names else None


def _cache_key(
    source: str, arch: str, compiler: str, version: str, output: str, options: Sequence[str]
) -> str:
    blob = json.dumps(
        {
            "format": _CACHE_FORMAT,
            "source": source,
            "arch": arch,
            "compiler": compiler,
            "version": version,
            "output": output,
            "options": list(options),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def _store(directory: Path) -> Store:
    return Store(directory, "cuda", _CACHE_FORMAT, fan_out=False)


def _cache_load(directory: Path, key: str) -> CudaBinary | None:
    meta = _store(directory).read_json(f"{key}.json")  # versioned and checksummed
    try:
        image = (directory / f"{key}.bin").read_bytes()
    except OSError:
        return None
    if not isinstance(meta, dict) or hashlib.sha256(image).hexdigest() != meta.get("image_sha256"):
        return None
    try:
        return CudaBinary(
            arch=meta["arch"],
            compiler=meta["compiler"],
            output=meta["output"],
            image=image,
            ptx=meta["ptx"],
            resources={k: KernelResources(**v) for k, v in meta["resources"].items()},
            log=meta["log"],
            seconds=0.0,
            compiler_version=meta["compiler_version"],
            cached=True,
            options=tuple(meta["options"]),
        )
    except (KeyError, TypeError):
        return None


def _cache_store(directory: Path, key: str, binary: CudaBinary) -> None:
    """Write the entry atomically (image first, then metadata); failures are not fatal."""
    meta = {
        "arch": binary.arch,
        "compiler": binary.compiler,
        "compiler_version": binary.compiler_version,
        "output": binary.output,
        "ptx": binary.ptx,
        "resources": {k: asdict(v) for k, v in binary.resources.items()},
        "log": binary.log,
        "options": list(binary.options),
        "image_sha256": hashlib.sha256(binary.image).hexdigest(),
        "compile_seconds": binary.seconds,
    }
    try:
        write_atomic(directory / f"{key}.bin", binary.image)
        _store(directory).write_json(f"{key}.json", meta)  # names the image's checksum
    except OSError:
        pass  # a read-only or full cache directory must not break compilation


def compile_cuda(
    source: str,
    arch: str = "sm_80",
    *,
    compiler: str | None = None,
    output: str = "cubin",
    options: Sequence[str] = (),
    cache: bool = True,
) -> CudaBinary:
    """Compile one CUDA translation unit for ``arch`` (``"sm_80"`` ...).

    ``compiler`` is ``"nvrtc"``, ``"nvcc"`` or None (the first of :func:`available_compilers`
    that supports ``arch``). ``output`` is ``"cubin"`` (ptxas runs, resources are reported) or
    ``"ptx"`` (for ``compute_XX``; no resources). ``options`` are extra compiler flags (e.g.
    ``("-lineinfo",)``, ``("-maxrregcount=64",)``); they are part of the cache key.

    Raises :class:`CompilerNotFound` (with the install command) when no usable compiler is
    found and :class:`CudaCompileError` (one-line message; ``.log`` holds the full compiler
    output, ``.kernel`` the kernel if known) when the source does not compile.
    """
    start = time.perf_counter()
    if output not in ("cubin", "ptx"):
        raise ValueError(f"output must be 'cubin' or 'ptx', not {output!r}")
    name = _choose_compiler(arch, compiler)
    version = compiler_version(name)
    options = tuple(options)
    key = _cache_key(source, arch, name, version, output, options)
    directory = cache_dir() if cache else None
    if directory is not None:
        hit = _cache_load(directory, key)
        if hit is not None:
            hit.seconds = time.perf_counter() - start
            return hit

    ptx: str | None
    if name == "nvrtc":
        lib = _find_nvrtc()
        assert lib is not None
        target = arch if output == "cubin" else arch.replace("sm_", "compute_")
        argv = [f"-arch={target}", "-std=c++17"]
        argv += [f"-I{d}" for d in lib.include_dirs]
        if output == "cubin":
            argv.append("-Xptxas=-v")
        argv += options
        ok, log, ptx, cubin = lib.compile(source, argv)
        image = (cubin if output == "cubin" else (ptx or "").encode() + b"\0") if ok else None
    else:
        nvcc = _find_nvcc()
        assert nvcc is not None
        ok, log, ptx, image, argv = _run_nvcc(nvcc, source, arch, output, options)

    if not ok or not image:
        msg, kernel = _error_summary(log, source, name, arch)
        err = CudaCompileError(msg)
        err.log = log  # type: ignore[attr-defined]
        err.kernel = kernel  # type: ignore[attr-defined]
        err.compiler = name  # type: ignore[attr-defined]
        err.arch = arch  # type: ignore[attr-defined]
        err.options = list(argv)  # type: ignore[attr-defined]
        raise err

    binary = CudaBinary(
        arch=arch,
        compiler=name,
        output=output,
        image=image,
        ptx=ptx,
        resources=parse_ptxas_report(log) if output == "cubin" else {},
        log=log,
        seconds=time.perf_counter() - start,
        compiler_version=version,
        cached=False,
        options=options,
    )
    if directory is not None:
        _cache_store(directory, key, binary)
    return binary
