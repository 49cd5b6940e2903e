"""The emulator's pre-pass: CUDA text -> C++ text for ``pf_emu.h``, line numbers preserved.

See :mod:`polyfuse.cuda.emulator` for what is rewritten and why; :func:`prepass` also appends
one exported launch entry per kernel and the module descriptor the server loads."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from polyfuse.base.errors import EmulatorError

from .wire import ABI_VERSION

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
    (the initialiser may be an instrumented global pointer or a reference proxy). A pointer's
    declared type is kept as a ``static_assert`` (``pf_pointer_fits``): an initialiser of
    another pointee type, which NVRTC refuses, fails the emulator's build too."""
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
            if m.group("ref") == "*" and prev != "(":  # not in a for statement's init
                typ, name = " ".join(words), m.group("name")
                s.edit(semi + 1, semi + 1, f" static_assert(pf_pointer_fits<{typ}, decltype("
                       f"{name})>(), \"{typ}* {name}: its initialiser points to another type "
                       "(NVRTC refuses the conversion)\");")  # fmt: skip


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
    lines.append(f"  static const pf_module_desc m = {{{ABI_VERSION}, {len(kernels)}, ks}};")
    lines.append("  return &m;")
    lines.append("}")
    return "\n".join(lines) + "\n"
