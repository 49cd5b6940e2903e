"""Run CUDA kernels on the CPU: the same source the GPU gets, compiled as C++ by the host compiler.

:class:`Emulator` turns a CUDA translation unit into a shared library in three steps:

1. A text pre-pass (:func:`prepass`) rewrites what C++ cannot express directly, keeping line
   numbers: the pointer parameters of ``__global__`` kernels become instrumented global pointers
   (``pf_gptr<T>``: bounds-checked, recording the unique elements each launch reads and writes),
   pointer parameters of ``__device__`` functions and initialised local pointer declarations
   become ``auto``, ``__shared__`` declarations become per-block arena slots (filled with 0xFF
   bytes, so unwritten shared memory reads as NaN), ``reinterpret_cast`` becomes a version that
   understands instrumented pointers, CUDA ``#include`` lines are dropped, and one exported
   launch entry per kernel (cuLaunchKernel-like ABI) plus a module descriptor are appended.
2. ``g++ -O2 -std=c++20 -shared -fPIC -include pf_emu.h -fvisibility=hidden`` compiles it. The
   header (``emulator_rt/pf_emu.h``) maps ``threadIdx``, barriers, warp operations, cp.async,
   atomics and device math onto the runtime; the runtime itself (fibers, scheduler, workers,
   ``emulator_rt/pf_emu_rt.cpp``) is a separately compiled library, so a kernel library costs
   about a second to build. Both are cached on disk by a hash of their inputs and the compiler.
3. :meth:`EmulatedModule.run` copies the buffers into shared memory and forks a child process
   (from C, so the child never runs Python) that executes the launches in order and exits; the
   parent waits with a timeout, copies results back and reads the per-launch traffic. A crash,
   bad access, divergent barrier or deadlock in a kernel becomes an :class:`EmulatorError` naming
   the kernel; the caller's process is unaffected.

Unsupported source constructs (they fail to compile or are reported): template kernels and
kernels in namespaces, ``__global__``/``__shared__``/``__device__`` hidden in function-like
macros, pointer-returning ``__device__`` functions taking global pointers, member access through
a global pointer to a struct/vector type (``p[i].x``; load the element first), C-style casts of
global pointers (use ``reinterpret_cast``), pointer-to-pointer kernel parameters, ``__half`` and
other fp16/bf16 types, cooperative groups, ``cuda::pipeline``/``cuda::barrier``, inline PTX,
dynamic parallelism, texture/surface objects, ``__constant__`` symbols set from the host.
``auto v = p[i];`` binds a lazy reference to global memory rather than a value.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import mmap
import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from polyfuse.errors import CallError, CompilerNotFound, EmulatorError

from .launch import Launch, LaunchTraffic, ScalarArg, marshal

__all__ = ["Emulator", "EmulatedModule", "KernelSignature", "prepass"]

_RT_DIR = Path(__file__).resolve().parent / "emulator_rt"
_HEADER = _RT_DIR / "pf_emu.h"
_RUNTIME = _RT_DIR / "pf_emu_rt.cpp"
_ABI_VERSION = 1
_RESULT_HEADER = 2048  # bytes of pf_result before counts[]
_ORDERS = {"forward": 0, "reverse": 1, "random": 2}

#: Flags of a kernel library. -fno-strict-aliasing: CUDA code type-puns through
#: reinterpret_cast; -fno-math-errno: device math has no errno (lets sqrtf inline).
KERNEL_FLAGS = (
    "-O2",
    "-std=c++20",
    "-shared",
    "-fPIC",
    "-fvisibility=hidden",
    "-fvisibility-inlines-hidden",
    "-fno-strict-aliasing",
    "-fno-math-errno",
    "-w",
)
RUNTIME_FLAGS = ("-O2", "-std=c++20", "-shared", "-fPIC", "-fvisibility=hidden", "-pthread")


# --------------------------------------------------------------------------------------------
# Pre-pass: CUDA text -> C++ text for pf_emu.h (line numbers are preserved)
# --------------------------------------------------------------------------------------------

_COMMENT_OR_LITERAL = re.compile(
    r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.S
)
_DIRECTIVE = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.M)
_DEFINE = re.compile(
    r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)(?![\w(])[ \t]*((?:[^\n]*\\\n)*[^\n]*)", re.M
)
_CUDA_INCLUDE = re.compile(
    r"^[ \t]*#[ \t]*include[ \t]*[<\"](?:cuda[^>\"]*|cooperative_groups[^>\"]*|mma\.h|"
    r"device_launch_parameters\.h|device_functions\.h|math_constants\.h|vector_types\.h|"
    r"sm_\d+_[a-z_]+\.h|crt/[^>\"]*)[>\"][^\n]*",
    re.M,
)
_KEYWORDS_IN_MACROS = re.compile(r"\b(?:__global__|__shared__|__device__)\b")
_CALL = re.compile(r"([A-Za-z_]\w*)\s*\(")
_ATTRIBUTE_LIKE = {"__launch_bounds__", "__attribute__", "alignas", "__align__", "__declspec"}
_POINTER_QUALS = {"const", "volatile", "__restrict__", "__restrict", "restrict"}
_LOCAL_PTR_DECL = re.compile(
    r"(?P<type>(?:(?:const|volatile|unsigned|signed|struct)\s+)*[A-Za-z_]\w*(?:\s*::\s*\w+)*"
    r"(?:\s+(?:const|volatile))*)\s*(?P<ref>\*|&)\s*(?:(?:__restrict__|__restrict|const)\s+)*"
    r"(?P<name>[A-Za-z_]\w*)\s*=(?!=)"
)
_NOT_TYPES = {
    "return", "else", "case", "goto", "throw", "delete", "sizeof", "new", "do", "co_return",
    "co_yield", "typedef", "using", "operator",
}  # fmt: skip
_SHARED_ALIGN = re.compile(
    r"__align__\s*\(\s*(\d+)\s*\)|alignas\s*\(\s*(\d+)\s*\)|"
    r"__attribute__\s*\(\s*\(\s*aligned\s*\(\s*(\d+)\s*\)\s*\)\s*\)"
)


def _blank(m: re.Match[str]) -> str:
    return re.sub(r"[^\n]", " ", m.group(0))


def _mask(src: str) -> str:
    """Same-length copy of ``src``: comments, literals and preprocessor lines become blanks."""
    out = _COMMENT_OR_LITERAL.sub(_blank, src)
    out = _DIRECTIVE.sub(_blank, out)
    return "".join(c if c.isascii() else " " for c in out)


def _match_close(text: str, i: int) -> int:
    """Index of the bracket closing the one at ``i`` (``(``, ``[``, ``{`` or ``<``)."""
    pairs = {"(": ")", "[": "]", "{": "}", "<": ">"}
    op, cl, depth = text[i], pairs[text[i]], 0
    for j in range(i, len(text)):
        c = text[j]
        if c == op:
            depth += 1
        elif c == cl:
            depth -= 1
            if depth == 0:
                return j
    raise EmulatorError(f"emulator pre-pass: unbalanced '{op}' at offset {i}")


def _split_top(text: str, start: int, end: int, sep: str = ",") -> list[tuple[int, int]]:
    """Spans of ``text[start:end]`` separated by ``sep`` outside brackets."""
    spans, depth, s = [], 0, start
    for j in range(start, end):
        c = text[j]
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        elif c == sep and depth == 0:
            spans.append((s, j))
            s = j + 1
    spans.append((s, end))
    return spans


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _expand_keyword_macros(src: str) -> str:
    """Substitute object-like macros whose bodies hide ``__global__``/``__shared__``/``__device__``."""
    for _ in range(4):
        macros = {}
        for m in _DEFINE.finditer(src):
            body = re.sub(r"\\\n", " ", m.group(2)).strip()
            if _KEYWORDS_IN_MACROS.search(body):
                macros[m.group(1)] = body
        if not macros:
            return src
        mask = _mask(src)
        pat = re.compile(r"\b(" + "|".join(map(re.escape, macros)) + r")\b")
        hits = list(pat.finditer(mask))
        if not hits:
            return src
        for m in reversed(hits):
            src = src[: m.start()] + macros[m.group(1)] + src[m.end() :]
    return src


def _statement_start(mask: str, pos: int) -> int:
    """Start of the declaration/statement containing ``pos``."""
    k = max(mask.rfind(";", 0, pos), mask.rfind("{", 0, pos), mask.rfind("}", 0, pos))
    return k + 1


def _pointer_param(text: str) -> tuple[str, str] | None:
    """``(pointee type, name)`` of a pointer/array parameter declaration, else None."""
    s = text.strip()
    m = re.fullmatch(r"(.*?)\b([A-Za-z_]\w*)\s*\[\s*\]", s, re.S)
    if m:
        typ, name = m.group(1), m.group(2)
    elif "*" in s:
        i = s.rfind("*")
        typ, rest = s[:i], s[i + 1 :]
        names = [t for t in re.findall(r"[A-Za-z_]\w*", rest) if t not in _POINTER_QUALS]
        name = names[-1] if names else ""
    else:
        return None
    typ = re.sub(r"\b(?:__restrict__|__restrict|restrict)\b", " ", typ)
    typ = " ".join(typ.split())
    if "*" in typ or "&" in typ:
        raise EmulatorError(
            f"emulator: pointer-to-pointer parameter '{s}' is not supported in kernels"
        )
    return typ, name


@dataclass
class _Edit:
    start: int
    end: int
    text: str


def _rewrite_params(
    src: str, mask: str, lo: int, hi: int, kernel: bool, edits: list[_Edit]
) -> bool:
    """Rewrite the pointer parameters between ``lo`` and ``hi``; True if any was rewritten."""
    changed = False
    for a, b in _split_top(mask, lo, hi):
        seg = src[a:b]
        if not seg.strip():
            continue
        pp = _pointer_param(mask[a:b])
        if pp is None:
            continue
        typ, name = pp
        lead = seg[: len(seg) - len(seg.lstrip())]
        trail = seg[len(seg.rstrip()) :]
        nl = seg.strip().count("\n")
        new = f"pf_gptr<{typ}> {name}" if kernel else f"auto {name}"
        edits.append(_Edit(a, b, lead + new.rstrip() + "\n" * nl + trail))
        changed = True
    return changed


@dataclass(frozen=True)
class _Prepassed:
    source: str
    kernels: tuple[str, ...]


def prepass(source: str) -> _Prepassed:
    """Rewrite CUDA source into C++ for the emulator header; returns the text and kernel names.

    Raises :class:`EmulatorError` for constructs the emulator cannot handle.
    """
    src = _CUDA_INCLUDE.sub(lambda m: "", source)
    src = _expand_keyword_macros(src)
    mask = _mask(src)
    codes = np.frombuffer(mask.encode("utf-32-le"), dtype=np.uint32)
    depth = np.cumsum((codes == ord("{")).astype(np.int32) - (codes == ord("}")))
    edits: list[_Edit] = []
    kernels: list[str] = []

    def depth_at(pos: int) -> int:
        return int(depth[pos - 1]) if pos > 0 else 0

    # 1. __global__ kernels: pointer parameters -> pf_gptr<T>.
    for m in re.finditer(r"\b__global__\b", mask):
        head = mask[_statement_start(mask, m.start()) : m.start()]
        if re.search(r"\btemplate\b", head):
            raise EmulatorError(
                f"emulator: template kernels are not supported (line {_line_of(src, m.start())})"
            )
        pos = m.end()
        while True:
            c = _CALL.search(mask, pos)
            if c is None:
                raise EmulatorError(
                    f"emulator: cannot parse the kernel at line {_line_of(src, pos)}"
                )
            close = _match_close(mask, c.end() - 1)
            if c.group(1) in _ATTRIBUTE_LIKE:
                pos = close + 1
                continue
            break
        name, lo = c.group(1), c.end()
        _rewrite_params(src, mask, lo, close, True, edits)
        nxt = mask[close + 1 :].lstrip()[:1]
        if nxt == "{" and name not in kernels:
            kernels.append(name)

    # 2. __device__ functions: pointer parameters -> auto (abbreviated templates).
    for m in re.finditer(r"\b__device__\b", mask):
        stop = re.compile(r"[;={(]").search(mask, m.end())
        pos = m.end()
        while stop is not None and mask[stop.start()] == "(":
            c = _CALL.search(mask, pos)
            if c is None or c.end() - 1 != stop.start():
                stop = None
                break
            close = _match_close(mask, stop.start())
            if c.group(1) in _ATTRIBUTE_LIKE:
                pos = close + 1
                stop = re.compile(r"[;={(]").search(mask, pos)
                continue
            if _rewrite_params(src, mask, stop.start() + 1, close, False, edits):
                st = _statement_start(mask, m.start())
                ext = re.search(r"\bextern\s+\"C\"", src[st : m.start()])
                if ext:  # templates cannot have C linkage
                    edits.append(_Edit(st + ext.start(), st + ext.end(), " " * len(ext.group(0))))
            break

    # 3. __shared__ declarations -> per-block arena slots.
    site = 0
    for m in re.finditer(r"\b__shared__\b", mask):
        st = _statement_start(mask, m.start())
        end = mask.find(";", m.end())
        if end < 0:
            raise EmulatorError(
                f"emulator: unterminated __shared__ declaration at line {_line_of(src, m.start())}"
            )
        pre = mask[st : m.start()]
        decl = mask[m.end() : end]
        dynamic = bool(re.search(r"\bextern\b", pre))
        pre = re.sub(r"\b(?:extern|static)\b", " ", pre)
        align = 16
        for a in _SHARED_ALIGN.finditer(pre + " " + decl):
            align = max(align, int(next(g for g in a.groups() if g)))
        pre = _SHARED_ALIGN.sub(" ", pre)
        decl = _SHARED_ALIGN.sub(" ", decl)
        parts = [decl[a:b] for a, b in _split_top(decl, 0, len(decl))]
        d0 = re.fullmatch(r"\s*(.*?)\b([A-Za-z_]\w*)\s*((?:\[[^\]]*\]\s*)*)", parts[0], re.S)
        if d0 is None:
            raise EmulatorError(
                f"emulator: cannot parse the __shared__ declaration at line {_line_of(src, m.start())}"
            )
        base = " ".join((pre + " " + d0.group(1)).split()).rstrip("*& ")
        stars0 = d0.group(1).count("*")
        declarators = [(stars0, d0.group(2), d0.group(3).strip())]
        for p in parts[1:]:
            d = re.fullmatch(r"\s*(\**)\s*([A-Za-z_]\w*)\s*((?:\[[^\]]*\]\s*)*)", p)
            if d is None:
                raise EmulatorError(
                    f"emulator: cannot parse the __shared__ declaration at line {_line_of(src, m.start())}"
                )
            declarators.append((len(d.group(1)), d.group(2), d.group(3).strip()))
        file_scope = depth_at(st) == 0
        out = []
        nl = src[st:end].count("\n")
        for stars, name, dims in declarators:
            typ = base + "*" * stars
            if dynamic:
                if file_scope:
                    out.append(f"\n#define {name} (pf_dyn_shared<{typ}>())\n")
                else:
                    out.append(f"{typ}* const {name} = pf_dyn_shared<{typ}>();")
                continue
            full = f"{typ} {dims}" if dims else typ
            ptr = f"{typ} (*){dims}" if dims else f"{typ}*"
            expr = f"(*({ptr})pf_shared({site}, sizeof({full}), {align} > alignof({full}) ? {align} : alignof({full})))"
            if file_scope:
                out.append(f"\n#define {name} {expr}\n")
            else:
                out.append(f"auto& {name} = {expr};")
            site += 1
        text = " ".join(out)
        if file_scope:
            edits.append(_Edit(st, end + 1, text + f"#line {_line_of(src, end)}\n"))
        else:
            edits.append(_Edit(st, end + 1, text + "\n" * nl))
    if site > 512:
        raise EmulatorError("emulator: more than 512 __shared__ declarations in one source")

    # 4. Initialised local pointer/reference declarations -> auto (they may hold pf_gptr).
    for m in _LOCAL_PTR_DECL.finditer(mask):
        if depth_at(m.start()) == 0 or m.group("type").split()[0] in _NOT_TYPES:
            continue
        if m.group("type").split()[-1] in _NOT_TYPES:
            continue
        k = m.start() - 1
        while k >= 0 and mask[k] in " \t\n":
            k -= 1
        prev = mask[k] if k >= 0 else ";"
        if prev not in ";{}" and not (prev == "(" and re.search(r"\bfor\s*$", mask[:k])):
            continue
        semi = mask.find(";", m.end())
        init = mask[m.end() : semi].strip()
        if semi < 0 or init in ("nullptr", "NULL", "0"):
            continue
        if len(_split_top(mask, m.end(), semi)) > 1 or mask[m.end() : semi].count(")") > mask[
            m.end() : semi
        ].count("("):
            continue
        if any(e.start <= m.start() < e.end for e in edits):
            continue
        auto = "auto&& " if m.group("ref") == "&" else "auto "
        edits.append(_Edit(m.start(), m.start("name"), auto))

    # 5. reinterpret_cast understands instrumented pointers.
    for m in re.finditer(r"\breinterpret_cast\s*<", mask):
        if not any(e.start <= m.start() < e.end for e in edits):
            edits.append(
                _Edit(m.start(), m.start() + len("reinterpret_cast"), "pf_reinterpret_cast")
            )

    edits.sort(key=lambda e: e.start)
    out, pos = [], 0
    for e in edits:
        if e.start < pos:
            raise EmulatorError("emulator pre-pass: overlapping rewrites (please report)")
        out.append(src[pos : e.start])
        out.append(e.text)
        pos = e.end
    out.append(src[pos:])
    text = "".join(out)
    if not kernels:
        raise EmulatorError("emulator: the source defines no __global__ kernel")
    return _Prepassed(text + _registration(kernels), tuple(kernels))


def _registration(kernels: Sequence[str]) -> str:
    lines = ["", "// ---- emulator registration (appended by the pre-pass) ----"]
    for k in kernels:
        lines.append(
            f'extern "C" __attribute__((visibility("default"))) int pf_launch_{k}(unsigned gx, '
            "unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shmem, "
            "void** args) {"
        )
        lines.append(f'  static const pf_kernel_info info = {{"{k}", &pf_thunk<&{k}>}};')
        lines.append("  return pf_api->launch(&info, gx, gy, gz, bx, by, bz, shmem, args);")
        lines.append("}")
    lines.append(
        'extern "C" __attribute__((visibility("default"))) const pf_module_desc* '
        "pf_module(const pf_api_t* api) {"
    )
    lines.append("  pf_api = api;")
    lines.append(f"  static char sigs[{len(kernels)}][1024];")
    lines.append("  static const pf_kernel_desc ks[] = {")
    for i, k in enumerate(kernels):
        lines.append(f'    {{"{k}", (void*)&pf_launch_{k}, pf_sig(&{k}, sigs[{i}])}},')
    lines.append("  };")
    lines.append(f"  static const pf_module_desc m = {{{_ABI_VERSION}, {len(kernels)}, ks}};")
    lines.append("  return &m;")
    lines.append("}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Compiling and caching
# --------------------------------------------------------------------------------------------


def _find_compiler() -> str:
    for cand in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if cand and shutil.which(cand):
            return shutil.which(cand)  # type: ignore[return-value]
    raise CompilerNotFound(
        "the CPU emulator needs a C++20 compiler: install g++ (or set CXX to one)"
    )


@functools.lru_cache(maxsize=8)
def _compiler_id(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise CompilerNotFound(f"cannot run the C++ compiler {cxx}: {e}") from e
    return f"{cxx}|{out.stdout.splitlines()[0] if out.stdout else ''}"


def _default_cache_dir() -> Path:
    root = os.environ.get("POLYFUSE_CACHE")
    if root and root.lower() == "off":
        return Path(tempfile.mkdtemp(prefix="polyfuse-emulator-"))
    base = Path(root) if root else Path.home() / ".cache" / "polyfuse"
    return base / "emulator"


def _hash(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:24]


def _compile(cxx: str, flags: Sequence[str], cpp: Path, out: Path, extra: Sequence[str]) -> None:
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    cmd = [cxx, *flags, *extra, str(cpp), "-o", str(tmp)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        log = out.with_suffix(".log")
        log.write_text(" ".join(cmd) + "\n" + proc.stderr)
        first = next(
            (ln for ln in proc.stderr.splitlines() if "error" in ln),
            proc.stderr.strip().splitlines()[0] if proc.stderr.strip() else "unknown error",
        )
        raise EmulatorError(f"emulator: {Path(cxx).name} rejected {cpp.name}: {first} (log: {log})")
    os.replace(tmp, out)


_LIB_LOCK = threading.Lock()
_LIBS: dict[str, ctypes.CDLL] = {}


def _load_library(path: Path) -> ctypes.CDLL:
    with _LIB_LOCK:
        lib = _LIBS.get(str(path))
        if lib is None:
            lib = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL | os.RTLD_NOW)
            _LIBS[str(path)] = lib
        return lib


# --------------------------------------------------------------------------------------------
# ctypes mirrors of the run specification (pf_emu_rt.cpp)
# --------------------------------------------------------------------------------------------


class _RunBuf(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("nbytes", ctypes.c_uint64),
        ("itemsize", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("name", ctypes.c_char_p),
    ]


class _RunLaunch(ctypes.Structure):
    _fields_ = [
        ("fn", ctypes.c_void_p),
        ("name", ctypes.c_char_p),
        ("grid", ctypes.c_uint32 * 3),
        ("block", ctypes.c_uint32 * 3),
        ("shared", ctypes.c_uint32),
        ("nargs", ctypes.c_uint32),
        ("argbuf", ctypes.POINTER(ctypes.c_int32)),
        ("argval", ctypes.POINTER(ctypes.c_void_p)),
    ]


class _RunSpec(ctypes.Structure):
    _fields_ = [
        ("abi", ctypes.c_uint32),
        ("nbuf", ctypes.c_uint32),
        ("bufs", ctypes.POINTER(_RunBuf)),
        ("nlaunch", ctypes.c_uint32),
        ("order", ctypes.c_uint32),
        ("launches", ctypes.POINTER(_RunLaunch)),
        ("seed", ctypes.c_uint64),
        ("workers", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("result", ctypes.c_void_p),
    ]


class _KernelDesc(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("launch", ctypes.c_void_p), ("sig", ctypes.c_char_p)]


class _ModuleDesc(ctypes.Structure):
    _fields_ = [
        ("abi", ctypes.c_uint32),
        ("nkernels", ctypes.c_uint32),
        ("kernels", ctypes.POINTER(_KernelDesc)),
    ]


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelSignature:
    """A kernel parameter list as the compiled library reports it.

    Each parameter is ``(pointer, kind, size)``: ``pointer`` is True for a global buffer,
    ``kind`` one of ``f`` (floating), ``i`` (signed), ``u`` (unsigned), ``b`` (bool), ``v``
    (other) and ``size`` the byte size of the value or pointee.
    """

    params: tuple[tuple[bool, str, int], ...]

    @classmethod
    def parse(cls, sig: str) -> KernelSignature:
        params = []
        for tok in filter(None, sig.split(",")):
            params.append((tok[0] == "p", tok[1], int(tok[2:])))
        return cls(tuple(params))


_SCALAR_KIND = {"int": ("i", 4), "long long": ("i", 8), "float": ("f", 4)}


class EmulatedModule:
    """A CUDA translation unit compiled for the CPU emulator (see :meth:`Emulator.load`)."""

    def __init__(self, emulator: Emulator, lib: ctypes.CDLL, path: Path, from_cache: bool):
        self.emulator = emulator
        self.path = path
        #: True when the library came from the disk cache (no compiler ran).
        self.from_cache = from_cache
        self._lib = lib
        fn = lib.pf_module
        fn.restype = ctypes.POINTER(_ModuleDesc)
        fn.argtypes = [ctypes.c_void_p]
        desc = fn(emulator._rt_api).contents
        if desc.abi != _ABI_VERSION:
            raise EmulatorError(
                f"emulator: {path.name} has ABI {desc.abi}, expected {_ABI_VERSION}"
            )
        self._kernels: dict[str, tuple[int, KernelSignature]] = {}
        for i in range(desc.nkernels):
            k = desc.kernels[i]
            self._kernels[k.name.decode()] = (k.launch, KernelSignature.parse(k.sig.decode()))
        self._lock = threading.Lock()
        self._shm: mmap.mmap | None = None
        self._shm_addr = 0
        self._shm_view: np.ndarray | None = None

    @property
    def kernel_names(self) -> list[str]:
        """Names of the ``__global__`` kernels defined by the source, in source order."""
        return list(self._kernels)

    def signature(self, kernel: str) -> KernelSignature:
        """The parameter signature of ``kernel``."""
        return self._kernels[kernel][1]

    def _shared(self, size: int) -> tuple[np.ndarray, int]:
        if self._shm is None or len(self._shm) < size:
            self._shm_view = None
            if self._shm is not None:
                self._shm.close()
            self._shm = mmap.mmap(-1, max(size, 1 << 16))
            self._shm_view = np.frombuffer(self._shm, dtype=np.uint8)
            self._shm_addr = self._shm_view.ctypes.data
        assert self._shm_view is not None
        return self._shm_view, self._shm_addr

    def _check(self, launch: Launch, values: list) -> tuple[int, KernelSignature]:
        if launch.kernel not in self._kernels:
            raise CallError(
                f"kernel {launch.kernel}: not defined by this source (it has "
                f"{', '.join(self._kernels) or 'no kernels'})"
            )
        fn, sig = self._kernels[launch.kernel]
        if len(values) != len(sig.params):
            raise CallError(
                f"kernel {launch.kernel}: takes {len(sig.params)} arguments, launch passes "
                f"{len(values)}"
            )
        for i, (arg, (pointer, kind, size)) in enumerate(zip(launch.args, sig.params, strict=True)):
            if pointer:
                if not isinstance(arg, str):
                    raise CallError(f"kernel {launch.kernel}: argument {i} must be a buffer")
                arr = values[i]
                ak = {"f": "f", "i": "i", "u": "u", "b": "b"}.get(arr.dtype.kind, "v")
                if arr.itemsize & (arr.itemsize - 1) or (
                    kind != "v" and (ak != kind or arr.itemsize != size)
                ):
                    raise CallError(
                        f"kernel {launch.kernel}: buffer '{arg}' has dtype {arr.dtype}, the "
                        f"kernel's parameter {i} points to a {size}-byte '{kind}' type"
                    )
            else:
                if isinstance(arg, str):
                    raise CallError(
                        f"kernel {launch.kernel}: argument {i} is a scalar, got buffer '{arg}'"
                    )
                sk, ss = _SCALAR_KIND[arg.ctype]
                ints = {"i", "u", "b"}
                if ss != size or (sk != kind and not (sk in ints and kind in ints)):
                    raise CallError(
                        f"kernel {launch.kernel}: argument {i} is a {size}-byte '{kind}' "
                        f"scalar, got ScalarArg({arg.value!r}, {arg.ctype!r})"
                    )
        return fn, sig

    def run(
        self,
        launches: Sequence[Launch],
        buffers: dict[str, np.ndarray],
        order: str = "forward",
        seed: int = 0,
        timeout: float = 600.0,
    ) -> list[LaunchTraffic]:
        """Execute ``launches`` in sequence on ``buffers`` (updated in place); return the traffic.

        ``order`` is how each block's threads are scheduled between barriers: "forward" (thread
        order), "reverse" (a missing barrier shows as a wrong result) or "random" (shuffled with
        ``seed``). The launches run in a child process; a crash, out-of-bounds access, divergent
        barrier or deadlock raises :class:`EmulatorError` naming the kernel, as does exceeding
        ``timeout`` seconds; ``buffers`` are then left unchanged. The traffic of each launch
        lists, for every buffer argument, the unique elements read and written × item size.
        """
        if order not in _ORDERS:
            raise CallError(f"order must be one of {', '.join(_ORDERS)}, not {order!r}")
        launches = list(launches)
        names: dict[str, int] = {}
        plan = []
        for launch in launches:
            values = marshal(launch, buffers)
            fn, _ = self._check(launch, values)
            for a in launch.args:
                if isinstance(a, str) and a not in names:
                    names[a] = len(names)
            plan.append((launch, fn, values))
        arrays = [buffers[n] for n in names]
        counts_bytes = 16 * len(launches) * max(1, len(names))
        offsets, pos = [], (_RESULT_HEADER + counts_bytes + 63) // 64 * 64
        for a in arrays:
            offsets.append(pos)
            pos += (a.nbytes + 63) // 64 * 64
        with self._lock:
            view, addr = self._shared(pos)
            view[:_RESULT_HEADER] = 0
            counts = view[_RESULT_HEADER : _RESULT_HEADER + counts_bytes].view(np.int64)
            counts[:] = -1
            for a, off in zip(arrays, offsets, strict=True):
                view[off : off + a.nbytes] = a.reshape(-1).view(np.uint8)
            keep: list = []
            bufs = (_RunBuf * max(1, len(arrays)))()
            for i, (n, a, off) in enumerate(zip(names, arrays, offsets, strict=True)):
                nm = n.encode()
                keep.append(nm)
                bufs[i] = _RunBuf(addr + off, a.nbytes, a.itemsize, 0, nm)
            runs = (_RunLaunch * max(1, len(plan)))()
            for i, (launch, fn, values) in enumerate(plan):
                n = len(values)
                argbuf = (ctypes.c_int32 * max(1, n))()
                argval = (ctypes.c_void_p * max(1, n))()
                for j, (arg, v) in enumerate(zip(launch.args, values, strict=True)):
                    if isinstance(arg, str):
                        argbuf[j] = names[arg]
                    else:
                        argbuf[j] = -1
                        cell = np.array([v])
                        keep.append(cell)
                        argval[j] = cell.ctypes.data
                nm = launch.kernel.encode()
                keep += [argbuf, argval, nm]
                runs[i] = _RunLaunch(
                    fn,
                    nm,
                    (ctypes.c_uint32 * 3)(*launch.grid),
                    (ctypes.c_uint32 * 3)(*launch.block),
                    launch.shared_bytes,
                    n,
                    argbuf,
                    argval,
                )
            spec = _RunSpec(
                _ABI_VERSION,
                len(arrays),
                bufs,
                len(plan),
                _ORDERS[order],
                runs,
                seed & (2**64 - 1),
                self.emulator.workers,
                0,
                addr,
            )
            status = self._spawn_and_wait(spec, timeout, launches)
            res_status = int(view[:4].view(np.int32)[0])
            current = int(view[4:8].view(np.int32)[0])
            if res_status != 1 or status != 0:
                name = launches[min(max(current, 0), len(launches) - 1)].kernel if launches else "?"
                raise EmulatorError(self._failure(view, res_status, status, name))
            traffic = []
            written = [False] * len(arrays)
            c = counts.reshape(len(launches), max(1, len(names)), 2)
            for i, launch in enumerate(launches):
                t = LaunchTraffic(launch.kernel)
                for a in launch.args:
                    if isinstance(a, str) and a not in t.reads:
                        r, w = (max(0, int(x)) for x in c[i, names[a]])
                        t.reads[a] = r
                        t.writes[a] = w
                        written[names[a]] |= w > 0
                traffic.append(t)
            for a, off, w in zip(arrays, offsets, written, strict=True):
                if w:
                    a.reshape(-1).view(np.uint8)[:] = view[off : off + a.nbytes]
            return traffic

    def _spawn_and_wait(self, spec: _RunSpec, timeout: float, launches: list[Launch]) -> int:
        pid = self.emulator._spawn(ctypes.byref(spec))
        if pid < 0:
            raise EmulatorError(f"emulator: cannot fork a child process: {os.strerror(-pid)}")
        try:
            if not _wait_exit(pid, timeout):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                current = int(np.frombuffer(self._shm, np.int32, 1, 4)[0])  # type: ignore[arg-type]
                name = launches[min(max(current, 0), len(launches) - 1)].kernel if launches else "?"
                raise EmulatorError(
                    f"kernel {name}: timed out after {timeout:g} s (hung kernel, a spin-wait "
                    "across blocks, or a too large launch for the emulator)"
                )
            _, status = os.waitpid(pid, 0)
        except BaseException:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            raise
        return status

    @staticmethod
    def _failure(view: np.ndarray, res_status: int, status: int, name: str) -> str:
        if res_status in (3, 4):
            raw = bytes(view[8:_RESULT_HEADER])
            return raw.split(b"\0", 1)[0].decode(errors="replace")
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            try:
                sname = signal.Signals(sig).name
            except ValueError:
                sname = str(sig)
            return f"kernel {name}: emulator process killed by {sname}"
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else status
        return f"kernel {name}: emulator process exited with status {code} before finishing"


def _wait_exit(pid: int, timeout: float) -> bool:
    """Wait until child ``pid`` exits (without reaping it); False on timeout."""
    deadline = time.monotonic() + timeout
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = -1
    try:
        if fd >= 0:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                ready, _, _ = select.select([fd], [], [], left)
                if ready:
                    return True
        delay = 1e-4
        while True:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
    finally:
        if fd >= 0:
            os.close(fd)


class Emulator:
    """Compiles CUDA translation units for the CPU and runs their kernels (see module docs).

    ``cache_dir`` holds compiled libraries (default ``$POLYFUSE_CACHE/emulator`` or
    ``~/.cache/polyfuse/emulator``; ``POLYFUSE_CACHE=off`` uses a temporary directory);
    ``workers`` is the number of OS threads blocks are spread over (default: CPU count).
    Raises :class:`CompilerNotFound` when no C++20 compiler is available.
    """

    def __init__(self, cache_dir: str | os.PathLike | None = None, workers: int | None = None):
        self.cache_dir = Path(cache_dir) if cache_dir is not None else _default_cache_dir()
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.workers = int(workers) if workers else (os.cpu_count() or 1)
        if self.workers < 1:
            raise CallError("workers must be at least 1")
        self.cxx = _find_compiler()
        self._cxx_id = _compiler_id(self.cxx)
        self._header = _HEADER.read_text()
        self._modules: dict[str, EmulatedModule] = {}
        self._lock = threading.Lock()
        rt = self._runtime()
        api = rt.pf_rt_api
        api.restype = ctypes.c_void_p
        self._rt_api = api()
        self._spawn = rt.pf_spawn
        self._spawn.restype = ctypes.c_int
        self._spawn.argtypes = [ctypes.c_void_p]

    def _runtime(self) -> ctypes.CDLL:
        src = _RUNTIME.read_text()
        key = _hash(
            "rt", str(_ABI_VERSION), self._cxx_id, " ".join(RUNTIME_FLAGS), self._header, src
        )
        out = self.cache_dir / f"rt-{key}.so"
        if not out.exists():
            _compile(self.cxx, RUNTIME_FLAGS, _RUNTIME, out, ["-I", str(_RT_DIR)])
        return _load_library(out)

    def load(self, source: str) -> EmulatedModule:
        """Compile (or take from the cache) the CUDA translation unit ``source``.

        Raises :class:`EmulatorError` if the pre-pass or the C++ compiler rejects it.
        """
        pre = prepass(source)
        key = _hash(
            "k", str(_ABI_VERSION), self._cxx_id, " ".join(KERNEL_FLAGS), self._header, pre.source
        )
        with self._lock:
            mod = self._modules.get(key)
            if mod is not None:
                return mod
            out = self.cache_dir / f"k-{key}.so"
            from_cache = out.exists()
            if not from_cache:
                cpp = self.cache_dir / f"k-{key}.cpp"
                cpp.write_text(pre.source)
                _compile(self.cxx, KERNEL_FLAGS, cpp, out, ["-include", str(_HEADER)])
            mod = EmulatedModule(self, _load_library(out), out, from_cache)
            self._modules[key] = mod
            return mod
