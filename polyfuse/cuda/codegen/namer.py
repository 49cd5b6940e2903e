"""One namer for every identifier a kernel declares: tensors' C names and the names derived
from them, in two spaces that cannot meet.

**User space.** A tensor's C name is its graph identifier (:attr:`polyfuse.graph.graph.Graph.
idents`, already made of ``[A-Za-z0-9_]`` and unique) when that is free, so generated code keeps
the user's names readable. It is not free when it is a C/C++ keyword, a name the CUDA headers,
the prelude or the emulator's C++ header define (``float4``, ``expf``, ``make_float4``,
``INFINITY``, ``threadIdx``; ALL-CAPS names of three or more characters are left to the C
headers' macros), when it lies in the generated space below, or when it ends like a derived name
(``_acc``, ``_lo<d>``, ``_frag``, ``_v``). Such a tensor is written ``u_<ident>_u``; every name
starting with ``u_`` is escaped too, so the escape is one-to-one.

**Generated space.** Everything the code generator makes up starts with a prefix no C name of a
tensor starts with — registers ``r_``, shared buffers ``s_``, float4 lanes ``v_`` and quads
``q_``, helpers ``pf``/``PF``, ``_``-names, kernels ``k<i>_``/``pk<i>_`` — or is
one of the loop, block and thread variables (``c0``, ``b0``, ``t0``, ``l0``, ``r0``, ``ii0``,
``kt0``, ``kk0``, ``p0r``, ``iv``, ``ph``, ``sub``, ``pos``), which tensors never take. A derived
name is a prefix, a tensor's C name and a suffix (:meth:`Namer.register` …); since C names never
start with a generated prefix nor end with a derived suffix, two derived names are equal only
for the same tensor and kind.

**Canonical names.** The compile cache and kernel dedup (:mod:`polyfuse.cuda.codegen.dedup`) keep a
kernel's text with its tensors named by position (``pfT<i>``, the structural key's order): a
:class:`Namer` built over their slots (:func:`slots`) prints the canonical text directly, so no
generated local is ever stored under a user's name, and :func:`fill` writes it for any group of
the same structure by filling the slots the namer printed (no identifier is read back from the
text). The regular expressions below only classify names (user or generated space).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# --- what tensors never take -------------------------------------------------------------------

_KEYWORDS = """
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
char32_t class compl concept const consteval constexpr constinit const_cast continue co_await
co_return co_yield decltype default delete do double dynamic_cast else enum explicit export
extern false final float for friend goto if import inline int long module mutable namespace new
noexcept not not_eq nullptr operator or or_eq override private protected public register
reinterpret_cast requires restrict return short signed sizeof static static_assert static_cast
struct switch template this thread_local throw true try typedef typeid typename union unsigned
using virtual void volatile wchar_t while xor xor_eq
"""
# CUDA built-ins, the standard types and library names the headers (NVRTC's, the emulator's
# <cmath>/<cstdlib>/<cstdio>/<cassert>) put in the global scope or define as lowercase macros.
_BUILTINS = """
threadIdx blockIdx blockDim gridDim warpSize dim3 uint3 half half2 nv_bfloat16 nv_bfloat162
size_t ssize_t ptrdiff_t intptr_t uintptr_t intmax_t uintmax_t max_align_t nullptr_t
int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t std main
min max umin umax llmin llmax abs labs llabs div ldiv lldiv saturate fdividef
printf fprintf sprintf snprintf puts malloc calloc realloc free memcpy memset memmove memcmp
strlen abort exit assert errno stdin stdout stderr alloca offsetof math_errhandling
clock clock64 atomicAdd atomicSub atomicExch atomicMin atomicMax atomicInc atomicDec atomicCAS
atomicAnd atomicOr atomicXor L_tmpnam L_ctermid L_cuserid P_tmpdir
"""
_MATH = """
acos asin atan atan2 cos sin tan acosh asinh atanh cosh sinh tanh exp exp2 exp10 expm1 frexp
ldexp log log10 log1p log2 logb ilogb modf scalbn scalbln cbrt rcbrt fabs hypot pow sqrt rsqrt
erf erfc erfinv erfcinv erfcx lgamma tgamma ceil floor fmod trunc round lround llround rint
lrint llrint nearbyint remainder remquo copysign nan nextafter nexttoward fdim fmax fmin fma
fpclassify isfinite isinf isnan isnormal signbit sincos sincospi sinpi cospi norm normcdf
normcdfinv j0 j1 jn y0 y1 yn
"""
_VECTOR_BASES = "char uchar short ushort int uint long ulong longlong ulonglong float double"


def _reserved_words() -> frozenset[str]:
    words = set(_KEYWORDS.split()) | set(_BUILTINS.split())
    words |= {f"{m}{s}" for m in _MATH.split() for s in ("", "f", "l")}
    for base in _VECTOR_BASES.split():
        for n in range(1, 5):
            words |= {f"{base}{n}", f"make_{base}{n}"}
    return frozenset(words)


#: C/C++ keywords and the names the CUDA headers, the prelude and the emulator header define.
RESERVED_WORDS = _reserved_words()
#: Prefixes of generated names (derived names, helpers, kernels, the escape ``u_``), macro
#: families with a lowercase letter, and the ALL-CAPS macro space.
_GENERATED_PREFIX = re.compile(
    r"^(?:_|pf|PF|[rsvq]_|u_|p?k\d+_)|^[A-Z][A-Z0-9_]{2,}$|^M_[A-Z0-9_]+(?:f|l|f\d+x?)$"
)
#: Loop, block, thread and lane variables of generated kernels (isl's ``c0``…, the mapping's
#: ``b0``/``t0``/``l0``/``r0``, the GEMM tiling's ``kt0``/``kk0``/``ii0``/``iv``/``ph``/``sub``/
#: ``pos`` and copy grids ``p0r``/``p0c``/``p0d1``).
_LOOP_VARS = re.compile(r"^(?:[bcdlrtz]\d+|ii\d+|kt\d+|kk\d+|p\d+(?:[rc]|d\d+)|iv|ph|sub|pos)$")
#: Endings of derived names: a tensor's C name never ends like this.
_DERIVED_SUFFIX = re.compile(r"_(?:acc|lo\d+|frag|v|init|update|final)$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

ACC = "_acc"  # a reduction's accumulator: the model's tensor key ``<ident>_acc``
#: the key of an array's further access in a GEMM (a tile of its own): ``<ident>__<n>``
_ACCESS = re.compile(r"^(.+)__(\d+)$")
CANONICAL_TENSOR = "pfT"  # canonical tensor names pfT0, pfT1, … (the structural key's order)
CANONICAL_KERNEL = "pfKERNEL"


def is_free(ident: str) -> bool:
    """Whether ``ident`` can be a tensor's C name as it is."""
    return not (
        ident in RESERVED_WORDS
        or _GENERATED_PREFIX.match(ident)
        or _LOOP_VARS.match(ident)
        or _DERIVED_SUFFIX.search(ident)
    )


def c_name(ident: str) -> str:
    """The C name of the tensor with graph identifier ``ident`` (itself when free)."""
    if not _IDENT.match(ident):
        raise ValueError(f"tensor identifier {ident!r} is not a C identifier")
    return ident if is_free(ident) else f"u_{ident}_u"


def loop_variable(name: str) -> str:
    """A loop variable named ``name`` by a schedule, moved into the generated space when it is
    not there (``x0`` becomes ``pf_x0``): loop variables never take a tensor's C name."""
    return name if _LOOP_VARS.match(name) else f"pf_{name}"


def is_generated(name: str) -> bool:
    """Whether ``name`` lies outside the tensors' space (a loop or thread variable, a name
    with a generated prefix, a header macro's): no tensor's C name can equal it."""
    return bool(_LOOP_VARS.match(name) or _GENERATED_PREFIX.match(name))


# --- the namer of one kernel -------------------------------------------------------------------


class Namer:
    """The names of one kernel's tensors and everything derived from them.

    ``names`` (graph identifier → C name) fixes the tensors' names, e.g. the canonical
    ``pfT<i>`` of the compile cache; a tensor missing from it is an internal error (its real
    name would leak into canonical text). Without it every tensor gets :func:`c_name`.
    Keys are the poly model's tensor keys: a graph identifier, or ``<ident>_acc`` for a
    reduction's accumulator.
    """

    def __init__(self, names: Mapping[str, str] | None = None):
        self.names = dict(names) if names is not None else None

    def _base(self, ident: str) -> str:
        if self.names is None:
            return c_name(ident)
        try:
            return self.names[ident]
        except KeyError:
            raise KeyError(f"namer: tensor {ident!r} has no canonical name") from None

    def tensor(self, key: str) -> str:
        """A global buffer (a kernel parameter): the tensor's C name (``<name>_acc`` for an
        accumulator key)."""
        if key.endswith(ACC) and (self.names is None or key not in self.names):
            return self._base(key[: -len(ACC)]) + ACC
        access = _ACCESS.match(key)
        if access and self.names is not None and key not in self.names:
            # a further access of one array (its own GEMM tile): ``<name>_t<n>``
            return f"{self._base(access.group(1))}_t{access.group(2)}"
        return self._base(key)

    def register(self, key: str) -> str:
        """A tensor (or accumulator) held in a register: ``r_<name>``."""
        return f"r_{self.tensor(key)}"

    def shared(self, key: str) -> str:
        """A tensor's shared-memory tile: ``s_<name>``."""
        return f"s_{self.tensor(key)}"

    @staticmethod
    def lower_bound(buffer: str, dim: int) -> str:
        """Dimension ``dim``'s lower bound of the tile ``buffer`` holds: ``<buffer>_lo<d>``."""
        return f"{buffer}_lo{dim}"

    @staticmethod
    def address_stream(param: str, k: int) -> str:
        """The ``k``-th pointer a copy loop advances through the global buffer ``param``:
        ``pf_gp<k>_<param>`` (the parameter's name last, so canonical text instantiates it)."""
        return f"pf_gp{k}_{param}"

    def fragment(self, key: str) -> str:
        """A GEMM operand's register fragment: ``r_<name>_frag``."""
        return f"r_{self.tensor(key)}_frag"

    def staged(self, key: str) -> str:
        """A GEMM epilogue's register run before its vector store: ``r_<name>_v``."""
        return f"r_{self.tensor(key)}_v"

    def vector(self, key: str, stream: int) -> str:
        """The lane registers of a float4 group: ``v_<name>`` (``v_<k>_<name>`` for the
        ``k``-th distinct address of the same tensor in one group; no C name starts with a
        digit)."""
        return f"v_{_stream(stream)}{self.tensor(key)}"

    def quad(self, key: str, stream: int, j: int) -> str:
        """The ``j``-th ``float4`` of a group's lanes: ``q_<name><j>`` (``q_<k>_<name><j>``;
        ``j`` one digit)."""
        assert 0 <= j < 10, f"quad {j} of {key}: a group of more than 40 lanes"
        return f"q_{_stream(stream)}{self.tensor(key)}{j}"


def _stream(k: int) -> str:
    return f"{k}_" if k else ""


# --- canonical text ----------------------------------------------------------------------------

#: In canonical text a tensor's name is a *slot*: its canonical name (``pfT<i>``) between these
#: two control characters, which printed C never holds otherwise. Derived names keep their
#: prefix and suffix around the slot (``r_\x01pfT0\x02_acc``), so :func:`fill` writes any
#: group's names into the text the namer printed, slot by slot, without reading identifiers.
SLOT_OPEN, SLOT_CLOSE = "\x01", "\x02"


def canonical_names(idents: list[str] | tuple[str, ...]) -> dict[str, str]:
    """Graph identifier → canonical name, in the given (structural) order."""
    return {t: f"{CANONICAL_TENSOR}{i}" for i, t in enumerate(idents)}


def slots(canonical: Mapping[str, str]) -> dict[str, str]:
    """Graph identifier → the slot of its canonical name: the names a :class:`Namer` prints
    canonical text with."""
    return {t: f"{SLOT_OPEN}{c}{SLOT_CLOSE}" for t, c in canonical.items()}


def fill(text: str, names: Mapping[str, str]) -> str:
    """Canonical ``text`` with every slot replaced by ``names[its canonical name]`` (one pass:
    what is filled in is never read again)."""
    head, *rest = text.split(SLOT_OPEN)
    out = [head]
    for piece in rest:
        key, tail = piece.split(SLOT_CLOSE, 1)
        out += [names[key], tail]
    return "".join(out)
