// pf_emu.h -- CUDA-on-CPU emulation header of polyfuse.
//
// Force-included (g++ -include) into every kernel translation unit after the text pre-pass of
// polyfuse/cuda/emulator.py. It maps the CUDA device dialect onto C++: threadIdx & co. come from
// the current fiber (found from the stack pointer: every fiber stack is a 256 KiB aligned slot
// whose first pages hold the fiber descriptor), global pointers are instrumented wrappers that
// bounds-check and record unique elements read/written, __shared__ variables live in a per-block
// arena, and barriers, warp operations and cp.async call into the runtime library
// (pf_emu_rt.cpp) through the pf_api table installed by pf_module().
//
// The first part (ABI structs) is shared with the runtime, which defines PF_EMU_RUNTIME.
#pragma once

#include <cassert>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

#define PF_ABI_VERSION 2
#define PF_SLOT_SHIFT 18 /* fiber slot: 256 KiB, aligned to its size */
#define PF_MAX_SITES 512 /* static __shared__ declarations per translation unit */
#define PF_FIBER_MAGIC 0x50464942u
#define PF_EXPORT extern "C" __attribute__((visibility("default")))

// ------------------------------------------------------------------------------------------
// ABI shared with the runtime
// ------------------------------------------------------------------------------------------

struct uint3 {
  unsigned int x, y, z;
};

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

// One global buffer as a kernel sees it (args[i] of a launch points to a pf_buf*).
#define PF_REQ_SLOTS 64  // host-thread slots of pf_buf::req

struct pf_buf {
  char* base;
  uint64_t nbytes;
  uint32_t itemsize;
  uint32_t shift;  // log2(itemsize)
  uint8_t* rmap;   // one byte per element: read during this launch
  uint8_t* wmap;   // one byte per element: written during this launch
  const char* name;
  // Requested bytes during this launch (every access, repeats included): [slot][read, write],
  // one 64-byte line per host-thread slot, so counting never contends between threads.
  uint64_t (*req)[8];
};

struct pf_block_pub {
  char* arena;  // shared memory of the block (dynamic part first)
  char* dyn;
  uint64_t dyn_bytes;
  uint32_t gen;  // bumped per block: site_gen[s] == gen means site s is allocated
  uint32_t pad;
  uint32_t site_gen[PF_MAX_SITES];
  uint32_t site_off[PF_MAX_SITES];
};

struct pf_fiber_pub {
  uint3 tid;
  uint3 bid;
  dim3 bdim;
  dim3 gdim;
  pf_block_pub* blk;
  uint32_t linear;  // linear thread index in the block
  uint32_t magic;
};

struct pf_kernel_info {
  const char* name;
  void (*thunk)(void** args);
};

enum pf_warp_op : int {
  PF_W_SYNC = 0,
  PF_W_SHFL = 1,
  PF_W_UP = 2,
  PF_W_DOWN = 3,
  PF_W_XOR = 4,
  PF_W_BALLOT = 5,
  PF_W_ANY = 6,
  PF_W_ALL = 7,
  PF_W_MATCH = 8,
  PF_W_ACTIVE = 9,
};

enum pf_access : int { PF_READ = 0, PF_WRITE = 1 };

struct pf_api_t {
  uint32_t abi;
  int (*barrier)(int kind, int line, int pred);  // kind 0 plain, 1 count, 2 and, 3 or
  uint64_t (*warp)(int op, unsigned mask, uint64_t val, int arg, int width, int line);
  void* (*shared_alloc)(int site, uint64_t size, uint64_t align);
  void (*cp_async)(void* dst, const void* src, uint64_t size, uint64_t zfill);
  void (*cp_commit)();
  void (*cp_wait)(uint64_t n);
  void (*bad_access)(const pf_buf* b, const void* p, uint64_t size, int access);
  void (*fail)(const char* msg);
  int (*launch)(const pf_kernel_info* k, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                unsigned by, unsigned bz, unsigned shmem, void** args);
  // Race detector (libraries built with PF_RACECHECK): a plain access of [p, p + size) by
  // the running CUDA thread (shared memory; other addresses are ignored), and a plain access
  // of element(s) of a global buffer; pc is the address of the access in the kernel library.
  void (*race_mem)(const void* p, uint64_t size, int access, const void* pc);
  void (*race_global)(const pf_buf* b, uint64_t off, uint64_t size, int access, const void* pc);
};

// What a race report holds (pf_result.msg when its status is 5, written by the runtime).
struct pf_race_report {
  int32_t kind;      // 0 read after write, 1 write after read, 2 write after write
  int32_t space;     // 0 shared memory, 1 global memory
  int32_t index;     // shared: __shared__ site (-1 dynamic shared memory); global: buffer
  uint32_t size;     // bytes of the second access
  uint64_t offset;   // byte offset in the site / dynamic shared memory / buffer
  uint32_t first[6];   // thread x y z, block x y z of the earlier access
  uint32_t second[6];  // ... of the access that conflicts with it
  uint64_t pc[2];      // their addresses, relative to the kernel library's load address
  char kernel[256];
};

struct pf_kernel_desc {
  const char* name;
  void* launch;  // int pf_launch_NAME(gx, gy, gz, bx, by, bz, shmem, void** args)
  const char* sig;
};

struct pf_module_desc {
  uint32_t abi;
  uint32_t nkernels;
  const pf_kernel_desc* kernels;
};

__attribute__((always_inline)) inline pf_fiber_pub* pf_cur() {
  uintptr_t sp;
#if defined(__x86_64__)
  asm("movq %%rsp, %0" : "=r"(sp));
#elif defined(__aarch64__)
  asm("mov %0, sp" : "=r"(sp));
#else
  sp = (uintptr_t)__builtin_frame_address(0);
#endif
  // The descriptor sits at the start of the slot, staggered by 64 bytes per slot (mod 64) so
  // that the descriptors of a block's fibers do not all fall into one cache set.
  uintptr_t base = sp & ~(((uintptr_t)1 << PF_SLOT_SHIFT) - 1);
  return (pf_fiber_pub*)(base + (((base >> PF_SLOT_SHIFT) & 63) << 6));
}

#ifndef PF_EMU_RUNTIME
// ------------------------------------------------------------------------------------------
// CUDA dialect for kernel translation units
// ------------------------------------------------------------------------------------------

__attribute__((visibility("hidden"))) inline const pf_api_t* pf_api = nullptr;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __constant__
#define __managed__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __shared__ PF_SHARED_DECLARATION_NOT_REWRITTEN_BY_THE_EMULATOR_PREPASS
#define __CUDACC__ 1
#define __CUDA_ARCH__ 800
#define warpSize 32

#define threadIdx (static_cast<const uint3&>(pf_cur()->tid))
#define blockIdx (static_cast<const uint3&>(pf_cur()->bid))
#define blockDim (static_cast<const dim3&>(pf_cur()->bdim))
#define gridDim (static_cast<const dim3&>(pf_cur()->gdim))

#ifndef CUDART_INF_F
#define CUDART_INF_F INFINITY
#define CUDART_NAN_F NAN
#define CUDART_PI_F 3.141592654f
#endif

// ---- vector types -------------------------------------------------------------------------
#define PF_VEC2(T, N, A)                                 \
  struct alignas(A) N##2 {                               \
    T x, y;                                              \
  };                                                     \
  inline N##2 make_##N##2(T x, T y) { return N##2{x, y}; }
#define PF_VEC3(T, N)                                                 \
  struct N##3 {                                                       \
    T x, y, z;                                                        \
  };                                                                  \
  inline N##3 make_##N##3(T x, T y, T z) { return N##3{x, y, z}; }
#define PF_VEC4(T, N, A)                                                        \
  struct alignas(A) N##4 {                                                      \
    T x, y, z, w;                                                               \
  };                                                                            \
  inline N##4 make_##N##4(T x, T y, T z, T w) { return N##4{x, y, z, w}; }
PF_VEC2(float, float, 8)
PF_VEC3(float, float)
PF_VEC4(float, float, 16)
PF_VEC2(int, int, 8)
PF_VEC3(int, int)
PF_VEC4(int, int, 16)
PF_VEC2(unsigned int, uint, 8)
PF_VEC4(unsigned int, uint, 16)
PF_VEC2(double, double, 16)
PF_VEC2(long long, longlong, 16)
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return uint3{x, y, z}; }

// ---- float16 and bfloat16 (cuda_fp16.h, cuda_bf16.h) ----------------------------------------
#include "pf_half.h"

// ---- instrumented global memory --------------------------------------------------------------

[[gnu::cold, gnu::noinline]] inline void pf_bad(const pf_buf* b, const void* p, uint64_t size,
                                                int access) {
  pf_api->bad_access(b, p, size, access);
  __builtin_unreachable();
}

inline int pf_req_next_slot = 0;
inline thread_local int pf_req_slot_id = -1;

// This host thread's slot in pf_buf::req (assigned on first use).
inline int pf_req_slot() {
  if (__builtin_expect(pf_req_slot_id < 0, 0))
    pf_req_slot_id = __atomic_fetch_add(&pf_req_next_slot, 1, __ATOMIC_RELAXED) % PF_REQ_SLOTS;
  return pf_req_slot_id;
}

#ifdef PF_RACECHECK
// Out of line (its caller's return address is the access) and not instrumented itself.
#define PF_TOUCH_ATTR __attribute__((noinline, no_sanitize_thread))
#else
#define PF_TOUCH_ATTR __attribute__((always_inline))
#endif

// Bounds/alignment check and mark the elements [p, p + size) in the read or write map (and,
// in a race-check build, tell the race detector; atomics are never races).
template <int W, bool Atomic = false>
PF_TOUCH_ATTR inline void pf_touch(const pf_buf* b, const void* p, uint64_t size,
                                   uint64_t align) {
  uint64_t off = (uint64_t)((const char*)p - b->base);
  if (__builtin_expect(off >= b->nbytes || b->nbytes - off < size || (off & (align - 1)), 0))
    pf_bad(b, p, size, W);
  __atomic_fetch_add(&b->req[pf_req_slot()][W], size, __ATOMIC_RELAXED);  // own line: no contention
  uint8_t* m = W ? b->wmap : b->rmap;
  uint64_t e = off >> b->shift, last = (off + size - 1) >> b->shift;
  for (; e <= last; ++e)
    if (!__atomic_load_n(m + e, __ATOMIC_RELAXED)) __atomic_store_n(m + e, 1, __ATOMIC_RELAXED);
#ifdef PF_RACECHECK
  if (!Atomic) pf_api->race_global(b, off, size, W, __builtin_return_address(0));
#endif
}

template <class T>
struct pf_gptr;

// What p[i] returns for a global pointer: reads and writes go through here.
template <class T>
struct pf_ref {
  using V = std::remove_cv_t<T>;
  T* p;
  const pf_buf* b;

  __attribute__((always_inline)) V load() const {
    pf_touch<PF_READ>(b, p, sizeof(T), alignof(T));
    return *p;
  }
  __attribute__((always_inline)) void store(V v) const
    requires(!std::is_const_v<T>)
  {
    pf_touch<PF_WRITE>(b, p, sizeof(T), alignof(T));
    *p = v;
  }
  __attribute__((always_inline)) operator V() const { return load(); }
  __attribute__((always_inline)) const pf_ref& operator=(V v) const
    requires(!std::is_const_v<T>)
  {
    store(v);
    return *this;
  }
  __attribute__((always_inline)) const pf_ref& operator=(const pf_ref& o) const
    requires(!std::is_const_v<T>)
  {
    store(o.load());
    return *this;
  }
  template <class U>
  const pf_ref& operator=(const pf_ref<U>& o) const
    requires(!std::is_const_v<T>)
  {
    store(static_cast<V>(o.load()));
    return *this;
  }
#define PF_COMPOUND(OP)                          \
  template <class U>                             \
  __attribute__((always_inline)) const pf_ref& operator OP##=(U&& v) const \
    requires(!std::is_const_v<T>)                \
  {                                              \
    V t = load();                                \
    t OP##= std::forward<U>(v);                  \
    store(t);                                    \
    return *this;                                \
  }
  PF_COMPOUND(+)
  PF_COMPOUND(-)
  PF_COMPOUND(*)
  PF_COMPOUND(/)
  PF_COMPOUND(%)
  PF_COMPOUND(&)
  PF_COMPOUND(|)
  PF_COMPOUND(^)
  PF_COMPOUND(<<)
  PF_COMPOUND(>>)
#undef PF_COMPOUND
  const pf_ref& operator++() const { return *this += 1; }
  const pf_ref& operator--() const { return *this -= 1; }
  V operator++(int) const {
    V t = load();
    store(t + 1);
    return t;
  }
  V operator--(int) const {
    V t = load();
    store(t - 1);
    return t;
  }
  pf_gptr<T> operator&() const { return pf_gptr<T>{p, b}; }
};

// A kernel's global pointer parameter: a raw pointer plus the buffer it points into.
template <class T>
struct pf_gptr {
  T* p = nullptr;
  const pf_buf* b = nullptr;

  pf_ref<T> operator[](ptrdiff_t i) const { return pf_ref<T>{p + i, b}; }
  pf_ref<T> operator*() const { return pf_ref<T>{p, b}; }
  pf_gptr operator+(ptrdiff_t i) const { return pf_gptr{p + i, b}; }
  pf_gptr operator-(ptrdiff_t i) const { return pf_gptr{p - i, b}; }
  friend pf_gptr operator+(ptrdiff_t i, pf_gptr g) { return pf_gptr{g.p + i, g.b}; }
  ptrdiff_t operator-(const pf_gptr& o) const { return p - o.p; }
  pf_gptr& operator+=(ptrdiff_t i) {
    p += i;
    return *this;
  }
  pf_gptr& operator-=(ptrdiff_t i) {
    p -= i;
    return *this;
  }
  pf_gptr& operator++() {
    ++p;
    return *this;
  }
  pf_gptr& operator--() {
    --p;
    return *this;
  }
  pf_gptr operator++(int) { return pf_gptr{p++, b}; }
  pf_gptr operator--(int) { return pf_gptr{p--, b}; }
  bool operator==(const pf_gptr& o) const { return p == o.p; }
  auto operator<=>(const pf_gptr& o) const { return p <=> o.p; }
  explicit operator bool() const { return p != nullptr; }
  operator pf_gptr<const T>() const
    requires(!std::is_const_v<T>)
  {
    return pf_gptr<const T>{p, b};
  }
};

template <class T>
struct pf_value {
  using type = T;
};
template <class T>
struct pf_value<pf_ref<T>> {
  using type = std::remove_cv_t<T>;
};
template <class T>
using pf_value_t = typename pf_value<std::remove_cvref_t<T>>::type;

template <class T>
struct pf_is_gptr : std::false_type {};
template <class T>
struct pf_is_gptr<pf_gptr<T>> : std::true_type {};

// The pointee of a raw or instrumented pointer (void: not a pointer the check knows).
template <class X>
struct pf_pointee {
  using type = void;
  static constexpr bool known = false;
};
template <class U>
struct pf_pointee<U*> {
  using type = U;
  static constexpr bool known = true;
};
template <class U>
struct pf_pointee<pf_gptr<U>> {
  using type = U;
  static constexpr bool known = true;
};
// Whether a local `T* p = init;` (rewritten `auto p = init;`) would compile as CUDA: init's
// pointer converts to T*.
template <class T, class Actual>
constexpr bool pf_pointer_fits() {
  using P = pf_pointee<std::decay_t<Actual>>;
  return !P::known || std::is_convertible<typename P::type*, T*>::value;
}

// reinterpret_cast<...>(...) in kernel sources is rewritten to this.
template <class To, class T>
  requires std::is_pointer_v<To>
pf_gptr<std::remove_pointer_t<To>> pf_reinterpret_cast(pf_gptr<T> g) {
  return {reinterpret_cast<To>(g.p), g.b};
}
template <class To, class From>
  requires(!pf_is_gptr<std::remove_cvref_t<From>>::value)
To pf_reinterpret_cast(From&& f) {
  return reinterpret_cast<To>(f);
}

template <class T>
inline std::remove_cv_t<T> __ldg(pf_gptr<T> p) {
  return *p;
}
template <class T>
inline T __ldg(const T* p) {
  return *p;
}

// ---- shared memory -----------------------------------------------------------------------

__attribute__((always_inline)) inline void* pf_shared(int site, uint64_t size, uint64_t align) {
  pf_block_pub* blk = pf_cur()->blk;
  if (__builtin_expect(blk->site_gen[site] == blk->gen, 1)) return blk->arena + blk->site_off[site];
  return pf_api->shared_alloc(site, size, align);
}
template <class T>
__attribute__((always_inline)) inline T* pf_dyn_shared() {
  return reinterpret_cast<T*>(pf_cur()->blk->dyn);
}

// ---- barriers, warp operations --------------------------------------------------------------

inline void __syncthreads(int line = __builtin_LINE()) { pf_api->barrier(0, line, 0); }
inline int __syncthreads_count(int pred, int line = __builtin_LINE()) {
  return pf_api->barrier(1, line, pred);
}
inline int __syncthreads_and(int pred, int line = __builtin_LINE()) {
  return pf_api->barrier(2, line, pred);
}
inline int __syncthreads_or(int pred, int line = __builtin_LINE()) {
  return pf_api->barrier(3, line, pred);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, int line = __builtin_LINE()) {
  pf_api->warp(PF_W_SYNC, mask, 0, 0, 32, line);
}
// The lanes of the warp that reach this call site together (the others have exited or wait
// elsewhere): the emulator's model of a converged group of lanes.
inline unsigned __activemask(int line = __builtin_LINE()) {
  return (unsigned)pf_api->warp(PF_W_ACTIVE, 0, 0, 0, 32, line);
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

template <class T>
inline uint64_t pf_bits(const T& v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "warp op on a large type");
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(T));
  return u;
}
template <class T>
inline T pf_unbits(uint64_t u) {
  T v;
  std::memcpy(&v, &u, sizeof(T));
  return v;
}
#define PF_SHFL(NAME, OP, ARGT)                                                          \
  template <class T>                                                                     \
  inline pf_value_t<T> NAME(unsigned mask, const T& var, ARGT arg, int width = 32,       \
                            int line = __builtin_LINE()) {                               \
    using U = pf_value_t<T>;                                                             \
    U v = var;                                                                           \
    return pf_unbits<U>(pf_api->warp(OP, mask, pf_bits(v), (int)arg, width, line));      \
  }
PF_SHFL(__shfl_sync, PF_W_SHFL, int)
PF_SHFL(__shfl_up_sync, PF_W_UP, unsigned)
PF_SHFL(__shfl_down_sync, PF_W_DOWN, unsigned)
PF_SHFL(__shfl_xor_sync, PF_W_XOR, int)
#undef PF_SHFL
inline unsigned __ballot_sync(unsigned mask, int pred, int line = __builtin_LINE()) {
  return (unsigned)pf_api->warp(PF_W_BALLOT, mask, pred != 0, 0, 32, line);
}
inline int __any_sync(unsigned mask, int pred, int line = __builtin_LINE()) {
  return (int)pf_api->warp(PF_W_ANY, mask, pred != 0, 0, 32, line);
}
inline int __all_sync(unsigned mask, int pred, int line = __builtin_LINE()) {
  return (int)pf_api->warp(PF_W_ALL, mask, pred != 0, 0, 32, line);
}
template <class T>
inline unsigned __match_any_sync(unsigned mask, const T& value, int line = __builtin_LINE()) {
  pf_value_t<T> v = value;
  return (unsigned)pf_api->warp(PF_W_MATCH, mask, pf_bits(v), 0, 32, line);
}

// ---- cp.async (cuda_pipeline.h primitives) ---------------------------------------------------

inline void __pipeline_memcpy_async(void* dst, const void* src, size_t size, size_t zfill = 0) {
  pf_api->cp_async(dst, src, size, zfill);
}
template <class T>
inline void __pipeline_memcpy_async(void* dst, pf_gptr<T> src, size_t size, size_t zfill = 0) {
  if (size > zfill) pf_touch<PF_READ>(src.b, src.p, size - zfill, size < 16 ? size : 16);
  pf_api->cp_async(dst, src.p, size, zfill);
}
inline void __pipeline_commit() { pf_api->cp_commit(); }
inline void __pipeline_wait_prior(size_t n) { pf_api->cp_wait(n); }

// ---- atomics ---------------------------------------------------------------------------------

#define PF_ATOMIC_INT(T)                                                                       \
  inline T atomicAdd(T* a, T v) { return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); }         \
  inline T atomicSub(T* a, T v) { return __atomic_fetch_sub(a, v, __ATOMIC_RELAXED); }         \
  inline T atomicAnd(T* a, T v) { return __atomic_fetch_and(a, v, __ATOMIC_RELAXED); }         \
  inline T atomicOr(T* a, T v) { return __atomic_fetch_or(a, v, __ATOMIC_RELAXED); }           \
  inline T atomicXor(T* a, T v) { return __atomic_fetch_xor(a, v, __ATOMIC_RELAXED); }         \
  inline T atomicExch(T* a, T v) { return __atomic_exchange_n(a, v, __ATOMIC_RELAXED); }       \
  inline T atomicCAS(T* a, T cmp, T v) {                                                       \
    __atomic_compare_exchange_n(a, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);        \
    return cmp;                                                                                \
  }                                                                                            \
  inline T atomicMax(T* a, T v) {                                                              \
    T old = __atomic_load_n(a, __ATOMIC_RELAXED);                                              \
    while (old < v &&                                                                          \
           !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) \
      ;                                                                                        \
    return old;                                                                                \
  }                                                                                            \
  inline T atomicMin(T* a, T v) {                                                              \
    T old = __atomic_load_n(a, __ATOMIC_RELAXED);                                              \
    while (old > v &&                                                                          \
           !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) \
      ;                                                                                        \
    return old;                                                                                \
  }
PF_ATOMIC_INT(int)
PF_ATOMIC_INT(unsigned int)
PF_ATOMIC_INT(long long)
PF_ATOMIC_INT(unsigned long long)
#undef PF_ATOMIC_INT

template <class F, class U, class Op>
inline F pf_atomic_float(F* a, Op op) {
  U* u = reinterpret_cast<U*>(a);
  U old = __atomic_load_n(u, __ATOMIC_RELAXED);
  for (;;) {
    F f;
    std::memcpy(&f, &old, sizeof f);
    F nf = op(f);
    U nu;
    std::memcpy(&nu, &nf, sizeof nu);
    if (__atomic_compare_exchange_n(u, &old, nu, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
      return f;
  }
}
inline float atomicAdd(float* a, float v) {
  return pf_atomic_float<float, uint32_t>(a, [v](float f) { return f + v; });
}
inline double atomicAdd(double* a, double v) {
  return pf_atomic_float<double, uint64_t>(a, [v](double f) { return f + v; });
}
inline float atomicExch(float* a, float v) {
  return pf_atomic_float<float, uint32_t>(a, [v](float) { return v; });
}
inline unsigned atomicInc(unsigned* a, unsigned lim) {
  unsigned old = __atomic_load_n(a, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(a, &old, old >= lim ? 0u : old + 1, true, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED))
    ;
  return old;
}
inline unsigned atomicDec(unsigned* a, unsigned lim) {
  unsigned old = __atomic_load_n(a, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(a, &old, (old == 0 || old > lim) ? lim : old - 1, true,
                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    ;
  return old;
}

// On a global pointer (&y[i], y + i): check bounds, count a read and a write, then operate.
#define PF_GATOMIC(NAME)                                                            \
  template <class T, class... A>                                                    \
  inline auto NAME(pf_gptr<T> g, A... a) -> decltype(NAME(g.p, a...)) {            \
    pf_touch<PF_READ, true>(g.b, g.p, sizeof(T), alignof(T));                       \
    pf_touch<PF_WRITE, true>(g.b, g.p, sizeof(T), alignof(T));                      \
    return NAME(g.p, a...);                                                         \
  }
PF_GATOMIC(atomicAdd)
PF_GATOMIC(atomicSub)
PF_GATOMIC(atomicAnd)
PF_GATOMIC(atomicOr)
PF_GATOMIC(atomicXor)
PF_GATOMIC(atomicExch)
PF_GATOMIC(atomicCAS)
PF_GATOMIC(atomicMax)
PF_GATOMIC(atomicMin)
PF_GATOMIC(atomicInc)
PF_GATOMIC(atomicDec)
#undef PF_GATOMIC

// ---- device math -----------------------------------------------------------------------------

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __exp10f(float x) { return powf(10.0f, x); }
inline float exp10f(float x) { return powf(10.0f, x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __fadd_rn(float x, float y) { return x + y; }
inline float __fsub_rn(float x, float y) { return x - y; }
inline float __fmul_rn(float x, float y) { return x * y; }
inline float __fdiv_rn(float x, float y) { return x / y; }
inline float __fmaf_rn(float x, float y, float z) { return fmaf(x, y, z); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline int __float_as_int(float x) { return __builtin_bit_cast(int, x); }
inline unsigned __float_as_uint(float x) { return __builtin_bit_cast(unsigned, x); }
inline float __int_as_float(int x) { return __builtin_bit_cast(float, x); }
inline float __uint_as_float(unsigned x) { return __builtin_bit_cast(float, x); }
inline long long __double_as_longlong(double x) { return __builtin_bit_cast(long long, x); }
inline double __longlong_as_double(long long x) { return __builtin_bit_cast(double, x); }
// CUDA's cvt.r*i.s32.f32: saturating at the int range, NaN to 0 (where a C cast is undefined;
// x86 gives INT_MIN). r is already rounded to an integral value.
inline int pf_float2int_sat(float r) {
  if (r != r) return 0;
  if (r >= 2147483648.0f) return INT_MAX;
  if (r <= -2147483648.0f) return INT_MIN;
  return (int)r;
}
inline int __float2int_rn(float x) { return pf_float2int_sat(nearbyintf(x)); }
inline int __float2int_rz(float x) { return pf_float2int_sat(truncf(x)); }
inline int __float2int_rd(float x) { return pf_float2int_sat(floorf(x)); }
// cvt.rzi.s32.f64 / cvt.rzi.s64.f{32,64}: toward zero, saturating, NaN to 0.
inline int __double2int_rz(double x) {
  const double r = trunc(x);
  if (r != r) return 0;
  if (r >= 2147483648.0) return INT_MAX;
  if (r <= -2147483648.0) return INT_MIN;
  return (int)r;
}
inline long long __double2ll_rz(double x) {
  const double r = trunc(x);
  if (r != r) return 0;
  if (r >= 9223372036854775808.0) return LLONG_MAX;
  if (r <= -9223372036854775808.0) return LLONG_MIN;
  return (long long)r;
}
inline long long __float2ll_rz(float x) { return __double2ll_rz((double)x); }
inline int __float2int_ru(float x) { return pf_float2int_sat(ceilf(x)); }
inline float __int2float_rn(int x) { return (float)x; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
  return __builtin_bswap32(x);
}
inline int __mul24(int a, int b) { return a * b; }
inline unsigned __umul24(unsigned a, unsigned b) { return a * b; }
inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) {
  return (unsigned)(((unsigned long long)a * b) >> 32);
}

#define PF_MINMAX(T)                                \
  inline T min(T a, T b) { return a < b ? a : b; } \
  inline T max(T a, T b) { return a > b ? a : b; }
PF_MINMAX(int)
PF_MINMAX(unsigned int)
PF_MINMAX(long)
PF_MINMAX(unsigned long)
PF_MINMAX(long long)
PF_MINMAX(unsigned long long)
#undef PF_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
template <class A, class B>
  requires(std::is_arithmetic_v<A> && std::is_arithmetic_v<B> && !std::is_same_v<A, B>)
inline std::common_type_t<A, B> min(A a, B b) {
  return min(std::common_type_t<A, B>(a), std::common_type_t<A, B>(b));
}
template <class A, class B>
  requires(std::is_arithmetic_v<A> && std::is_arithmetic_v<B> && !std::is_same_v<A, B>)
inline std::common_type_t<A, B> max(A a, B b) {
  return max(std::common_type_t<A, B>(a), std::common_type_t<A, B>(b));
}
using std::abs;

// ---- tensor cores: mma.sync, ldmatrix (the prelude of polyfuse/cuda/tensor_core.py) -------
#include "pf_mma.h"

// ---- kernel entry glue (used by the code the pre-pass appends) --------------------------------

template <class P>
struct pf_arg {
  static P get(void* a) {
    P v;
    std::memcpy(&v, a, sizeof(P));
    return v;
  }
};
template <class T>
struct pf_arg<pf_gptr<T>> {
  static pf_gptr<T> get(void* a) {
    pf_buf* b = *static_cast<pf_buf**>(a);
    return pf_gptr<T>{reinterpret_cast<T*>(b->base), b};
  }
};
template <class... P, size_t... I>
inline void pf_call(void (*f)(P...), void** a, std::index_sequence<I...>) {
  f(pf_arg<P>::get(a[I])...);
}
template <class... P>
inline void pf_invoke(void (*f)(P...), void** a) {
  pf_call(f, a, std::index_sequence_for<P...>{});
}
template <auto F>
void pf_thunk(void** a) {
  pf_invoke(F, a);
}

// Parameter signature: one token per parameter, "p" (global pointer) or "s" (scalar), then the
// kind (f float, g bfloat16, i signed, u unsigned, b bool, v other) and the size in bytes; comma-separated.
template <class T>
constexpr char pf_kind() {
  if constexpr (std::is_same_v<std::remove_cv_t<T>, bool>) return 'b';
  else if constexpr (std::is_same_v<std::remove_cv_t<T>, __half>) return 'f';
  else if constexpr (std::is_same_v<std::remove_cv_t<T>, __nv_bfloat16>) return 'g';
  else if constexpr (std::is_floating_point_v<T>) return 'f';
  else if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) return 'i';
  else if constexpr (std::is_integral_v<T>) return 'u';
  else return 'v';
}
template <class P>
struct pf_param_sig {
  static void put(char*& s) {
    s += std::sprintf(s, "s%c%zu,", pf_kind<P>(), sizeof(P));
  }
};
template <class T>
struct pf_param_sig<pf_gptr<T>> {
  static void put(char*& s) {
    s += std::sprintf(s, "p%c%zu,", pf_kind<std::remove_cv_t<T>>(), sizeof(T));
  }
};
template <class... P>
inline const char* pf_sig(void (*)(P...), char* buf) {
  char* s = buf;
  *s = 0;
  (pf_param_sig<P>::put(s), ...);
  if (s != buf) s[-1] = 0;
  return buf;
}

#ifdef PF_RACECHECK
// ---- race-check build: the compiler's ThreadSanitizer instrumentation, our own hooks ---------
//
// A race-check library is compiled with -fsanitize=thread but not linked with libtsan: GCC
// calls __tsan_readN/__tsan_writeN before every load and store that may touch memory other
// threads see, and these definitions forward each plain access to the runtime's shadow memory
// (which keeps only shared-memory accesses; global ones arrive through pf_touch, which knows
// the buffer). Atomics are performed as such and are never races.
#define PF_HOOK extern "C" __attribute__((no_sanitize_thread, noinline, used))
__attribute__((no_sanitize_thread, always_inline)) inline void pf_race(const void* p,
                                                                       uint64_t n, int w,
                                                                       const void* pc) {
  if (pf_api) pf_api->race_mem(p, n, w, pc);
}
PF_HOOK void __tsan_init() {}
PF_HOOK void __tsan_func_entry(void*) {}
PF_HOOK void __tsan_func_exit() {}
PF_HOOK void __tsan_vptr_update(void**, void*) {}
PF_HOOK void __tsan_vptr_read(void**) {}
#define PF_TSAN_ACCESS(N)                                                                       \
  PF_HOOK void __tsan_read##N(const void* p) { pf_race(p, N, PF_READ, __builtin_return_address(0)); } \
  PF_HOOK void __tsan_write##N(void* p) { pf_race(p, N, PF_WRITE, __builtin_return_address(0)); } \
  PF_HOOK void __tsan_unaligned_read##N(const void* p) {                                        \
    pf_race(p, N, PF_READ, __builtin_return_address(0));                                        \
  }                                                                                             \
  PF_HOOK void __tsan_unaligned_write##N(void* p) {                                             \
    pf_race(p, N, PF_WRITE, __builtin_return_address(0));                                       \
  }                                                                                             \
  PF_HOOK void __tsan_volatile_read##N(const void* p) {                                         \
    pf_race(p, N, PF_READ, __builtin_return_address(0));                                        \
  }                                                                                             \
  PF_HOOK void __tsan_volatile_write##N(void* p) {                                              \
    pf_race(p, N, PF_WRITE, __builtin_return_address(0));                                       \
  }
PF_TSAN_ACCESS(1)
PF_TSAN_ACCESS(2)
PF_TSAN_ACCESS(4)
PF_TSAN_ACCESS(8)
PF_TSAN_ACCESS(16)
#undef PF_TSAN_ACCESS
PF_HOOK void __tsan_read_range(const void* p, unsigned long n) {
  pf_race(p, n, PF_READ, __builtin_return_address(0));
}
PF_HOOK void __tsan_write_range(void* p, unsigned long n) {
  pf_race(p, n, PF_WRITE, __builtin_return_address(0));
}
#define PF_SEQ __ATOMIC_SEQ_CST
#define PF_TSAN_ATOMIC(N, T)                                                                    \
  PF_HOOK T __tsan_atomic##N##_load(const volatile T* a, int) { return __atomic_load_n(a, PF_SEQ); } \
  PF_HOOK void __tsan_atomic##N##_store(volatile T* a, T v, int) { __atomic_store_n(a, v, PF_SEQ); } \
  PF_HOOK T __tsan_atomic##N##_exchange(volatile T* a, T v, int) {                              \
    return __atomic_exchange_n(a, v, PF_SEQ);                                                   \
  }                                                                                             \
  PF_HOOK T __tsan_atomic##N##_fetch_add(volatile T* a, T v, int) {                             \
    return __atomic_fetch_add(a, v, PF_SEQ);                                                    \
  }                                                                                             \
  PF_HOOK T __tsan_atomic##N##_fetch_sub(volatile T* a, T v, int) {                             \
    return __atomic_fetch_sub(a, v, PF_SEQ);                                                    \
  }                                                                                             \
  PF_HOOK T __tsan_atomic##N##_fetch_and(volatile T* a, T v, int) {                             \
    return __atomic_fetch_and(a, v, PF_SEQ);                                                    \
  }                                                                                             \
  PF_HOOK T __tsan_atomic##N##_fetch_or(volatile T* a, T v, int) {                              \
    return __atomic_fetch_or(a, v, PF_SEQ);                                                     \
  }                                                                                             \
  PF_HOOK T __tsan_atomic##N##_fetch_xor(volatile T* a, T v, int) {                             \
    return __atomic_fetch_xor(a, v, PF_SEQ);                                                    \
  }                                                                                             \
  PF_HOOK T __tsan_atomic##N##_fetch_nand(volatile T* a, T v, int) {                            \
    return __atomic_fetch_nand(a, v, PF_SEQ);                                                   \
  }                                                                                             \
  PF_HOOK int __tsan_atomic##N##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) {  \
    return __atomic_compare_exchange_n(a, c, v, false, PF_SEQ, PF_SEQ);                         \
  }                                                                                             \
  PF_HOOK int __tsan_atomic##N##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) {    \
    return __atomic_compare_exchange_n(a, c, v, true, PF_SEQ, PF_SEQ);                          \
  }                                                                                             \
  PF_HOOK T __tsan_atomic##N##_compare_exchange_val(volatile T* a, T c, T v, int, int) {        \
    __atomic_compare_exchange_n(a, &c, v, false, PF_SEQ, PF_SEQ);                               \
    return c;                                                                                   \
  }
PF_TSAN_ATOMIC(8, uint8_t)
PF_TSAN_ATOMIC(16, uint16_t)
PF_TSAN_ATOMIC(32, uint32_t)
PF_TSAN_ATOMIC(64, uint64_t)
#undef PF_TSAN_ATOMIC
#undef PF_SEQ
PF_HOOK void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
PF_HOOK void __tsan_atomic_signal_fence(int) {}
#undef PF_HOOK
#endif  // PF_RACECHECK
#endif  // PF_EMU_RUNTIME
