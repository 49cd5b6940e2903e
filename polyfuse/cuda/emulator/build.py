"""Compiling the emulator's kernel libraries and server with the host C++ compiler, cached.

Libraries and the server are cached on disk by a hash of their inputs, the flags and the
compiler (:func:`cached_build`), under ``$POLYFUSE_CACHE/emulator`` by default."""

from __future__ import annotations

import atexit
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from polyfuse.base.errors import CompilerNotFound, EmulatorError
from polyfuse.base.settings import cache_root
from polyfuse.base.store import Store, write_atomic

from .wire import ABI_VERSION

RT_DIR = Path(__file__).resolve().parent / "rt"
HEADER = RT_DIR / "pf_emu.h"
RUNTIME_SOURCE = RT_DIR / "pf_emu_rt.cpp"


#: Flags of a kernel library. -O1: a library is built for a few runs, and building is most
#: of its cost (the fast test tier spends 14x longer in g++ than in kernels); -O1 builds a
#: tenth faster than -O2 and whole emulated models ran no slower (ISO C++ keeps floating-point
#: contraction off at every level, so results do not change). -fno-strict-aliasing: CUDA
#: code type-puns through reinterpret_cast; -fno-math-errno: device math has no errno (lets
#: sqrtf inline); -fwrapv: signed integer arithmetic wraps in two's complement, as the GPU's
#: does (int32 overflow is defined in polyfuse's kernels and the reference: README, *Dtypes*).
KERNEL_FLAGS = (
    "-O1",
    "-fwrapv",
    "-std=c++20",
    "-shared",
    "-fPIC",
    "-fvisibility=hidden",
    "-fvisibility-inlines-hidden",
    "-fno-strict-aliasing",
    "-fno-math-errno",
    "-fstack-clash-protection",
    "-w",
)
SERVER_FLAGS = ("-O2", "-std=c++20", "-pthread")
#: Flags of a race-check kernel library (compiled to an object, then linked without libtsan):
#: GCC's ThreadSanitizer instrumentation calls the hooks pf_emu.h defines under PF_RACECHECK,
#: and -g1 (line tables) lets a race report name source lines (full -g builds a fifth slower).
RACECHECK_FLAGS = (
    *(f for f in KERNEL_FLAGS if f != "-shared"),
    "-c",
    "-g1",
    "-fsanitize=thread",
    "--param=tsan-instrument-func-entry-exit=0",
    "-fno-tree-sra",
    "-DPF_RACECHECK",
)


# --------------------------------------------------------------------------------------------
# Compiling and caching
# --------------------------------------------------------------------------------------------


def find_compiler() -> str:
    for cand in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if cand and shutil.which(cand):
            return shutil.which(cand)  # type: ignore[return-value]
    raise CompilerNotFound(
        "the CPU emulator needs a C++20 compiler: install g++ (or set CXX to one)"
    )


@functools.lru_cache(maxsize=8)
def compiler_id(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise CompilerNotFound(f"cannot run the C++ compiler {cxx}: {e}") from e
    return f"{cxx}|{out.stdout.splitlines()[0] if out.stdout else ''}"


@functools.lru_cache(maxsize=1)
def _process_temp_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="polyfuse-emulator-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def default_cache_dir() -> Path:
    root = cache_root()
    if root is None:  # one temporary directory for this process
        return _process_temp_dir()
    return root / "emulator"


def build_key(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:24]


def compile_cxx(
    cxx: str, flags: Sequence[str], src: Path, out: Path, extra: Sequence[str] = ()
) -> None:
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    cmd = [cxx, *flags, str(src), "-o", str(tmp), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        log = out.with_suffix(".log")
        log.write_text(" ".join(cmd) + "\n" + proc.stderr)
        lines = proc.stderr.splitlines()
        first = next((ln for ln in lines if "error" in ln), lines[0] if lines else "failed")
        raise EmulatorError(f"emulator: {Path(cxx).name} rejected {src.name}: {first} (log: {log})")
    os.replace(tmp, out)


def precompiled_header(
    directory: Path, cxx: str, cxx_id: str, flags: Sequence[str], header_text: str
) -> Path:
    """The ``-include`` argument of a kernel build with ``flags``: a stub header next to its
    GCC precompiled form (``<stub>.gch``, cached like a library), so each build skips
    parsing ``pf_emu.h`` and the standard headers (~0.3 s of a ~1 s build). The stub includes
    the real header, so a compiler that does not take the ``.gch`` (another GCC, clang) reads
    the text instead and builds the same library. A failed precompile falls back to the
    header itself: slower, never different."""
    flags = [f for f in flags if f not in ("-shared", "-c")]
    key = build_key("pch", str(ABI_VERSION), cxx_id, " ".join(flags), header_text, str(HEADER))
    stub = directory / f"pch-{key}.h"
    if not stub.exists():
        write_atomic(stub, f'#include "{HEADER}"\n'.encode())
    try:
        cached_build(
            directory,
            f"pch-{key}.h.gch",
            lambda out: compile_cxx(cxx, [*flags, "-x", "c++-header"], stub, out),
        )
    except EmulatorError:
        return HEADER
    return stub


def cached_build(directory: Path, name: str, build: Callable[[Path], None]) -> tuple[Path, bool]:
    """``(path, from_cache)`` of the library ``name``, built by ``build(path)`` unless the
    cache holds a copy that matches its checksum (a corrupt or half-written one is rebuilt);
    one process builds a name at a time (see :mod:`polyfuse.base.store`)."""
    store = Store(directory, "emulator", ABI_VERSION, fan_out=False)
    if (hit := store.read_artifact(name)) is not None:
        return hit, True
    with store.lock(name):
        if (hit := store.read_artifact(name)) is not None:  # another process built it
            return hit, True
        build(store.path(name))
        return store.commit_artifact(name), False
