"""The statement printer: one statement instance of the kernel AST as C, from its te body.

:class:`BodyPrinter` writes ``S(args)`` from the primitive's te expression with its loop
variables replaced by ``args``; each tensor prints according to its placement (global buffers
as ``name[linear index]``, register-resident tensors as scalars ``r_name``, shared tiles by
their offsets), and a reduction's init/update/final statements set, combine into and store its
accumulator. Element types, rounding of 16-bit stores and typed integer arithmetic follow
the dtype passes (``cuda/lower_dtypes.py``). :mod:`polyfuse.cuda.printer` writes the kernel
around these statements; the GEMM printer (:mod:`polyfuse.cuda.gemm_printer`) specialises the
references.
"""

from __future__ import annotations

from polyfuse.base.errors import UnsupportedOpError
from polyfuse.cuda.c_text import c_linear
from polyfuse.cuda.c_wide import (
    REDUCE_OPS,
    UNARY_F64,
    cast_from_float,
    int_floor,
    wide_identity,
)
from polyfuse.cuda.literals import c_double, c_float, c_int
from polyfuse.cuda.lower_dtypes import (
    C_TYPES,
    FLOAT_TO_HALF,
    HALF_TO_FLOAT,
    is_float_register,
)
from polyfuse.cuda.namer import Namer
from polyfuse.graph import expr as ex
from polyfuse.graph.dtypes import is_float, numpy_dtype, register_dtype
from polyfuse.poly.model import Statement
from polyfuse.poly.placement import Placement

_UNARY = {
    "exp": "expf",
    "log": "logf",
    "sqrt": "sqrtf",
    "rsqrt": "rsqrtf",
    "tanh": "tanhf",
    "erf": "erff",
    "sigmoid": "pf_sigmoid",
    "round": "rintf",  # halves to even (the default rounding mode), as numpy.rint
}
_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_IDENTITY = {"sum": "0.0f", "max": "-INFINITY", "min": "INFINITY"}


def _int_floor(op: str, a: str, divisor: ex.Expr, dtype: str = "int32", data: bool = False) -> str:
    """Python's ``a // b`` or ``a % b`` of integer ``a`` by a nonzero constant ``b``.

    Index arithmetic (int32, ``data`` False: bounded loop variables) uses the prelude's
    ``pf_fdiv``/``pf_mod``, which take a positive divisor (for a negative one
    ``a // b == (-a) // -b`` and ``a % b == -((-a) % -b)``); they overflow near INT_MIN.
    Integer data (``data``: the dividend reads a tensor) and int64 use the typed
    ``pf_w_fdiv``/``pf_w_mod``, exact over the whole range; by ``-1`` the quotient is the
    wrapping negation and the remainder 0 (C's ``INT_MIN / -1`` traps on x86)."""
    assert isinstance(divisor, ex.Const)
    b = int(divisor.value)
    if dtype != "int32" or data:
        return int_floor(op, a, b, dtype)
    if b > 0:
        return f"pf_fdiv({a}, {b})" if op == "floordiv" else f"pf_mod({a}, {b})"
    if op == "floordiv":
        return f"pf_fdiv((-{a}), {-b})"
    return f"(-pf_mod((-{a}), {-b}))"


def c_type(dtype: str) -> str | None:
    """The C type a value of ``dtype`` is held in (16-bit floats in float registers)."""
    return "float" if is_float_register(dtype) else C_TYPES.get(dtype)


class BodyPrinter(ex.ExprVisitor[str]):
    """Prints te expressions for one statement instance."""

    def __init__(
        self,
        placements: dict[str, Placement],
        idents: dict[int, str],
        lane_guard: str | None = None,
        laneless: set[str] | frozenset[str] = frozenset(),
        combine: str | None = None,
        combined: set[str] | frozenset[str] = frozenset(),
        scratch: str = "",
        namer: Namer | None = None,
    ):
        self.placements = placements
        self.namer = namer or Namer()
        self.idents = idents
        self.lane_guard = lane_guard  # condition for global stores of lane-less statements
        self.laneless = laneless
        self.combine = combine  # "pf_allreduce_y<{op}, 256>" style template, or None
        self.combined = combined  # reductions whose lanes hold partials (combine at final)
        self.scratch = scratch  # shared scratch of the combine
        self.scratch_dtype = "float32"  # its element type (a double where one combines)
        self.lanes: dict[str, str] = {}  # inside a KVector: tensor -> its lane register
        self.stmt_lanes: dict[str, dict[str, str]] = {}  # per statement, while in a KVector

    def tensor_ref(
        self, ident: str, shape: tuple[int, ...], idx: list[str], store: bool = False
    ) -> str:
        if ident in self.lanes:
            return self.lanes[ident]
        p = self.placements[ident]
        if p.space == "register" or (p.register_copy and not store):
            return self.namer.register(ident)
        if p.space == "shared":
            name, dims = self.namer.shared(ident), [size for _, size in p.box]
            idx = [f"({i} - {self.namer.lower_bound(name, d)})" for d, i in enumerate(idx)]
            return c_linear(name, idx, dims)
        return self.global_ref(ident, shape, idx)

    def global_ref(self, ident: str, shape: tuple[int, ...], idx: list[str]) -> str:
        """The element of ``ident``'s global buffer (whose dtype is the tensor's own: a
        16-bit one is converted where it meets float registers, see :meth:`load`)."""
        return c_linear(self.namer.tensor(ident), idx, list(shape))

    def load(self, t: ex.Tensor, ident: str, idx: list[str]) -> str:
        """A read of tensor ``t`` as a float register value: a 16-bit element of its global
        buffer is widened (shared, register and lane copies already hold float32)."""
        ref = self.tensor_ref(ident, t.shape, idx)
        if t.dtype in HALF_TO_FLOAT and ref == self.global_ref(ident, t.shape, idx):
            return f"{HALF_TO_FLOAT[t.dtype]}({ref})"
        return ref

    def rounded(self, t: ex.Tensor, ident: str, out_ref: str, idx: list[str], value: str) -> str:
        """``value`` as stored at ``out_ref``: rounded to nearest even when that is an element
        of a 16-bit global buffer."""
        if t.dtype in FLOAT_TO_HALF and out_ref == self.global_ref(ident, t.shape, idx):
            return f"{FLOAT_TO_HALF[t.dtype]}({value})"
        return value

    def expr(self, e: ex.Expr, env: dict[int, str]) -> str:
        """C text of ``e``; ``env`` maps loop variable uid → C expression."""
        return self.visit(e, env)

    def visit_IterVar(self, e: ex.IterVar, env: dict[int, str]) -> str:
        return env[e.uid]

    def visit_Const(self, e: ex.Const, env: dict[int, str]) -> str:
        if e.dtype == "bool":
            return "true" if e.value else "false"
        if e.dtype in ("int32", "int64"):
            return c_int(int(e.value), e.dtype)
        if e.dtype in FLOAT_TO_HALF:  # its value in its dtype, held in a float register
            return c_float(float(numpy_dtype(e.dtype).type(e.value)))
        if e.dtype == "float64":
            return c_double(e.value)
        return c_float(e.value)

    def visit_Read(self, e: ex.Read, env: dict[int, str]) -> str:
        idx = [self.visit(i, env) for i in e.indices]
        return self.load(e.tensor, self.idents[e.tensor.uid], idx)

    def visit_Unary(self, e: ex.Unary, env: dict[int, str]) -> str:
        a = self.visit(e.a, env)
        if e.op == "neg":
            return f"(-{a})"
        if e.op == "not":
            return f"(!{a})"
        if e.op == "abs":
            if e.dtype == "float64":
                return f"fabs({a})"
            if e.dtype == "int64":
                return f"llabs({a})"
            return f"fabsf({a})" if is_float_register(e.dtype) else f"abs({a})"
        if e.dtype == "float64":
            return f"{UNARY_F64[e.op]}((double){a})"
        return f"{_UNARY[e.op]}({a})"

    def visit_Binary(self, e: ex.Binary, env: dict[int, str]) -> str:
        a, b = self.visit(e.a, env), self.visit(e.b, env)
        fl = is_float_register(e.dtype)
        if e.op in ("add", "sub", "mul"):
            return f"({a} {'+-*'['add sub mul'.split().index(e.op)]} {b})"
        if e.op == "div":  # true division, also of integers
            if is_float(e.a.dtype) or is_float(e.b.dtype):
                return f"({a} / {b})"
            return f"((float){a} / (float){b})"
        if e.op == "pow":
            if e.dtype == "float64":
                return f"pow((double){a}, (double){b})"
            if e.dtype in ("int32", "int64"):  # exact and wrapping, not through a float
                t = C_TYPES[e.dtype]
                return f"pf_w_ipow<{t}>(({t}){a}, ({t}){b})"
            return f"powf({a}, {b})"
        if e.op in ("max", "min"):
            if fl:
                return f"pf_f{e.op}f({a}, {b})"
            if e.dtype == "int32":
                return f"{e.op}({a}, {b})"
            return f"pf_w_{e.op}<{C_TYPES[e.dtype]}>({a}, {b})"
        if e.op in ("floordiv", "mod") and not fl and e.dtype != "float64":
            data = any(isinstance(n, ex.Read) for n in ex.walk(e.a))
            return _int_floor(e.op, a, e.b, e.dtype, data)  # by a nonzero constant (te checks)
        if e.dtype == "float64" and e.op in ("floordiv", "mod"):
            q = f"floor((double){a} / (double){b})"
            return q if e.op == "floordiv" else f"({a} - {b} * {q})"
        if e.op == "floordiv":
            return f"floorf({a} / {b})"
        if e.op == "mod":
            return f"({a} - {b} * floorf({a} / {b}))"
        return self.visit_default(e)

    def visit_Compare(self, e: ex.Compare, env: dict[int, str]) -> str:
        return f"({self.visit(e.a, env)} {_CMP[e.op]} {self.visit(e.b, env)})"

    def visit_Logical(self, e: ex.Logical, env: dict[int, str]) -> str:
        op = "&&" if e.op == "and" else "||"
        return f"({self.visit(e.a, env)} {op} {self.visit(e.b, env)})"

    def visit_Select(self, e: ex.Select, env: dict[int, str]) -> str:
        cond, a, b = (self.visit(c, env) for c in e.children())
        # A branch of another C type is converted to the result's first: the emulator's
        # global reads are proxies, and ``c ? ref<float> : int`` is an int there (float on
        # the GPU).
        want = "float" if is_float_register(e.dtype) else C_TYPES.get(e.dtype)
        a, b = (
            f"(({want}){v})" if want and c_type(x.dtype) != want else v
            for v, x in ((a, e.a), (b, e.b))
        )
        return f"({cond} ? {a} : {b})"

    def visit_Cast(self, e: ex.Cast, env: dict[int, str]) -> str:
        a = self.visit(e.a, env)
        if e.dtype in FLOAT_TO_HALF:  # rounded to the 16-bit type, held as float
            return f"{HALF_TO_FLOAT[e.dtype]}({FLOAT_TO_HALF[e.dtype]}((float){a}))"
        if e.dtype == "int32" and is_float_register(e.a.dtype):
            # toward zero, saturating, NaN to 0 (a C cast is undefined there: the emulator's
            # x86 gives INT_MIN for NaN, where the GPU's cvt.rzi gives 0)
            return f"__float2int_rz({a})"
        if (conv := cast_from_float(e.a.dtype, e.dtype, a)) is not None:
            return conv
        return f"(({C_TYPES[e.dtype]}){a})"

    def visit_DataIndex(self, e: ex.DataIndex, env: dict[int, str]) -> str:
        return f"((int){self.visit(e.a, env)})"

    def visit_default(self, e: ex.Expr, *args: object) -> str:
        raise UnsupportedOpError(f"cannot print expression {e!r}")

    def statement(self, s: Statement, args: list[str], ident: str) -> str:
        t = s.tensor
        assert t.op is not None
        dims = [a for a in t.op.axes if a.extent > 1] + [
            a for a in t.op.reduce_axes if a.extent > 1
        ]
        env = {a.uid: str(a.lo) for a in t.op.axes + t.op.reduce_axes}
        env.update({a.uid: args[i] for i, a in enumerate(dims) if i < len(args)})
        out_idx = [env[a.uid] for a in t.op.axes]
        out_ref = self.tensor_ref(ident, t.shape, out_idx, store=True)
        place = self.placements[ident]
        guard = self.lane_guard if s.name in self.laneless and place.space == "global" else None

        def store(value: str) -> str:
            if place.register_copy:
                reg = self.namer.register(ident)
                st = f"{out_ref} = {self.rounded(t, ident, out_ref, out_idx, reg)};"
                st = f"if ({guard}) {st}" if guard else st
                return f"{reg} = {value}; {st}"
            value = self.rounded(t, ident, out_ref, out_idx, value)
            return f"if ({guard}) {out_ref} = {value};" if guard else f"{out_ref} = {value};"

        if s.role == "compute":
            return store(self.expr(t.op.body, env))
        red = t.op.reduce
        assert red is not None
        acc = self.tensor_ref(f"{ident}_acc", t.shape, out_idx)
        held = register_dtype(red.dtype)  # the accumulator's (check_codegen_dtypes)
        if s.role == "init":
            start = _IDENTITY[red.op] if is_float_register(held) else wide_identity(red.op, held)
            return f"{acc} = {start};"
        if s.role == "final":
            if self.combine and s.prim in self.combined:
                scratch = self.scratch
                if held != self.scratch_dtype:  # one scratch serves combines of two types
                    scratch = f"reinterpret_cast<{c_type(held)}*>({scratch})"
                if is_float_register(held):
                    fn = self.combine.format(op=f"pf_{red.op}")
                    return f"{acc} = {fn}({acc}, {scratch}); " + store(acc)
                ct = C_TYPES[held]
                fn = self.combine.replace("pf_allreduce", "pf_w_allreduce")
                fn = fn.format(op=f"{REDUCE_OPS[red.op]}<{ct}>")
                return f"{acc} = {fn}({acc}, {scratch}); " + store(acc)
            return store(acc)
        v = self.expr(red.body, env)
        if red.op == "sum":
            return f"{acc} = {acc} + {v};"
        if is_float_register(held):
            return f"{acc} = pf_f{red.op}f({acc}, {v});"
        return f"{acc} = pf_w_{red.op}<{C_TYPES[held]}>({acc}, {v});"
