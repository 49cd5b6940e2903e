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

import hashlib
import json
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from polyfuse.base.errors import CompilerNotFound, CudaCompileError
from polyfuse.base.settings import cache_root
from polyfuse.base.store import Store, write_atomic

from .toolkit import (
    TU_NAME,
    cuda_roots,
    find_nvcc,
    find_nvrtc,
    nvcc_version_and_archs,
    nvidia_package_dirs,
    run_nvcc,
)

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
# Public entry points
# --------------------------------------------------------------------------------------------


def available_compilers() -> list[str]:
    """The compilers that can run here, a subset of ``["nvrtc", "nvcc"]`` in preference order."""
    out = []
    if find_nvrtc() is not None:
        out.append("nvrtc")
    if find_nvcc() is not None:
        out.append("nvcc")
    return out


def compiler_version(compiler: str) -> str:
    """The version string of an available compiler (part of the cache key)."""
    if compiler == "nvrtc":
        lib = find_nvrtc()
        if lib is None:
            raise CompilerNotFound(f"NVRTC not found: {_INSTALL_HINTS['nvrtc']}")
        return lib.version
    if compiler == "nvcc":
        nvcc = find_nvcc()
        if nvcc is None:
            raise CompilerNotFound(f"nvcc not found: {_INSTALL_HINTS['nvcc']}")
        return nvcc_version_and_archs(nvcc)[0]
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
        lib = find_nvrtc()
        assert lib is not None
        return (not lib.archs or arch_num in lib.archs), f"NVRTC {lib.major}.{lib.minor}"
    nvcc = find_nvcc()
    assert nvcc is not None
    version, archs = nvcc_version_and_archs(nvcc)
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
    elif m := re.search(rf"{re.escape(TU_NAME)}\((\d+)\)", err):
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
        lib = find_nvrtc()
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
        nvcc = find_nvcc()
        assert nvcc is not None
        ok, log, ptx, image, argv = run_nvcc(nvcc, source, arch, output, options)

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
