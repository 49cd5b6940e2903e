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
   atomics and device math onto the runtime; the runtime (fibers, scheduler, workers:
   ``emulator_rt/pf_emu_rt.cpp``) is compiled separately, once, into a small server program, so a
   kernel library builds in well under a second. Both are cached on disk by a hash of their
   inputs, the flags and the compiler.
3. :meth:`EmulatedModule.run` writes the launches and buffers into a shared memfd and asks the
   server, which has loaded the library, to run them: it forks a child that executes the
   launches in order (each CUDA thread a fiber, blocks spread over worker threads) and exits.
   The parent waits with a timeout, copies results back and reads the per-launch traffic. A
   crash, bad access, divergent barrier or deadlock in a kernel becomes an
   :class:`EmulatorError` naming the kernel; the caller's process is unaffected. If the server
   itself dies (killed, out of memory), the call raises a one-line :class:`EmulatorError` and
   the next call starts a new server, which reloads the libraries.

Race check (``Emulator.load(source, racecheck=True)``, ``race_check="shadow"`` on a compiled
graph): a separate build of the library with GCC's ThreadSanitizer instrumentation
(``-fsanitize=thread``, linked without libtsan: ``pf_emu.h`` defines the ``__tsan_*`` hooks),
so every plain load and store reaches the runtime's shadow memory, like compute-sanitizer's
racecheck. Shared memory: per byte, the last writer and two readers with their barrier epoch
and ``__syncwarp`` epoch; a read of a byte another thread wrote, or a write of one another
thread read or wrote, with no ``__syncthreads`` (or, within a warp, ``__syncwarp``) between is a
race. Global memory: per element and launch, the last writer and reader; two threads of one
block conflict as in shared memory, two blocks always. Atomics never race. The first race
raises :class:`RaceError` with the kernel, the memory (``__shared__`` variable or buffer and
element), both threads and both source lines (``addr2line`` on the library's ``-g`` info).
Not seen: conflicts through raw pointers the pre-pass does not instrument (global memory
reached other than through kernel parameters), and a race hidden because an earlier
reader of the same byte was overwritten in the shadow (two readers are kept).

Semantics worth knowing: a ``__syncthreads`` completes when every thread of the block waits at
the same source line; threads waiting at different lines, or some threads having exited while
others wait, is reported as divergence (stricter than some hardware tolerates). Warp operations
complete when every live lane of their mask has arrived; exited lanes leave the mask.
``__activemask()`` returns the lanes that reach the same call site together. ``cp.async``
copies capture their source at issue, poison the destination (0xFF) and land at the
``__pipeline_wait_prior`` that covers their group. Static shared memory overflow is not
checked; dynamic shared memory ends at a guard page.

Unsupported source constructs (they fail to compile or are reported): template kernels and
kernels in namespaces, ``__global__``/``__shared__``/``__device__`` hidden in function-like
macros, local pointers declared without an initialiser and later assigned a global pointer,
pointer-returning ``__device__`` functions taking global pointers, member access through a
global pointer to a struct/vector type (``p[i].x``; load the element first), C-style casts of
global pointers (use ``reinterpret_cast``), pointer-to-pointer kernel parameters, ``__half`` and
other fp16/bf16 types, cooperative groups, ``cuda::pipeline``/``cuda::barrier``, inline PTX,
dynamic parallelism, texture/surface objects, ``__constant__`` symbols set from the host,
spin-waits on other blocks (blocks run to completion one after another per worker).
``auto v = p[i];`` binds a lazy reference to global memory rather than a value.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import mmap
import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from polyfuse.errors import CallError, CompilerNotFound, EmulatorError, RaceError
from polyfuse.settings import cache_root
from polyfuse.store import Store, write_atomic

from .launch import Launch, LaunchTraffic, marshal

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
    "-fstack-clash-protection",
    "-w",
)
SERVER_FLAGS = ("-O2", "-std=c++20", "-pthread")
#: Flags of a race-check kernel library (compiled to an object, then linked without libtsan):
#: GCC's ThreadSanitizer instrumentation calls the hooks pf_emu.h defines under PF_RACECHECK,
#: and -g lets a race report name source lines.
RACECHECK_FLAGS = (
    *(f for f in KERNEL_FLAGS if f != "-shared"),
    "-c",
    "-g",
    "-fsanitize=thread",
    "--param=tsan-instrument-func-entry-exit=0",
    "-DPF_RACECHECK",
)


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


def _expand_keyword_macros(src: str) -> str:
    """Expand object-like macros hiding ``__global__``, ``__shared__`` or ``__device__``."""
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
    """Start of the declaration/statement containing ``pos`` (after its leading blanks)."""
    k = max(mask.rfind(";", 0, pos), mask.rfind("{", 0, pos), mask.rfind("}", 0, pos)) + 1
    while k < pos and mask[k].isspace():
        k += 1
    return k


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


class _Source:
    """The text being rewritten, its mask (code only) and brace depths; collects edits."""

    def __init__(self, src: str):
        self.src = src
        self.mask = _mask(src)
        codes = np.frombuffer(self.mask.encode("utf-32-le"), dtype=np.uint32)
        self.depth = np.cumsum((codes == ord("{")).astype(np.int32) - (codes == ord("}")))
        self.edits: list[_Edit] = []
        self.pointer_names: set[str] = set()  # names that may hold instrumented pointers

    def line(self, pos: int) -> int:
        return self.src.count("\n", 0, pos) + 1

    def depth_at(self, pos: int) -> int:
        return int(self.depth[pos - 1]) if pos > 0 else 0

    def edit(self, start: int, end: int, text: str) -> None:
        self.edits.append(_Edit(start, end, text))

    def edited(self, pos: int) -> bool:
        return any(e.start <= pos < e.end for e in self.edits)

    def error(self, what: str, pos: int) -> EmulatorError:
        return EmulatorError(f"emulator: {what} (line {self.line(pos)})")

    def result(self) -> str:
        out, pos = [], 0
        for e in sorted(self.edits, key=lambda e: e.start):
            if e.start < pos:
                raise EmulatorError("emulator pre-pass: overlapping rewrites (please report)")
            out += [self.src[pos : e.start], e.text]
            pos = e.end
        out.append(self.src[pos:])
        return "".join(out)

    def rewrite_params(self, lo: int, hi: int, kernel: bool) -> bool:
        """Rewrite the pointer parameters in ``[lo, hi)``; True if there was one."""
        changed = False
        for a, b in _split_top(self.mask, lo, hi):
            seg = self.src[a:b]
            pp = _pointer_param(self.mask[a:b]) if seg.strip() else None
            if pp is None:
                continue
            typ, name = pp
            self.pointer_names.add(name)
            lead = seg[: len(seg) - len(seg.lstrip())]
            trail = seg[len(seg.rstrip()) :]
            new = f"pf_gptr<{typ}> {name}" if kernel else f"auto {name}"
            self.edit(a, b, lead + new.rstrip() + "\n" * seg.strip().count("\n") + trail)
            changed = True
        return changed

    def function_after(self, pos: int) -> tuple[str, int, int] | None:
        """``(name, params start, params end)`` of the function declared after ``pos``."""
        stop = re.compile(r"[;={(]")
        while True:
            s = stop.search(self.mask, pos)
            if s is None or self.mask[s.start()] != "(":
                return None
            c = _CALL.search(self.mask, pos)
            if c is None or c.end() - 1 != s.start():
                return None
            close = _match_close(self.mask, s.start())
            if c.group(1) not in _ATTRIBUTE_LIKE:
                return c.group(1), s.start() + 1, close
            pos = close + 1


@dataclass(frozen=True)
class _Prepassed:
    source: str
    kernels: tuple[str, ...]
    #: ``(name, element type)`` of each static ``__shared__`` variable, by site number, then
    #: of each ``extern __shared__`` (dynamic) one.
    shared: tuple[tuple[str, str], ...] = ()
    dynamic: tuple[tuple[str, str], ...] = ()


def prepass(source: str) -> _Prepassed:
    """Rewrite CUDA source into C++ for the emulator header; returns the text and kernel names.

    Line numbers are kept (error messages and ``__syncthreads`` lines refer to the CUDA
    source). Raises :class:`EmulatorError` for constructs the emulator cannot handle.
    """
    src = _CUDA_INCLUDE.sub(lambda m: "", source)
    s = _Source(_expand_keyword_macros(src))
    kernels = _rewrite_kernels(s)
    if not kernels:
        raise EmulatorError("emulator: the source defines no __global__ kernel")
    _rewrite_device_functions(s)
    shared, dynamic = _rewrite_shared(s)
    _rewrite_local_pointers(s)
    _rewrite_sizeof(s)
    for m in re.finditer(r"\breinterpret_cast\s*<", s.mask):
        if not s.edited(m.start()):
            s.edit(m.start(), m.start() + len("reinterpret_cast"), "pf_reinterpret_cast")
    return _Prepassed(
        s.result() + _registration(kernels), tuple(kernels), tuple(shared), tuple(dynamic)
    )


def _rewrite_kernels(s: _Source) -> list[str]:
    """Step 1: the pointer parameters of ``__global__`` functions become ``pf_gptr<T>``."""
    kernels: list[str] = []
    for m in re.finditer(r"\b__global__\b", s.mask):
        if re.search(r"\btemplate\b", s.mask[_statement_start(s.mask, m.start()) : m.start()]):
            raise s.error("template kernels are not supported", m.start())
        fn = s.function_after(m.end())
        if fn is None:
            raise s.error("cannot parse the __global__ declaration", m.start())
        name, lo, hi = fn
        s.rewrite_params(lo, hi, kernel=True)
        if s.mask[hi + 1 :].lstrip()[:1] == "{" and name not in kernels:
            kernels.append(name)
    return kernels


def _rewrite_device_functions(s: _Source) -> None:
    """Step 2: pointer parameters of ``__device__`` functions become ``auto`` (templates), so
    they accept instrumented global pointers and raw shared/local pointers alike."""
    for m in re.finditer(r"\b__device__\b", s.mask):
        fn = s.function_after(m.end())
        if fn is None or not s.rewrite_params(fn[1], fn[2], kernel=False):
            continue
        st = _statement_start(s.mask, m.start())
        ext = re.search(r"\bextern\s+\"C\"", s.src[st : m.start()])
        if ext:  # a template cannot have C linkage
            s.edit(st + ext.start(), st + ext.end(), " " * len(ext.group(0)))


def _shared_declarators(s: _Source, pos: int, end: int, pre: str) -> tuple[str, list, int]:
    """Base type, ``(stars, name, dims)`` declarators and alignment of a __shared__ decl."""
    decl = s.mask[pos:end]
    align = 16
    for a in _SHARED_ALIGN.finditer(pre + " " + decl):
        align = max(align, int(next(g for g in a.groups() if g)))
    pre, decl = _SHARED_ALIGN.sub(" ", pre), _SHARED_ALIGN.sub(" ", decl)
    parts = [decl[a:b] for a, b in _split_top(decl, 0, len(decl))]
    first = re.fullmatch(r"\s*(.*?)\b([A-Za-z_]\w*)\s*((?:\[[^\]]*\]\s*)*)", parts[0], re.S)
    if first is None:
        raise s.error("cannot parse the __shared__ declaration", pos)
    base = " ".join((pre + " " + first.group(1)).split()).rstrip("*& ")
    out = [(first.group(1).count("*"), first.group(2), first.group(3).strip())]
    for p in parts[1:]:
        d = re.fullmatch(r"\s*(\**)\s*([A-Za-z_]\w*)\s*((?:\[[^\]]*\]\s*)*)", p)
        if d is None:
            raise s.error("cannot parse the __shared__ declaration", pos)
        out.append((len(d.group(1)), d.group(2), d.group(3).strip()))
    return base, out, align


def _rewrite_shared(s: _Source) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Step 3: ``__shared__`` declarations become per-block arena slots.

    ``__shared__ T a[N][M];`` in a function becomes a reference to slot ``k`` of the block's
    arena, allocated (and filled with 0xFF) by the first thread that executes the declaration;
    ``extern __shared__ T d[];`` points at the launch's dynamic shared memory. At file scope
    the name becomes a macro for the same expression. Returns ``(name, type)`` per site and
    per dynamic declaration.
    """
    site = 0
    sites: list[tuple[str, str]] = []
    dynamic_decls: list[tuple[str, str]] = []
    for m in re.finditer(r"\b__shared__\b", s.mask):
        st = _statement_start(s.mask, m.start())
        end = s.mask.find(";", m.end())
        if end < 0:
            raise s.error("unterminated __shared__ declaration", m.start())
        pre = s.mask[st : m.start()]
        dynamic = bool(re.search(r"\bextern\b", pre))
        pre = re.sub(r"\b(?:extern|static)\b", " ", pre)
        base, declarators, align = _shared_declarators(s, m.end(), end, pre)
        file_scope = s.depth_at(st) == 0
        out = []
        for stars, name, dims in declarators:
            typ = base + "*" * stars
            if dynamic:
                expr = f"(pf_dyn_shared<{typ}>())"
                decl = f"{typ}* const {name} = {expr};"
                dynamic_decls.append((name, typ))
            else:
                full = f"{typ} {dims}" if dims else typ
                ptr = f"{typ} (*){dims}" if dims else f"{typ}*"
                a = f"({align} > alignof({full}) ? {align} : alignof({full}))"
                expr = f"(*({ptr})pf_shared({site}, sizeof({full}), {a}))"
                decl = f"auto& {name} = {expr};"
                sites.append((name, typ))
                site += 1
            out.append(f"\n#define {name} {expr}\n" if file_scope else decl)
        if file_scope:
            s.edit(st, end + 1, "".join(out) + f"#line {s.line(end)}\n")
        else:
            s.edit(st, end + 1, " ".join(out) + "\n" * s.src.count("\n", st, end))
    if site > 512:
        raise EmulatorError("emulator: more than 512 __shared__ declarations in one source")
    return sites, dynamic_decls


def _rewrite_local_pointers(s: _Source) -> None:
    """Step 4: initialised local ``T* p = ...;`` / ``T& r = ...;`` become ``auto``/``auto&&``
    (the initialiser may be an instrumented global pointer or a reference proxy)."""
    mask = s.mask
    for m in _LOCAL_PTR_DECL.finditer(mask):
        words = m.group("type").split()
        if s.depth_at(m.start()) == 0 or words[0] in _NOT_TYPES or words[-1] in _NOT_TYPES:
            continue
        k = m.start() - 1
        while k >= 0 and mask[k].isspace():
            k -= 1
        prev = mask[k] if k >= 0 else ";"
        if prev not in ";{}" and not (prev == "(" and re.search(r"\bfor\s*$", mask[:k])):
            continue
        semi = mask.find(";", m.end())
        if semi < 0 or mask[m.end() : semi].strip() in ("nullptr", "NULL", "0"):
            continue
        init = mask[m.end() : semi]
        if len(_split_top(mask, m.end(), semi)) > 1 or init.count(")") > init.count("("):
            continue  # several declarators, or not a declaration statement
        if not s.edited(m.start()):
            s.edit(m.start(), m.start("name"), "auto&& " if m.group("ref") == "&" else "auto ")
            s.pointer_names.add(m.group("name"))


def _rewrite_sizeof(s: _Source) -> None:
    """Step 5: ``sizeof(*p)`` / ``sizeof(p[i])`` / ``sizeof *p`` of a (possibly) instrumented
    pointer measure the element, not the reference proxy."""

    def wanted(expr: str) -> bool:
        head = re.match(r"\*|([A-Za-z_]\w*)\s*\[", expr.strip())
        return bool(head) and (head.group(1) is None or head.group(1) in s.pointer_names)

    for m in re.finditer(r"\bsizeof\s*\(", s.mask):
        close = _match_close(s.mask, m.end() - 1)
        if wanted(s.mask[m.end() : close]) and not s.edited(m.start()):
            s.edit(m.end(), close, f"pf_value_t<decltype({s.src[m.end() : close]})>")
    unparenthesised = r"\bsizeof\s+(\*\s*[A-Za-z_]\w*|[A-Za-z_]\w*\s*\[[^\]\[;]*\])"
    for m in re.finditer(unparenthesised, s.mask):
        if wanted(m.group(1)) and not s.edited(m.start()):
            s.edit(m.start(), m.end(), f"sizeof(pf_value_t<decltype({m.group(1)})>)")


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


@functools.lru_cache(maxsize=1)
def _process_temp_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="polyfuse-emulator-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _default_cache_dir() -> Path:
    root = cache_root()
    if root is None:  # one temporary directory for this process
        return _process_temp_dir()
    return root / "emulator"


def _hash(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:24]


def _compile(
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


def _cached_build(directory: Path, name: str, build: Callable[[Path], None]) -> tuple[Path, bool]:
    """``(path, from_cache)`` of the library ``name``, built by ``build(path)`` unless the
    cache holds a copy that matches its checksum (a corrupt or half-written one is rebuilt);
    one process builds a name at a time (see :mod:`polyfuse.store`)."""
    store = Store(directory, "emulator", _ABI_VERSION, fan_out=False)
    if (hit := store.read_artifact(name)) is not None:
        return hit, True
    with store.lock(name):
        if (hit := store.read_artifact(name)) is not None:  # another process built it
            return hit, True
        build(store.path(name))
        return store.commit_artifact(name), False


# --------------------------------------------------------------------------------------------
# The server process and the wire format (mirrors pf_emu_rt.cpp)
# --------------------------------------------------------------------------------------------

_MSG = struct.Struct("<IIqq")
_MSG_LOAD, _MSG_MAP, _MSG_RUN, _MSG_DONE = 1, 2, 3, 4
_SPEC = np.dtype(
    [
        ("abi", "<u4"),
        ("nbuf", "<u4"),
        ("nlaunch", "<u4"),
        ("order", "<u4"),
        ("seed", "<u8"),
        ("workers", "<u4"),
        ("module", "<u4"),
        ("bufs_off", "<u8"),
        ("launches_off", "<u8"),
        ("result_off", "<u8"),
    ]
)
_BUF = np.dtype(
    [
        ("data_off", "<u8"),
        ("nbytes", "<u8"),
        ("itemsize", "<u4"),
        ("pad", "<u4"),
        ("name_off", "<u8"),
    ]
)
_LAUNCH = np.dtype(
    [
        ("kernel", "<u4"),
        ("nargs", "<u4"),
        ("grid", "<u4", 3),
        ("block", "<u4", 3),
        ("shared", "<u4"),
        ("pad", "<u4"),
        ("args_off", "<u8"),
    ]
)
_ARG = np.dtype([("buf", "<i4"), ("pad", "<u4"), ("value", "<u8")])
assert (_SPEC.itemsize, _BUF.itemsize, _LAUNCH.itemsize, _ARG.itemsize) == (56, 32, 48, 16)


def _align(n: int, a: int = 64) -> int:
    return (n + a - 1) // a * a


class _ServerDied(Exception):
    """The server's socket closed or failed (internal: turned into EmulatorError by _guard)."""


class _Server:
    """One emulator server process: loads kernel libraries, forks a child per run.

    Shared by every :class:`Emulator` of this process that uses the same server executable;
    ``lock`` serialises its use (one run at a time, in the shared region).
    """

    def __init__(self, exe: Path):
        self.exe = exe
        self.lock = threading.RLock()
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.libraries: list[Path] = []  # loaded, in module-id order
        self.loaded: dict[Path, tuple[int, str]] = {}
        self.shm: mmap.mmap | None = None
        self.shm_view: np.ndarray | None = None
        self.shm_fd = -1

    # ---- process management
    @contextlib.contextmanager
    def _guard(self, doing: str):
        """Turn a dead server into a one-line :class:`EmulatorError`; the next call restarts it."""
        try:
            yield
        except _ServerDied:
            proc = self.proc
            how = "stopped answering"
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=2.0)
                code = proc.returncode
                if code is not None and code < 0:
                    try:
                        how = f"was killed by {signal.Signals(-code).name}"
                    except ValueError:
                        how = f"was killed by signal {-code}"
                elif code is not None:
                    how = f"exited with status {code}"
            pid = f" (pid {proc.pid})" if proc is not None else ""
            self.stop()
            raise EmulatorError(
                f"emulator: the emulator server process{pid} {how} while {doing}; the next call "
                "starts a new one (if it keeps dying, check memory limits and stderr)"
            ) from None

    def _start(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [str(self.exe), str(child.fileno())],
                pass_fds=[child.fileno()],
                stdin=subprocess.DEVNULL,
            )
        finally:
            child.close()
        self.sock = parent
        for path in self.libraries:
            self._load(path)
        if self.shm is not None:
            self._map()

    def ensure(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.stop()
            with self._guard("starting (reloading its kernel libraries)"):
                self._start()

    def stop(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None

    def close(self) -> None:
        self.stop()
        self.shm_view = None
        self.shm = None
        if self.shm_fd >= 0:
            os.close(self.shm_fd)
            self.shm_fd = -1

    # ---- messages
    def _send(self, kind: int, a: int = 0, b: int = 0, text: bytes = b"", fds=()) -> None:
        assert self.sock is not None
        msg = _MSG.pack(kind, 0, a, b) + text
        try:
            if fds:
                socket.send_fds(self.sock, [msg], list(fds))
            else:
                self.sock.sendall(msg)
        except OSError as e:
            raise _ServerDied(str(e)) from e

    def _recv(self, timeout: float | None = None) -> tuple[int, int, int, bytes] | None:
        assert self.sock is not None
        if timeout is not None:
            ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
            if not ready:
                return None
        try:
            data = self.sock.recv(1 << 20)
        except OSError as e:
            raise _ServerDied(str(e)) from e
        if len(data) < _MSG.size:
            raise _ServerDied("the emulator server exited")
        kind, _, a, b = _MSG.unpack_from(data)
        return kind, a, b, data[_MSG.size :]

    def _load(self, path: Path) -> tuple[int, str]:
        self._send(_MSG_LOAD, text=str(path).encode())
        reply = self._recv()
        assert reply is not None
        _, a, _, text = reply
        if a < 0:
            raise EmulatorError(
                f"emulator: cannot load {path.name}: {text.decode(errors='replace')}"
            )
        return a, text.decode()

    def load(self, path: Path) -> tuple[int, str]:
        """Load a kernel library; returns its module id and "name signature" lines."""
        with self.lock:
            if path in self.loaded:
                return self.loaded[path]
            self.ensure()
            try:
                mid, text = self._load(path)
            except _ServerDied:
                self.stop()
                self.ensure()
                with self._guard(f"loading {path.name}"):
                    mid, text = self._load(path)
            self.libraries.append(path)
            self.loaded[path] = (mid, text)
            return mid, text

    def _map(self) -> None:
        assert self.shm is not None
        self._send(_MSG_MAP, len(self.shm), fds=[self.shm_fd])
        reply = self._recv()
        if reply is None or reply[1] != 0:
            raise EmulatorError("emulator: the server cannot map the shared region")

    def region(self, size: int) -> np.ndarray:
        """The shared region (at least ``size`` bytes), mapped by the server too."""
        if self.shm is None or len(self.shm) < size:
            cap = max(1 << 20, 1 << (size - 1).bit_length())
            # Views of the old mapping may still be alive (e.g. in a traceback): let it be
            # unmapped when they go, rather than closing it here.
            self.shm_view = None
            self.shm = None
            if self.shm_fd >= 0:
                os.close(self.shm_fd)
            self.shm_fd = os.memfd_create("polyfuse-emulator", os.MFD_CLOEXEC)
            os.ftruncate(self.shm_fd, cap)
            self.shm = mmap.mmap(self.shm_fd, cap)
            self.shm_view = np.frombuffer(self.shm, dtype=np.uint8)
            self.ensure()
            with self._guard("mapping the shared region"):
                self._map()
        return self.shm_view

    def run(self, spec_off: int, timeout: float, what: str = "kernels") -> tuple[int, bool]:
        """Run the specification at ``spec_off``; returns (wait status, timed out)."""
        self.ensure()
        with self._guard(f"running {what}"):
            return self._run(spec_off, timeout)

    def _run(self, spec_off: int, timeout: float) -> tuple[int, bool]:
        self._send(_MSG_RUN, spec_off)
        reply = self._recv()
        assert reply is not None
        pid = reply[1]
        if pid < 0:
            raise EmulatorError(f"emulator: cannot fork a run: {os.strerror(-pid)}")
        timed_out = False
        try:
            done = self._recv(timeout)
            if done is None:
                timed_out = True
                os.kill(pid, signal.SIGKILL)
                done = self._recv(30.0)
                if done is None:
                    raise _ServerDied("no answer after killing a hung run")
        except BaseException as e:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            if not isinstance(e, _ServerDied):
                self.stop()  # its answer is pending or lost: start afresh next time
            raise
        return done[1], timed_out


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

    def __init__(
        self,
        emulator: Emulator,
        path: Path,
        from_cache: bool,
        module: int,
        text: str,
        racecheck: bool = False,
        shared: tuple[Sequence[tuple[str, str]], Sequence[tuple[str, str]]] = ((), ()),
    ):
        self.emulator = emulator
        #: The compiled library.
        self.path = path
        #: True when the library came from the disk cache (no compiler ran).
        self.from_cache = from_cache
        #: True for a race-check build: every run also checks for data races (RaceError).
        self.racecheck = racecheck
        #: (name, type) of the static __shared__ sites and of the extern __shared__ arrays.
        self._shared, self._dynamic = tuple(shared[0]), tuple(shared[1])
        self._module = module
        self._kernels: dict[str, tuple[int, KernelSignature]] = {}
        for i, line in enumerate(text.splitlines()):
            name, _, sig = line.partition(" ")
            self._kernels[name] = (i, KernelSignature.parse(sig))

    @property
    def kernel_names(self) -> list[str]:
        """Names of the ``__global__`` kernels defined by the source, in source order."""
        return list(self._kernels)

    def signature(self, kernel: str) -> KernelSignature:
        """The parameter signature of ``kernel``."""
        return self._kernels[kernel][1]

    def _check(self, launch: Launch, values: list) -> int:
        if launch.entry not in self._kernels:
            raise CallError(
                f"kernel {launch.entry}: not defined by this source (it has "
                f"{', '.join(self._kernels) or 'no kernels'})"
            )
        index, sig = self._kernels[launch.entry]
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
        return index

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
        lists, for every buffer argument, the unique elements read and written × item size, and
        the bytes requested (every load and store, repeats included).
        A race-check module (``Emulator.load(..., racecheck=True)``) raises :class:`RaceError`
        at the first pair of conflicting accesses (see :func:`_race_message`).
        """
        if order not in _ORDERS:
            raise CallError(f"order must be one of {', '.join(_ORDERS)}, not {order!r}")
        launches = list(launches)
        if not launches:
            return []
        names: dict[str, int] = {}
        plan = []
        for launch in launches:
            values = marshal(launch, buffers)
            index = self._check(launch, values)
            for a in launch.args:
                if isinstance(a, str) and a not in names:
                    names[a] = len(names)
            plan.append((index, launch, values))
        arrays = [buffers[n] for n in names]
        nb, nl = len(arrays), len(launches)
        nargs = sum(len(lc.args) for lc in launches)
        name_bytes = [n.encode() + b"\0" for n in names]
        # Layout: spec | buffer table | launch table | arguments | names | result | data.
        bufs_off = _align(_SPEC.itemsize)
        launches_off = _align(bufs_off + _BUF.itemsize * nb)
        args_off = _align(launches_off + _LAUNCH.itemsize * nl)
        names_off = _align(args_off + _ARG.itemsize * nargs)
        result_off = _align(names_off + sum(map(len, name_bytes)))
        counts_off = result_off + _RESULT_HEADER
        pos = _align(counts_off + 32 * nl * nb)
        data_offs = []
        for a in arrays:
            data_offs.append(pos)
            pos = _align(pos + a.nbytes)
        emu = self.emulator
        with emu._server.lock:
            view = emu._server.region(pos)
            spec = view[: _SPEC.itemsize].view(_SPEC)[0]
            spec["abi"], spec["nbuf"], spec["nlaunch"] = _ABI_VERSION, nb, nl
            spec["order"], spec["seed"] = _ORDERS[order], seed & (2**64 - 1)
            spec["workers"], spec["module"] = emu.workers, self._module
            spec["bufs_off"], spec["launches_off"], spec["result_off"] = (
                bufs_off,
                launches_off,
                result_off,
            )
            btab = view[bufs_off : bufs_off + _BUF.itemsize * nb].view(_BUF)
            npos = names_off
            for i, (a, nm, off) in enumerate(zip(arrays, name_bytes, data_offs, strict=True)):
                btab[i] = (off, a.nbytes, a.itemsize, 0, npos)
                view[npos : npos + len(nm)] = np.frombuffer(nm, np.uint8)
                npos += len(nm)
                view[off : off + a.nbytes] = a.reshape(-1).view(np.uint8)
            ltab = view[launches_off : launches_off + _LAUNCH.itemsize * nl].view(_LAUNCH)
            atab = view[args_off : args_off + _ARG.itemsize * nargs].view(_ARG)
            k = 0
            for i, (index, launch, values) in enumerate(plan):
                n = len(values)
                ltab[i] = (
                    index,
                    n,
                    launch.grid,
                    launch.block,
                    launch.shared_bytes,
                    0,
                    args_off + 16 * k,
                )
                for arg, v in zip(launch.args, values, strict=True):
                    if isinstance(arg, str):
                        atab[k] = (names[arg], 0, 0)
                    else:
                        atab[k] = (-1, 0, int.from_bytes(v.tobytes().ljust(8, b"\0"), "little"))
                    k += 1
            view[result_off:counts_off] = 0
            counts = view[counts_off : counts_off + 32 * nl * nb].view(np.int64)
            counts[:] = -1
            kernels = list(dict.fromkeys(lc.kernel for lc in launches))
            what = f"kernel{'s' if len(kernels) > 1 else ''} {', '.join(kernels[:4])}" + (
                ", ..." if len(kernels) > 4 else ""
            )
            status, timed_out = emu._server.run(0, timeout, what)
            res = view[result_off:counts_off]
            res_status, current = (int(x) for x in res[:8].view(np.int32))
            if res_status == 5:
                raise self._race(
                    bytes(res[8:]),
                    [(n, a.itemsize) for n, a in zip(names, arrays, strict=True)],
                    launches[current] if 0 <= current < nl else None,
                )
            if timed_out or res_status != 1 or status != 0:
                name = launches[min(max(current, 0), nl - 1)].kernel if launches else "?"
                if timed_out:
                    raise EmulatorError(
                        f"kernel {name}: timed out after {timeout:g} s (a hung kernel, a "
                        "spin-wait across blocks, or a launch too large for the emulator)"
                    )
                raise EmulatorError(_failure(res, res_status, status, name))
            traffic = []
            written = [False] * nb
            c = counts.reshape(nl, max(1, nb), 4) if nb else None
            for i, launch in enumerate(launches):
                t = LaunchTraffic(launch.kernel)
                for a in launch.args:
                    if isinstance(a, str) and a not in t.reads:
                        assert c is not None
                        r, w, rq, wq = (max(0, int(x)) for x in c[i, names[a]])
                        t.reads[a], t.writes[a] = r, w
                        t.requested_reads[a], t.requested_writes[a] = rq, wq
                        written[names[a]] |= w > 0
                traffic.append(t)
            for a, off, w in zip(arrays, data_offs, written, strict=True):
                if w:
                    a.reshape(-1).view(np.uint8)[:] = view[off : off + a.nbytes]
            return traffic

    def _race(
        self, raw: bytes, buffers: list[tuple[str, int]], launch: Launch | None = None
    ) -> RaceError:
        """The :class:`RaceError` for the pf_race_report ``raw`` (see pf_emu.h); named after
        the racing ``launch``'s kernel when it runs a shared function."""
        kind, space, index, size, offset = struct.unpack_from("<iiiIQ", raw)
        first = struct.unpack_from("<6I", raw, 24)
        second = struct.unpack_from("<6I", raw, 48)
        pcs = struct.unpack_from("<2Q", raw, 72)
        kernel = raw[88 : 88 + 256].split(b"\0", 1)[0].decode(errors="replace")
        if launch is not None and launch.entry == kernel:
            kernel = launch.kernel
        lines = _source_lines(self.path, pcs)
        kinds = ("read-after-write", "write-after-read", "write-after-write")
        if space == 0:
            if index >= 0 and index < len(self._shared):
                memory, typ = self._shared[index]
                item = _CTYPE_SIZES.get(" ".join(typ.replace("const", "").split()), 0)
            elif index == -1 and len(set(self._dynamic)) == 1:  # one extern __shared__ array
                memory, typ = self._dynamic[0]
                item = _CTYPE_SIZES.get(" ".join(typ.replace("const", "").split()), 0)
            else:
                memory, item = ("dynamic shared memory" if index == -1 else "shared memory"), 0
        else:
            memory, item = buffers[index] if 0 <= index < len(buffers) else (f"#{index}", 0)
        element = offset // item if item else None
        err = RaceError(
            _race_message(kernel, kinds[kind], space, memory, element, offset, first, second, lines)
        )
        err.kernel, err.kind = kernel, kinds[kind]
        err.space, err.memory, err.element = ("shared", "global")[space], memory, element
        err.threads = tuple((tuple(t[:3]), tuple(t[3:])) for t in (first, second))
        err.lines = lines
        return err


_CTYPE_SIZES = {
    "float": 4, "int": 4, "unsigned": 4, "unsigned int": 4, "double": 8, "long long": 8,
    "unsigned long long": 8, "char": 1, "unsigned char": 1, "bool": 1, "short": 2,
    "float2": 8, "float4": 16, "int2": 8, "int4": 16,
}  # fmt: skip


def _race_message(
    kernel: str,
    kind: str,
    space: int,
    memory: str,
    element: int | None,
    offset: int,
    first: Sequence[int],
    second: Sequence[int],
    lines: tuple[int | None, int | None],
) -> str:
    """One line: the kernel, what raced, where, the two threads and their source lines."""
    where = f"element {element}" if element is not None else f"byte offset {offset}"
    what = (
        f"__shared__ '{memory}' {where}" if space == 0 and not memory.endswith("memory")
        else f"{memory} {where}" if space == 0 else f"global buffer '{memory}' {where}"
    )  # fmt: skip
    verbs = {
        "read-after-write": ("wrote", "reads"),
        "write-after-read": ("read", "writes"),
        "write-after-write": ("wrote", "writes"),
    }[kind]

    def who(t: Sequence[int], verb: str, line: int | None) -> str:
        at = f"line {line}" if line else "an unknown line"
        return f"thread ({t[0]},{t[1]},{t[2]}) of block ({t[3]},{t[4]},{t[5]}) {verb} it at {at}"

    if tuple(first[3:]) == tuple(second[3:]):
        fix = "with no __syncthreads() between (add one, or give each thread its own element)"
    else:
        fix = "in the same launch (blocks are not ordered: split the kernel or use atomics)"
    return (
        f"kernel {kernel}: {kind} race on {what}: {who(first, verbs[0], lines[0])}, "
        f"{who(second, verbs[1], lines[1])} {fix}"
    )


def _source_lines(library: Path, pcs: Sequence[int]) -> tuple[int | None, int | None]:
    """Source lines of two code addresses of a race-check library (addr2line on its -g info):
    for each, the innermost inlined frame that lies in the kernel source, not the header."""
    out: list[int | None] = [None, None]
    tool = shutil.which("addr2line")
    if tool is None or not any(pcs):
        return out[0], out[1]
    try:
        proc = subprocess.run(
            [tool, "-i", "-a", "-e", str(library), *(hex(p) for p in pcs)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return out[0], out[1]
    k = -1
    for line in proc.stdout.splitlines():
        if line.startswith("0x"):
            k += 1
            continue
        file, _, num = line.rpartition(":")
        num = num.split()[0] if num else ""
        # The kernel source is the one .cpp file (the header and system headers are not).
        if 0 <= k < 2 and out[k] is None and Path(file).suffix == ".cpp" and num.isdigit():
            out[k] = int(num)
    return out[0], out[1]


_SERVERS: dict[Path, _Server] = {}
_SERVERS_LOCK = threading.Lock()


def _server_for(exe: Path) -> _Server:
    with _SERVERS_LOCK:
        server = _SERVERS.get(exe)
        if server is None:
            server = _SERVERS[exe] = _Server(exe)
        return server


@atexit.register
def _stop_servers() -> None:
    for server in list(_SERVERS.values()):
        with contextlib.suppress(Exception):
            server.close()


def _failure(res: np.ndarray, res_status: int, status: int, name: str) -> str:
    if res_status in (3, 4):
        return bytes(res[8:]).split(b"\0", 1)[0].decode(errors="replace")
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            sname = signal.Signals(sig).name
        except ValueError:
            sname = str(sig)
        return f"kernel {name}: the emulator's run process was killed by {sname}"
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else status
    return f"kernel {name}: the emulator's run process exited with status {code} before finishing"


class Emulator:
    """Compiles CUDA translation units for the CPU and runs their kernels (see module docs).

    ``cache_dir`` holds compiled libraries (default ``$POLYFUSE_CACHE/emulator`` or
    ``~/.cache/polyfuse/emulator``; ``POLYFUSE_CACHE=off`` uses a temporary directory);
    ``workers`` is the number of OS threads blocks are spread over (default: CPU count).
    Raises :class:`CompilerNotFound` when no C++20 compiler is available. Kernels run in a
    small server process (one per server executable, shared by the emulators of this process,
    started on first use and stopped at exit).
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
        self._lock = threading.RLock()
        self._server = _server_for(self._build_server())

    def _build_server(self) -> Path:
        src = _RUNTIME.read_text()
        key = _hash(
            "server", str(_ABI_VERSION), self._cxx_id, " ".join(SERVER_FLAGS), self._header, src
        )
        return _cached_build(
            self.cache_dir,
            f"server-{key}",
            lambda out: _compile(
                self.cxx, SERVER_FLAGS, _RUNTIME, out, ["-I", str(_RT_DIR), "-ldl"]
            ),
        )[0]

    def load(self, source: str, racecheck: bool = False) -> EmulatedModule:
        """Compile (or take from the cache) the CUDA translation unit ``source``.

        ``racecheck`` builds the race-check variant (a separate library, slower to build and
        run): its runs also track every plain shared- and global-memory access in shadow memory
        and raise :class:`RaceError` at the first data race. Raises :class:`EmulatorError` if
        the pre-pass or the C++ compiler rejects the source.
        """
        pre = prepass(source)
        flags = RACECHECK_FLAGS if racecheck else KERNEL_FLAGS
        key = _hash("k", str(_ABI_VERSION), self._cxx_id, " ".join(flags), self._header, pre.source)
        with self._lock:
            mod = self._modules.get(key)
            if mod is not None:
                return mod

            def build(out: Path) -> None:
                cpp = out.with_suffix(".cpp")
                write_atomic(cpp, pre.source.encode())
                if racecheck:  # compile, then link without libtsan (pf_emu.h has the hooks)
                    obj = out.with_suffix(".o")
                    _compile(self.cxx, RACECHECK_FLAGS, cpp, obj, ["-include", str(_HEADER)])
                    _compile(self.cxx, ("-shared",), obj, out)
                    obj.unlink(missing_ok=True)
                else:
                    _compile(self.cxx, KERNEL_FLAGS, cpp, out, ["-include", str(_HEADER)])

            out, from_cache = _cached_build(self.cache_dir, f"k-{key}.so", build)
            module, text = self._server.load(out)
            shared = (pre.shared, pre.dynamic)
            mod = EmulatedModule(self, out, from_cache, module, text, racecheck, shared)
            self._modules[key] = mod
            return mod

    def close(self) -> None:
        """Stop the server process (it restarts, reloading its libraries, when next used)."""
        with self._server.lock:
            self._server.close()
