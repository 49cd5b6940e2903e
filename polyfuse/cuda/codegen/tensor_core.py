"""Tensor-core intrinsics as small computations with their per-lane fragment layouts.

An intrinsic (``mma.sync.aligned.m16n8k16`` on float16/bfloat16, ``m16n8k8`` on tf32, both
accumulating in float32; ``m16n8k32`` on int8/uint8, accumulating in int32) computes
``D[m, n] = C[m, n] + sum_k A[m, k] * B[k, n]`` for one warp; each lane holds a few elements
of every operand in registers. :class:`Intrinsic` records that
computation and, per operand, which ``(row, col)`` each lane's register element holds (PTX
ISA, "Matrix Fragments for mma"), so a tensorization pass can match the intrinsic against a
GEMM's innermost tiles with isl and lay the fragments out, and tests can pack fragments with
numpy. ``ldmatrix`` (``m8n8``, ``.x1/.x2/.x4``, ``.trans``) loads such fragments from shared
memory; :func:`ldmatrix_layout` gives its per-lane layout.

:data:`PRELUDE` is the CUDA each translation unit that uses them includes: one inline PTX
instruction per function on a GPU; the CPU emulator (which defines ``PF_EMULATOR``) has its own
definitions of the same functions with the same layouts (``emulator/rt/pf_mma.h``).
"""

from __future__ import annotations

from dataclasses import dataclass

WARP = 32


@dataclass(frozen=True)
class Intrinsic:
    """One warp-level MMA instruction: shape, types and the function the prelude defines."""

    name: str  # the prelude's function
    ptx: str  # the instruction
    m: int
    n: int
    k: int
    in_dtype: str  # "float16" | "bfloat16" | "tfloat32" | "int8" | "uint8" (A's)
    acc_dtype: str  # "float32" | "int32"
    a_regs: int  # 32-bit registers per lane
    b_regs: int
    c_regs: int
    b_dtype: str = ""  # B's element type where it differs from A's (uint8 x int8)

    @property
    def elems_per_reg(self) -> int:
        """Elements of A (and B) per 32-bit register: 4 bytes, 2 halves or one tf32."""
        return {"tfloat32": 1, "int8": 4, "uint8": 4}.get(self.in_dtype, 2)

    @property
    def c_type(self) -> str:
        """The C type of the accumulator registers."""
        return "int" if self.acc_dtype == "int32" else "float"

    def a_layout(self, lane: int) -> list[tuple[int, int]]:
        """(row m, col k) of each A element lane ``lane`` holds, register by register (lowest
        bits first)."""
        g, t = divmod(lane, 4)
        if self.in_dtype == "tfloat32":  # m16n8k8
            return [(g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)]
        e = self.elems_per_reg  # 2 halves (k16) or 4 bytes (k32) per register
        return [(g + 8 * r, e * t + 4 * e * c + h)
                for c in (0, 1) for r in (0, 1) for h in range(e)]  # fmt: skip

    def b_layout(self, lane: int) -> list[tuple[int, int]]:
        """(row k, col n) of each B element lane ``lane`` holds."""
        g, t = divmod(lane, 4)
        if self.in_dtype == "tfloat32":
            return [(t, g), (t + 4, g)]
        e = self.elems_per_reg
        return [(e * t + 4 * e * r + h, g) for r in (0, 1) for h in range(e)]

    def c_layout(self, lane: int) -> list[tuple[int, int]]:
        """(row m, col n) of each accumulator element (C and D) lane ``lane`` holds."""
        g, t = divmod(lane, 4)
        return [(g + 8 * r, 2 * t + h) for r in (0, 1) for h in (0, 1)]


MMA_BF16 = Intrinsic(
    "pf_mma_m16n8k16_f32_bf16",
    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
    16, 8, 16, "bfloat16", "float32", 4, 2, 4,
)  # fmt: skip
MMA_F16 = Intrinsic(
    "pf_mma_m16n8k16_f32_f16",
    "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
    16, 8, 16, "float16", "float32", 4, 2, 4,
)  # fmt: skip
MMA_TF32 = Intrinsic(
    "pf_mma_m16n8k8_f32_tf32",
    "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
    16, 8, 8, "tfloat32", "float32", 4, 2, 4,
)  # fmt: skip
#: ``m16n8k32`` on bytes, per (A, B) signedness: exact int32 sums of int8/uint8 products
#: (wrapping past 32 bits, as the instruction without ``.satfinite``)
_BYTE_PTX = {"int8": "s8", "uint8": "u8"}
MMA_INT8 = {
    (a, b): Intrinsic(
        f"pf_mma_m16n8k32_s32_{_BYTE_PTX[a]}_{_BYTE_PTX[b]}",
        f"mma.sync.aligned.m16n8k32.row.col.s32.{_BYTE_PTX[a]}.{_BYTE_PTX[b]}.s32",
        16, 8, 32, a, "int32", 4, 2, 4, b,
    )
    for a in _BYTE_PTX
    for b in _BYTE_PTX
}  # fmt: skip
INTRINSICS = (MMA_BF16, MMA_F16, MMA_TF32, *MMA_INT8.values())


def ldmatrix_layout(lane: int, matrices: int, trans: bool) -> list[tuple[int, int, int]]:
    """(matrix, row, col) of each 16-bit element lane ``lane`` receives from ``ldmatrix``
    ``.x{matrices}`` (``.trans``): register ``i`` comes from matrix ``i``, low half first.
    Lane ``8 i + r`` supplies the address of row ``r`` of matrix ``i``."""
    q, t = divmod(lane, 4)
    out = []
    for i in range(matrices):
        for h in (0, 1):
            out.append((i, 2 * t + h, q) if trans else (i, q, 2 * t + h))
    return out


def _mma_function(mma: Intrinsic) -> str:
    cc = "r" if mma.acc_dtype == "int32" else "f"  # the accumulators' register class
    d = ", ".join(f'"={cc}"(d[{i}])' for i in range(mma.c_regs))
    ins = [f'"r"(a[{i}])' for i in range(mma.a_regs)] + [f'"r"(b[{i}])' for i in range(mma.b_regs)]
    ins += [f'"{cc}"(c[{i}])' for i in range(mma.c_regs)]
    n = mma.c_regs
    ab = n + mma.a_regs
    groups = [(0, n), (n, mma.a_regs), (ab, mma.b_regs), (ab + mma.b_regs, n)]
    ops = ", ".join("{" + ",".join(f"%{s + i}" for i in range(c)) + "}" for s, c in groups)
    return (
        f"PF_INLINE void {mma.name}({mma.c_type}* d, const unsigned* a, const unsigned* b, "
        f"const {mma.c_type}* c) {{\n"
        f'  asm volatile("{mma.ptx} {ops};\\n"\n'
        f"               : {d}\n"
        f"               : {', '.join(ins)});\n"
        "}\n"
    )


#: the prelude's ``ldmatrix`` wrappers: this prefix, the matrix count, ``_trans`` if transposed
LDMATRIX = "pf_ldmatrix_x"
#: the prelude's 16-byte ``cp.async`` with a run-time source size
CP_ASYNC16 = "pf_cp_async16"


def _ldmatrix_function(matrices: int, trans: bool) -> str:
    name = f"{LDMATRIX}{matrices}" + ("_trans" if trans else "")
    ptx = f"ldmatrix.sync.aligned.m8n8.x{matrices}" + (".trans" if trans else "") + ".shared.b16"
    outs = ", ".join(f'"=r"(r[{i}])' for i in range(matrices))
    regs = ",".join(f"%{i}" for i in range(matrices))
    return (
        f"PF_INLINE void {name}(unsigned* r, const void* p) {{\n"
        "  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));\n"
        f'  asm volatile("{ptx} {{{regs}}}, [%{matrices}];\\n" : {outs} : "r"(s) : "memory");\n'
        "}\n"
    )


#: a 16-byte cp.async whose first ``bytes`` come from ``src`` and the rest are zero (a run-time
#: src-size: ``__pipeline_memcpy_async``'s zero-fill argument compiles to a branch per value)
_CP_ASYNC16 = (
    f"PF_INLINE void {CP_ASYNC16}(void* dst, const void* src, int bytes) {{\n"
    "  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));\n"
    '  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\\n" :: "r"(s), "l"(src), '
    '"r"(bytes) : "memory");\n'
    "}\n"
)

PRELUDE = (
    "// Tensor-core intrinsics (polyfuse.cuda.codegen.tensor_core); the emulator defines its own.\n"
    "#ifndef PF_EMULATOR\n"
    "#ifndef PF_INLINE\n#define PF_INLINE __device__ __forceinline__\n#endif\n"
    + "".join(_mma_function(m) for m in INTRINSICS)
    + "".join(_ldmatrix_function(x, tr) for x in (1, 2, 4) for tr in (False, True))
    + _CP_ASYNC16
    + "PF_INLINE unsigned pf_cvt_tf32(float x) {\n"
    "  unsigned r;\n"
    '  asm("cvt.rna.tf32.f32 %0, %1;\\n" : "=r"(r) : "f"(x));\n'
    "  return r;\n"
    "}\n"
    "#endif\n"
)
