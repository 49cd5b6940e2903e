// pf_mma.h -- the warp-level tensor-core instructions on the CPU: mma.sync and ldmatrix.
//
// Included by pf_emu.h. Generated code calls these through the functions of
// polyfuse/cuda/tensor_core.py's prelude (pf_mma_*, pf_ldmatrix_*), which on a GPU are one
// inline PTX instruction each and here are defined with the same per-lane fragment layouts
// (PTX ISA, "Matrix Fragments for mma.m16n8k16" / "mma.m16n8k8" / "ldmatrix"). Each is a
// warp-collective operation: lanes exchange their fragment registers with warp shuffles, so
// a lane that is missing (diverged or exited) is reported like any divergent shuffle, and
// race-check builds see ldmatrix's shared-memory reads as plain reads.
//
// Layouts (g = lane / 4, t = lane % 4; a 32-bit register holds two 16-bit elements, the lower
// column or row in the low half):
//   m16n8k16 (f16/bf16 -> f32): A regs (g, 2t..) (g+8, 2t..) (g, 2t+8..) (g+8, 2t+8..);
//     B regs (k 2t.., n g) (k 2t+8.., n g); C/D (g, 2t) (g, 2t+1) (g+8, 2t) (g+8, 2t+1).
//   m16n8k8 (tf32 -> f32): A (g, t) (g+8, t) (g, t+4) (g+8, t+4); B (k t, n g) (k t+4, n g).
//   m16n8k32 (s8/u8 -> s32; a register holds four bytes, the lowest k in the low byte):
//     A regs (g, 4t..) (g+8, 4t..) (g, 4t+16..) (g+8, 4t+16..); B (k 4t.., n g) (k 4t+16.., n g).
//   ldmatrix m8n8 b16: lane 8i + r gives the address of row r of matrix i; lane L receives
//     from matrix i the elements (L/4, 2(L%4)..); with .trans, (2(L%4).., L/4).
#pragma once

#define PF_EMULATOR 1

namespace pf_tc {

inline unsigned lane() { return pf_cur()->linear & 31u; }

// mma.sync and ldmatrix are .aligned: every lane of the warp executes the same instruction.
inline void whole_warp(const char* what, int line) {
  if (__activemask(line) != 0xffffffffu) {
    char msg[160];
    std::snprintf(msg, sizeof msg, "%s at line %d needs all 32 lanes of the warp (some exited "
                  "or diverged)", what, line);
    pf_api->fail(msg);
  }
}

inline unsigned long long pair(unsigned lo, unsigned hi) {
  return (unsigned long long)lo | ((unsigned long long)hi << 32);
}

template <class T>
inline double elem(unsigned reg, int half) {
  T v;
  const uint16_t bits = (uint16_t)(reg >> (16 * half));
  std::memcpy(&v, &bits, 2);
  return (double)(float)v;
}

// tf32: the tensor core reads the upper 19 bits of the register.
inline double tf32(unsigned reg) { return (double)__uint_as_float(reg & 0xffffe000u); }

// m16n8k16: every lane gathers rows g and g+8 of A (from the lanes of its group) and columns
// 2t and 2t+1 of B (from the lanes 4n..4n+3 that hold column n), then computes its four D
// elements. Products are exact; the sum is rounded once to float.
template <class T>
inline void mma_m16n8k16(float* d, const unsigned* a, const unsigned* b, const float* c,
                         int line) {
  whole_warp("mma.sync.m16n8k16", line);
  const unsigned L = lane(), g = L >> 2, t = L & 3u;
  double A[2][16], B[2][16];
  for (unsigned j = 0; j < 4; ++j) {
    const unsigned src = 4 * g + j;
    const unsigned long long lo = __shfl_sync(0xffffffffu, pair(a[0], a[1]), (int)src);
    const unsigned long long hi = __shfl_sync(0xffffffffu, pair(a[2], a[3]), (int)src);
    for (int h = 0; h < 2; ++h) {
      A[0][2 * j + h] = elem<T>((unsigned)lo, h);
      A[1][2 * j + h] = elem<T>((unsigned)(lo >> 32), h);
      A[0][2 * j + 8 + h] = elem<T>((unsigned)hi, h);
      A[1][2 * j + 8 + h] = elem<T>((unsigned)(hi >> 32), h);
    }
  }
  for (unsigned col = 0; col < 2; ++col) {
    for (unsigned j = 0; j < 4; ++j) {
      const unsigned src = 4 * (2 * t + col) + j;
      const unsigned long long v = __shfl_sync(0xffffffffu, pair(b[0], b[1]), (int)src);
      for (int h = 0; h < 2; ++h) {
        B[col][2 * j + h] = elem<T>((unsigned)v, h);
        B[col][2 * j + 8 + h] = elem<T>((unsigned)(v >> 32), h);
      }
    }
  }
  for (int i = 0; i < 4; ++i) {
    const int row = i >> 1, col = i & 1;
    double s = c[i];
    for (int k = 0; k < 16; ++k) s += A[row][k] * B[col][k];
    d[i] = (float)s;
  }
}

}  // namespace pf_tc

inline void pf_mma_m16n8k16_f32_bf16(float* d, const unsigned* a, const unsigned* b,
                                     const float* c, int line = __builtin_LINE()) {
  pf_tc::mma_m16n8k16<__nv_bfloat16>(d, a, b, c, line);
}
inline void pf_mma_m16n8k16_f32_f16(float* d, const unsigned* a, const unsigned* b,
                                    const float* c, int line = __builtin_LINE()) {
  pf_tc::mma_m16n8k16<__half>(d, a, b, c, line);
}

// m16n8k8 tf32: A rows g and g+8 over k 0..7 from the lanes of the group, B columns 2t, 2t+1.
inline void pf_mma_m16n8k8_f32_tf32(float* d, const unsigned* a, const unsigned* b,
                                    const float* c, int line = __builtin_LINE()) {
  pf_tc::whole_warp("mma.sync.m16n8k8", line);
  const unsigned L = pf_tc::lane(), g = L >> 2, t = L & 3u;
  double A[2][8], B[2][8];
  for (unsigned j = 0; j < 4; ++j) {
    const unsigned src = 4 * g + j;
    const unsigned long long lo = __shfl_sync(0xffffffffu, pf_tc::pair(a[0], a[1]), (int)src);
    const unsigned long long hi = __shfl_sync(0xffffffffu, pf_tc::pair(a[2], a[3]), (int)src);
    A[0][j] = pf_tc::tf32((unsigned)lo);
    A[1][j] = pf_tc::tf32((unsigned)(lo >> 32));
    A[0][j + 4] = pf_tc::tf32((unsigned)hi);
    A[1][j + 4] = pf_tc::tf32((unsigned)(hi >> 32));
  }
  for (unsigned col = 0; col < 2; ++col) {
    for (unsigned j = 0; j < 4; ++j) {
      const unsigned src = 4 * (2 * t + col) + j;
      const unsigned long long v =
          __shfl_sync(0xffffffffu, pf_tc::pair(b[0], b[1]), (int)src);
      B[col][j] = pf_tc::tf32((unsigned)v);
      B[col][j + 4] = pf_tc::tf32((unsigned)(v >> 32));
    }
  }
  for (int i = 0; i < 4; ++i) {
    double s = c[i];
    for (int k = 0; k < 8; ++k) s += A[i >> 1][k] * B[i & 1][k];
    d[i] = (float)s;
  }
}

// m16n8k32 on bytes (TA, TB: int8_t or uint8_t): A rows g and g+8 over k 0..31 from the lanes
// of the group, B columns 2t and 2t+1; the products summed exactly and wrapped to 32 bits.
template <class TA, class TB>
inline void pf_mma_m16n8k32_i8(int* d, const unsigned* a, const unsigned* b, const int* c,
                               int line) {
  pf_tc::whole_warp("mma.sync.m16n8k32", line);
  const unsigned L = pf_tc::lane(), g = L >> 2, t = L & 3u;
  long long A[2][32], B[2][32];
  auto byte = [](unsigned reg, int i, auto type) {
    return (long long)(decltype(type))(unsigned char)(reg >> (8 * i));
  };
  for (unsigned j = 0; j < 4; ++j) {
    const unsigned src = 4 * g + j;
    const unsigned long long lo = __shfl_sync(0xffffffffu, pf_tc::pair(a[0], a[1]), (int)src);
    const unsigned long long hi = __shfl_sync(0xffffffffu, pf_tc::pair(a[2], a[3]), (int)src);
    for (int i = 0; i < 4; ++i) {
      A[0][4 * j + i] = byte((unsigned)lo, i, TA());
      A[1][4 * j + i] = byte((unsigned)(lo >> 32), i, TA());
      A[0][4 * j + 16 + i] = byte((unsigned)hi, i, TA());
      A[1][4 * j + 16 + i] = byte((unsigned)(hi >> 32), i, TA());
    }
  }
  for (unsigned col = 0; col < 2; ++col) {
    for (unsigned j = 0; j < 4; ++j) {
      const unsigned src = 4 * (2 * t + col) + j;
      const unsigned long long v =
          __shfl_sync(0xffffffffu, pf_tc::pair(b[0], b[1]), (int)src);
      for (int i = 0; i < 4; ++i) {
        B[col][4 * j + i] = byte((unsigned)v, i, TB());
        B[col][4 * j + 16 + i] = byte((unsigned)(v >> 32), i, TB());
      }
    }
  }
  for (int i = 0; i < 4; ++i) {
    long long s = c[i];
    for (int k = 0; k < 32; ++k) s += A[i >> 1][k] * B[i & 1][k];
    d[i] = (int)(unsigned)(unsigned long long)s;  // two's-complement wrap
  }
}
#define PF_MMA_I8(NAME, TA, TB)                                                      \
  inline void NAME(int* d, const unsigned* a, const unsigned* b, const int* c,       \
                   int line = __builtin_LINE()) {                                    \
    pf_mma_m16n8k32_i8<TA, TB>(d, a, b, c, line);                                     \
  }
PF_MMA_I8(pf_mma_m16n8k32_s32_s8_s8, int8_t, int8_t)
PF_MMA_I8(pf_mma_m16n8k32_s32_s8_u8, int8_t, uint8_t)
PF_MMA_I8(pf_mma_m16n8k32_s32_u8_s8, uint8_t, int8_t)
PF_MMA_I8(pf_mma_m16n8k32_s32_u8_u8, uint8_t, uint8_t)
#undef PF_MMA_I8

// cvt.rna.tf32.f32: to 10 mantissa bits, ties away from zero (the register keeps 32 bits).
inline unsigned pf_cvt_tf32(float x) {
  const unsigned u = __float_as_uint(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return u;  // inf and NaN pass through
  return (u + 0x1000u) & 0xffffe000u;
}

// ldmatrix.sync.aligned.m8n8.xN[.trans].shared.b16 for N matrices. As on the hardware, lane
// 8i + j (i < N) reads row j of matrix i, 16 bytes, in one access (so the race-check build's
// bank counter sees the quarter-warp phases the hardware serves); the rows then travel to the
// lanes that hold their elements by warp shuffles.
// (always inlined: a race report or bank report then names the caller's source line)
#define PF_LDM_INLINE __attribute__((always_inline)) inline
template <int N, bool TRANS>
PF_LDM_INLINE void pf_ldmatrix(unsigned* r, const void* row_address, int line) {
  pf_tc::whole_warp("ldmatrix", line);
  const unsigned L = pf_tc::lane();
  unsigned long long row[2] = {0, 0};
  if (L < 8u * N) {
    if ((uintptr_t)row_address & 15u) {
      char msg[160];
      std::snprintf(msg, sizeof msg, "ldmatrix at line %d: lane %u's row address is not "
                    "16-byte aligned", line, L);
      pf_api->fail(msg);
    }
    std::memcpy(row, row_address, 16);
  }
  // element e (16 bits) of the row that lane src read
  auto half = [&](int src, unsigned e) {
    const unsigned long long lo = __shfl_sync(0xffffffffu, row[0], src);
    const unsigned long long hi = __shfl_sync(0xffffffffu, row[1], src);
    return (unsigned)(((e < 4 ? lo : hi) >> (16 * (e & 3u))) & 0xffffu);
  };
  for (int i = 0; i < N; ++i) {
    if (!TRANS) {  // lane L: row L / 4, elements 2(L % 4) and 2(L % 4) + 1
      const unsigned long long lo = __shfl_sync(0xffffffffu, row[0], (int)(8 * i + (L >> 2)));
      const unsigned long long hi = __shfl_sync(0xffffffffu, row[1], (int)(8 * i + (L >> 2)));
      const unsigned w = L & 3u;
      r[i] = (unsigned)((w < 2 ? lo : hi) >> (32 * (w & 1u)));
    } else {  // lane L: rows 2(L % 4) and 2(L % 4) + 1, element L / 4 of each
      const int src = (int)(8 * i + 2 * (L & 3u));
      r[i] = half(src, L >> 2) | (half(src + 1, L >> 2) << 16);
    }
  }
}
PF_LDM_INLINE void pf_ldmatrix_x1(unsigned* r, const void* p, int line = __builtin_LINE()) {
  pf_ldmatrix<1, false>(r, p, line);
}
PF_LDM_INLINE void pf_ldmatrix_x2(unsigned* r, const void* p, int line = __builtin_LINE()) {
  pf_ldmatrix<2, false>(r, p, line);
}
PF_LDM_INLINE void pf_ldmatrix_x4(unsigned* r, const void* p, int line = __builtin_LINE()) {
  pf_ldmatrix<4, false>(r, p, line);
}
PF_LDM_INLINE void pf_ldmatrix_x1_trans(unsigned* r, const void* p, int line = __builtin_LINE()) {
  pf_ldmatrix<1, true>(r, p, line);
}
PF_LDM_INLINE void pf_ldmatrix_x2_trans(unsigned* r, const void* p, int line = __builtin_LINE()) {
  pf_ldmatrix<2, true>(r, p, line);
}
PF_LDM_INLINE void pf_ldmatrix_x4_trans(unsigned* r, const void* p, int line = __builtin_LINE()) {
  pf_ldmatrix<4, true>(r, p, line);
}

// cp.async of 16 bytes of which the first `bytes` come from global memory and the rest are
// zero (the prelude's pf_cp_async16: cp.async.cg.shared.global with a run-time src-size, one
// instruction on a GPU): the same copy as __pipeline_memcpy_async with that zero-fill. A macro,
// so the access is reported at the kernel's line.
#define pf_cp_async16(dst, src, bytes) __pipeline_memcpy_async((dst), (src), 16, 16 - (bytes))
