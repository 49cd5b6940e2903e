// pf_half.h -- float16 and bfloat16 of the CUDA headers (cuda_fp16.h, cuda_bf16.h) on the CPU.
//
// Included by pf_emu.h. Storage is the 16-bit pattern; every conversion rounds to nearest even
// as the device does (overflow to infinity, subnormals kept, NaN stays NaN), and each operator
// computes what the sm_80+ device instruction computes: the exact result rounded once to the
// 16-bit type. For + - * / and sqrt, computing in float and rounding to 16 bits is that single
// rounding (float's 24 bits are at least 2p+2 for p = 11 and 8, so the double rounding is
// innocuous); the fused multiply-add rounds the double result to odd float first, which keeps
// it exact. So a kernel that loses precision in half on a GPU loses the same bits here.
//
// The operator set mirrors the CUDA headers: the 16-bit types convert implicitly to and from
// float, and mixed expressions such as `h + 1.0f` are ambiguous there as they are here.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace pf_fp16 {

inline uint32_t bits(float f) { return __builtin_bit_cast(uint32_t, f); }
inline float from_bits(uint32_t u) { return __builtin_bit_cast(float, u); }

// float -> binary16, round to nearest even.
inline uint16_t f32_to_f16(float f) {
  const uint32_t u = bits(f);
  const uint16_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u);  // NaN, inf
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // rounds past 65504: infinity
  if (a < 0x38800000u) {                        // below 2^-14: a subnormal half (or zero)
    if (a < 0x33000000u) return sign;           // below 2^-25: rounds to zero
    const uint32_t e = a >> 23;
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14 - (e - 127) + 13 - 1 ... the subnormal's scale
    uint32_t h = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (h & 1))) ++h;
    return sign | h;
  }
  uint32_t h = ((a - 0x38000000u) >> 13);  // rebias the exponent 127 -> 15
  const uint32_t rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) ++h;
  return sign | h;
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0x1fu) return from_bits(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    float v = std::ldexp((float)m, -24);
    return sign ? -v : v;
  }
  return from_bits(sign | ((e + 112) << 23) | (m << 13));
}

// float -> bfloat16, round to nearest even.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

inline float bf16_to_f32(uint16_t b) { return from_bits((uint32_t)b << 16); }

// double -> float rounded to odd: exact when the result has two bits to spare, which makes a
// following rounding to 16 bits correct (the fused multiply-add's single rounding).
inline float f64_to_f32_odd(double x) {
  float f = (float)x;
  if (!std::isfinite(f) || (double)f == x) return f;
  uint32_t u = bits(f);
  if (std::fabs((double)f) > std::fabs(x)) --u;  // toward zero, then set the sticky bit
  return from_bits(u | 1u);
}

}  // namespace pf_fp16

struct __half {
  uint16_t __x;
  __half() = default;
  __half(float f) : __x(pf_fp16::f32_to_f16(f)) {}
  __half(double d) : __x(pf_fp16::f32_to_f16(pf_fp16::f64_to_f32_odd(d))) {}
  __half(int i) : __half((float)i) {}
  operator float() const { return pf_fp16::f16_to_f32(__x); }
};
using half = __half;

struct __nv_bfloat16 {
  uint16_t __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : __x(pf_fp16::f32_to_bf16(f)) {}
  __nv_bfloat16(double d) : __x(pf_fp16::f32_to_bf16(pf_fp16::f64_to_f32_odd(d))) {}
  __nv_bfloat16(int i) : __nv_bfloat16((float)i) {}
  operator float() const { return pf_fp16::bf16_to_f32(__x); }
};
using nv_bfloat16 = __nv_bfloat16;

struct alignas(4) __half2 {
  __half x, y;
};
using half2 = __half2;
struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
using nv_bfloat162 = __nv_bfloat162;

// ---- conversions ------------------------------------------------------------------------------
inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline float __half2float(__half h) { return (float)h; }
inline __half __double2half(double d) { return __half(d); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return (float)b; }
inline __nv_bfloat16 __double2bfloat16(double d) { return __nv_bfloat16(d); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short u) {
  __half h;
  h.__x = u;
  return h;
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) {
  __nv_bfloat16 b;
  b.__x = u;
  return b;
}
inline __half2 __halves2half2(__half a, __half b) { return __half2{a, b}; }
inline __half2 __floats2half2_rn(float a, float b) { return __half2{__half(a), __half(b)}; }
inline __half2 __float2half2_rn(float a) { return __half2{__half(a), __half(a)}; }
inline __half2 __half2half2(__half a) { return __half2{a, a}; }
inline __half2 __float22half2_rn(float2 v) { return __half2{__half(v.x), __half(v.y)}; }
inline float2 __half22float2(__half2 v) { return float2{(float)v.x, (float)v.y}; }
inline float __low2float(__half2 v) { return (float)v.x; }
inline float __high2float(__half2 v) { return (float)v.y; }
inline __half __low2half(__half2 v) { return v.x; }
inline __half __high2half(__half2 v) { return v.y; }
inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) {
  return __nv_bfloat162{a, b};
}
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return __nv_bfloat162{__nv_bfloat16(a), __nv_bfloat16(b)};
}
inline __nv_bfloat162 __float22bfloat162_rn(float2 v) {
  return __nv_bfloat162{__nv_bfloat16(v.x), __nv_bfloat16(v.y)};
}
inline __nv_bfloat162 __bfloat162bfloat162(__nv_bfloat16 a) { return __nv_bfloat162{a, a}; }
inline __nv_bfloat162 __float2bfloat162_rn(float a) {
  return __nv_bfloat162{__nv_bfloat16(a), __nv_bfloat16(a)};
}
inline float2 __bfloat1622float2(__nv_bfloat162 v) { return float2{(float)v.x, (float)v.y}; }
inline float __low2float(__nv_bfloat162 v) { return (float)v.x; }
inline float __high2float(__nv_bfloat162 v) { return (float)v.y; }

// ---- arithmetic: one rounding to the 16-bit type, as the device instructions ----------------
#define PF_HALF_OPS(T, T2)                                                                     \
  inline T __hadd(T a, T b) { return T((float)a + (float)b); }                               \
  inline T __hsub(T a, T b) { return T((float)a - (float)b); }                               \
  inline T __hmul(T a, T b) { return T((float)a * (float)b); }                               \
  inline T __hdiv(T a, T b) { return T((float)a / (float)b); }                               \
  inline T __hfma(T a, T b, T c) {                                                            \
    return T(pf_fp16::f64_to_f32_odd((double)(float)a * (double)(float)b + (double)(float)c)); \
  }                                                                                           \
  inline T __hneg(T a) {                                                                      \
    T r = a;                                                                                  \
    r.__x ^= 0x8000u;                                                                         \
    return r;                                                                                 \
  }                                                                                           \
  inline T __habs(T a) {                                                                      \
    T r = a;                                                                                  \
    r.__x &= 0x7fffu;                                                                         \
    return r;                                                                                 \
  }                                                                                           \
  inline T __hmax(T a, T b) { return T(fmaxf((float)a, (float)b)); }                          \
  inline T __hmin(T a, T b) { return T(fminf((float)a, (float)b)); }                          \
  inline bool __heq(T a, T b) { return (float)a == (float)b; }                                \
  inline bool __hne(T a, T b) { return (float)a != (float)b; }                                \
  inline bool __hlt(T a, T b) { return (float)a < (float)b; }                                 \
  inline bool __hle(T a, T b) { return (float)a <= (float)b; }                                \
  inline bool __hgt(T a, T b) { return (float)a > (float)b; }                                 \
  inline bool __hge(T a, T b) { return (float)a >= (float)b; }                                \
  inline bool __hisnan(T a) { return std::isnan((float)a); }                                  \
  inline T hsqrt(T a) { return T(sqrtf((float)a)); }                                          \
  inline T hexp(T a) { return T(expf((float)a)); }                                            \
  inline T hlog(T a) { return T(logf((float)a)); }                                            \
  inline T hrcp(T a) { return T(1.0f / (float)a); }                                           \
  inline T operator+(const T& a, const T& b) { return __hadd(a, b); }                         \
  inline T operator-(const T& a, const T& b) { return __hsub(a, b); }                         \
  inline T operator*(const T& a, const T& b) { return __hmul(a, b); }                         \
  inline T operator/(const T& a, const T& b) { return __hdiv(a, b); }                         \
  inline T operator-(const T& a) { return __hneg(a); }                                        \
  inline T operator+(const T& a) { return a; }                                                \
  inline T& operator+=(T& a, const T& b) { return a = __hadd(a, b); }                         \
  inline T& operator-=(T& a, const T& b) { return a = __hsub(a, b); }                         \
  inline T& operator*=(T& a, const T& b) { return a = __hmul(a, b); }                         \
  inline T& operator/=(T& a, const T& b) { return a = __hdiv(a, b); }                         \
  inline bool operator==(const T& a, const T& b) { return __heq(a, b); }                      \
  inline bool operator!=(const T& a, const T& b) { return __hne(a, b); }                      \
  inline bool operator<(const T& a, const T& b) { return __hlt(a, b); }                       \
  inline bool operator<=(const T& a, const T& b) { return __hle(a, b); }                      \
  inline bool operator>(const T& a, const T& b) { return __hgt(a, b); }                       \
  inline bool operator>=(const T& a, const T& b) { return __hge(a, b); }                      \
  inline T2 __hadd2(T2 a, T2 b) { return T2{__hadd(a.x, b.x), __hadd(a.y, b.y)}; }            \
  inline T2 __hsub2(T2 a, T2 b) { return T2{__hsub(a.x, b.x), __hsub(a.y, b.y)}; }            \
  inline T2 __hmul2(T2 a, T2 b) { return T2{__hmul(a.x, b.x), __hmul(a.y, b.y)}; }            \
  inline T2 __h2div(T2 a, T2 b) { return T2{__hdiv(a.x, b.x), __hdiv(a.y, b.y)}; }            \
  /* the _rn forms (never contracted into an fma on the device): the exact result rounded  */ \
  /* once, computed apart from the float path above (in double, rounded to odd float first) */ \
  inline T2 __hadd2_rn(T2 a, T2 b) {                                                          \
    return T2{T((double)(float)a.x + (double)(float)b.x), T((double)(float)a.y + (double)(float)b.y)}; \
  }                                                                                           \
  inline T2 __hsub2_rn(T2 a, T2 b) {                                                          \
    return T2{T((double)(float)a.x - (double)(float)b.x), T((double)(float)a.y - (double)(float)b.y)}; \
  }                                                                                           \
  inline T2 __hmul2_rn(T2 a, T2 b) {                                                          \
    return T2{T((double)(float)a.x * (double)(float)b.x), T((double)(float)a.y * (double)(float)b.y)}; \
  }                                                                                           \
  inline T2 __hfma2(T2 a, T2 b, T2 c) {                                                       \
    return T2{__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)};                                  \
  }                                                                                           \
  inline T2 __hmax2(T2 a, T2 b) { return T2{__hmax(a.x, b.x), __hmax(a.y, b.y)}; }            \
  inline T2 __hmin2(T2 a, T2 b) { return T2{__hmin(a.x, b.x), __hmin(a.y, b.y)}; }            \
  inline T2 __hneg2(T2 a) { return T2{__hneg(a.x), __hneg(a.y)}; }                            \
  inline T2 operator+(const T2& a, const T2& b) { return __hadd2(a, b); }                     \
  inline T2 operator-(const T2& a, const T2& b) { return __hsub2(a, b); }                     \
  inline T2 operator*(const T2& a, const T2& b) { return __hmul2(a, b); }                     \
  inline T2 operator/(const T2& a, const T2& b) { return __h2div(a, b); }                     \
  inline T2& operator+=(T2& a, const T2& b) { return a = __hadd2(a, b); }                     \
  inline T2& operator*=(T2& a, const T2& b) { return a = __hmul2(a, b); }
PF_HALF_OPS(__half, __half2)
PF_HALF_OPS(__nv_bfloat16, __nv_bfloat162)
#undef PF_HALF_OPS
