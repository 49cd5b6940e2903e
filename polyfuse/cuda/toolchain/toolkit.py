"""Finding and driving the CUDA compilers: ``libnvrtc`` through :mod:`ctypes` and the ``nvcc``
executable, from the pip wheels (``nvidia-cuda-nvrtc``/``nvidia-cuda-runtime``), a CUDA
toolkit (``CUDA_HOME``, ``CUDA_PATH``, ``/usr/local/cuda*``) or the loader path. What to
compile with and how results are cached is :mod:`polyfuse.cuda.toolchain.compiler`'s business."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import importlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

#: Name under which the translation unit is compiled (appears in compiler messages).
TU_NAME = "polyfuse.cu"


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


def lib_major(path: str) -> int:
    m = re.search(r"libnvrtc\.so\.(\d+)", path)
    return int(m.group(1)) if m else 0


def nvrtc_search_paths() -> list[str]:
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
    wheel_libs.sort(key=lib_major, reverse=True)
    found += wheel_libs
    for root in cuda_roots():
        for sub in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
            libs = glob.glob(str(root / sub / "libnvrtc.so*"))
            libs = [p for p in libs if "builtins" not in p and ".alt." not in p]
            libs.sort(key=lambda p: (lib_major(p), -len(p)), reverse=True)
            found += libs[:1]
    name = find_library("nvrtc")
    if name:
        found.append(name)
    out: list[str] = []
    for p in found:
        key = os.path.realpath(p) if os.sep in p else p
        if key not in {os.path.realpath(q) if os.sep in q else q for q in out}:
            out.append(p)
    return out


@functools.cache
def find_library(name: str) -> str | None:
    """``ctypes.util.find_library``, memoised (it runs ``ldconfig``/``gcc``: tens of ms)."""
    return ctypes.util.find_library(name)


class Nvrtc:
    """A loaded ``libnvrtc`` with the handful of entry points polyfuse uses."""

    def __init__(self, path: str) -> None:
        self.path = path
        libdir = Path(path).parent if os.sep in path else None
        if libdir is not None:
            # The builtins library must be loaded globally first, or every compile fails with
            # NVRTC_ERROR_BUILTIN_OPERATION_FAILURE.
            major = lib_major(path)
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
        self.include_dirs = nvrtc_include_dirs(libdir, self.major)

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
                c.byref(prog), source.encode(), TU_NAME.encode(), 0, None, None
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


def nvrtc_include_dirs(libdir: Path | None, major: int) -> list[str]:
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
_nvrtc_loaded: dict[str, Nvrtc | None] = {}


def find_nvrtc() -> Nvrtc | None:
    """Load the first working ``libnvrtc`` from :func:`nvrtc_search_paths` (memoised per path)."""
    with _lock:
        for path in nvrtc_search_paths():
            if path not in _nvrtc_loaded:
                try:
                    _nvrtc_loaded[path] = Nvrtc(path)
                except (OSError, AttributeError):
                    _nvrtc_loaded[path] = None
            if _nvrtc_loaded[path] is not None:
                return _nvrtc_loaded[path]
    return None


# --------------------------------------------------------------------------------------------
# nvcc
# --------------------------------------------------------------------------------------------


def nvcc_search_paths() -> list[str]:
    """Candidate nvcc executables: PATH, then the toolkit roots' ``bin``."""
    cands: list[str] = []
    on_path = shutil.which("nvcc")
    if on_path:
        cands.append(on_path)
    cands += [str(root / "bin" / "nvcc") for root in cuda_roots()]
    return cands


def find_nvcc() -> str | None:
    for path in nvcc_search_paths():
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


_nvcc_info: dict[str, tuple[str, set[int]]] = {}


def nvcc_version_and_archs(nvcc: str) -> tuple[str, set[int]]:
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


def run_nvcc(
    nvcc: str, source: str, arch: str, output: str, options: Sequence[str]
) -> tuple[bool, str, str | None, bytes | None, list[str]]:
    """Compile with nvcc in a temporary directory; return (ok, log, ptx, image, argv)."""
    with tempfile.TemporaryDirectory(prefix="polyfuse-nvcc-") as tmp:
        src = Path(tmp) / TU_NAME
        src.write_text(source)
        out = Path(tmp) / ("polyfuse.cubin" if output == "cubin" else "polyfuse.ptx")
        argv = [nvcc, f"-arch={arch}", "-std=c++17"]
        argv += ["-cubin", "-Xptxas", "-v"] if output == "cubin" else ["-ptx"]
        argv += [*options, "-o", str(out), TU_NAME]
        proc = subprocess.run(argv, cwd=tmp, capture_output=True, text=True, timeout=600)
        log = (proc.stdout + proc.stderr).replace(tmp + os.sep, "")
        if proc.returncode != 0 or not out.is_file():
            return False, log, None, None, argv
        data = out.read_bytes()
        if output == "ptx":
            return True, log, data.decode(), data + b"\0", argv
        return True, log, None, data, argv
