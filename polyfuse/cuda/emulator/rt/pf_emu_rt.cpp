// pf_emu_rt.cpp -- runtime of the polyfuse CPU emulator of CUDA kernels.
//
// Built once (cached by polyfuse/cuda/emulator.py) into a small server executable. The Python
// side starts one server per Emulator and talks to it over a Unix SOCK_SEQPACKET socket; all
// bulk data (run specification, buffers, results) lives in a shared memfd the server maps. The
// server dlopen()s kernel libraries, hands each the pf_api table (barriers, warp operations,
// shared memory slots, cp.async, error reports, launches) through its pf_module(), and for every
// run forks a child that executes the launches and exits -- forking this small process is cheap
// (unlike forking the caller), and a crashing kernel only takes the child down.
//
// Execution model:
//   * every CUDA thread is a fiber with its own 256 KiB slot: descriptor page(s), a guard page,
//     then the stack (>= 240 KiB); the slot is aligned to its size so the device code finds its
//     fiber from the stack pointer (pf_cur() in pf_emu.h) -- no thread_local;
//   * the context switch is hand-written for x86-64 (callee-saved registers, mxcsr, x87 control
//     word); elsewhere (or with -DPF_USE_UCONTEXT) ucontext is used;
//   * blocks are taken from an atomic counter by std::thread workers, each with its own fibers
//     and shared-memory arena; a block's fibers run in rounds: every runnable fiber runs (in
//     forward, reverse or seeded random order) until it exits or blocks at a barrier or warp
//     operation; then warp operations whose lanes have all arrived are resolved, or, when every
//     live fiber waits at the same __syncthreads, the barrier is released; otherwise the block
//     is divergent or deadlocked and the run fails with a message naming the kernel.
//   * any failure (bad access, divergence, deadlock, crash signal) writes a one-line message to
//     the shared result block and _exit()s the child.

#define PF_EMU_RUNTIME
#include "pf_emu.h"

#include <dlfcn.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <unordered_map>
#include <new>
#include <string>
#include <thread>
#include <vector>

#if !defined(__x86_64__) || defined(PF_USE_UCONTEXT)
#define PF_UCONTEXT 1
#endif

// ------------------------------------------------------------------------------------------
// Wire format: everything is in the shared region, addressed by byte offsets from its start
// (mirrored by ctypes structures in emulator.py).
// ------------------------------------------------------------------------------------------

struct pf_wire_spec {
  uint32_t abi, nbuf, nlaunch, order;  // order: 0 forward, 1 reverse, 2 random
  uint64_t seed;
  uint32_t workers, module;
  uint64_t bufs_off, launches_off, result_off;
  uint64_t banks_off;  // 0, or a pf_bank_table of banks_cap entries (race-check libraries)
  uint32_t banks_cap, pad;
};

// Shared-memory bank report: one entry per (launch, access site, read/write, width), summed
// over every warp-level execution of the site (see bank_flush).
struct pf_bank_stat {
  uint64_t pc;  // the access, relative to the kernel library's load address
  uint32_t launch, access, width, pad;
  uint64_t requests, wavefronts, ideal;
};
struct pf_bank_table {
  uint32_t n, overflow;
  pf_bank_stat e[1];
};

struct pf_wire_buf {
  uint64_t data_off, nbytes;
  uint32_t itemsize, pad;
  uint64_t name_off;  // NUL-terminated
};

struct pf_wire_launch {
  uint32_t kernel, nargs;
  uint32_t grid[3], block[3];
  uint32_t shared, pad;
  uint64_t args_off;  // nargs x pf_wire_arg
};

struct pf_wire_arg {
  int32_t buf;  // buffer index, or -1 for a scalar held in value (little-endian)
  uint32_t pad;
  uint64_t value;
};

struct pf_result {
  int32_t status;   // 0 running, 1 done, 3 error, 4 crash
  int32_t current;  // launch being executed
  char msg[2040];
  // [launch][buffer][distinct read, distinct write, requested read, requested write] bytes;
  // preset to -1 by the caller
  int64_t counts[1];
};

// Socket messages: this header, then for LOAD the library path / the reply text.
struct pf_msg {
  uint32_t type, pad;
  int64_t a, b;
};
enum : uint32_t { MSG_LOAD = 1, MSG_MAP = 2, MSG_RUN = 3, MSG_DONE = 4 };

namespace {

constexpr size_t SLOT = size_t(1) << PF_SLOT_SHIFT;
constexpr unsigned MAX_THREADS = 1024;
constexpr uint64_t SHARED_LIMIT = 227 * 1024;  // the most any target GPU gives one block
constexpr size_t ALTSTACK = 64 * 1024;

enum State : int { RUN = 0, BAR = 1, WARP = 2, DONE = 3 };

struct CpCopy {
  uint64_t group;
  char* dst;
  uint32_t size;
  unsigned char data[16];
};

struct Worker;
struct Fiber;

// Hot scheduling state of one fiber, in a compact per-worker array (the fiber descriptors are
// 256 KiB apart, which the scheduler's scans would pay for in cache and TLB misses).
struct Sched {
  void* sp;  // saved stack pointer
  Fiber* f;
  int state, line;
  int bkind, bpred, bres;  // __syncthreads variant, predicate, result
  int wop, warg, wwidth;   // warp operation
  unsigned wmask;
  uint64_t wval, wres;
};

// A fiber descriptor: at the start of its slot (staggered, see pf_cur()).
struct Fiber {
  pf_fiber_pub pub;  // must be first
  Worker* w;
  Sched* s;
  uint64_t cp_committed;
  std::vector<CpCopy> cp;
#ifdef PF_UCONTEXT
  ucontext_t uc;
#endif
};

struct Worker {
  char* slots = nullptr;  // MAX_THREADS slots, aligned to SLOT
  unsigned ninit = 0;     // slots with a guard page and a constructed Fiber
  void* sched_sp = nullptr;
#ifdef PF_UCONTEXT
  ucontext_t sched_uc;
#endif
  pf_block_pub* blk = nullptr;
  char* arena = nullptr;      // SHARED_LIMIT bytes (rounded to pages), then a guard page
  char* arena_end = nullptr;  // the guard page: dynamic shared memory ends here
  uint64_t bump = 0;          // static shared memory grows from arena up to blk->dyn
  uint64_t rng = 0;
  std::vector<Sched> sched;   // MAX_THREADS entries
  std::vector<unsigned> ord;  // this round's runnable fibers, in schedule order
  size_t pos = 0;             // next entry of ord to run
  unsigned ndone = 0;         // fibers of the block that have exited
  char* altstack = nullptr;
  Fiber* running = nullptr;  // the fiber switched to, for crash reports
  // Race detector: the barrier epoch (bumped at each block start and __syncthreads release;
  // never reset, so shadow entries of earlier blocks are stale), per-warp __syncwarp epochs,
  // the shared-memory shadow (one entry per byte of the arena) and the static sites' sizes.
  uint32_t epoch = 0;
  uint32_t wsync[MAX_THREADS / 32] = {};
  struct ShadowByte* shadow = nullptr;
  uint64_t site_size[PF_MAX_SITES] = {};
  struct BankState* banks = nullptr;  // the bank counter's state (runs with a bank table)
};

struct LaunchCtx {
  const pf_kernel_info* k = nullptr;
  unsigned grid[3], block[3];
  unsigned shmem = 0;
  void** args = nullptr;
  uint64_t nblocks = 0;
  unsigned nthreads = 0;
  std::atomic<uint64_t> next{0};
};

pf_result* g_res = nullptr;
uint64_t g_seed = 0;
unsigned g_order = 0, g_nworkers = 1;
std::vector<pf_buf> g_bufs;
struct alignas(64) ReqLine {
  uint64_t v[8];
};
std::vector<ReqLine> g_req;  // [buffer][slot]: pf_buf::req of every buffer
std::vector<Worker*> g_workers;
LaunchCtx g_L;
int g_launch = -1;
pf_bank_table* g_banks = nullptr;  // set when the run asks for the bank report
uint32_t g_banks_cap = 0;
size_t g_page = 4096;
size_t g_desc = 4096;  // bytes of a slot before its guard page
std::atomic<int> g_failing{0};
volatile sig_atomic_t g_in_signal = 0;
thread_local Worker* t_worker = nullptr;  // the worker this OS thread runs (crash reports only)

inline Fiber* cur() { return reinterpret_cast<Fiber*>(pf_cur()); }
inline Fiber* fiber_in_slot(uintptr_t base) {
  return reinterpret_cast<Fiber*>(base + (((base >> PF_SLOT_SHIFT) & 63) << 6));
}
inline Fiber* fiber_at(Worker* w, unsigned i) {
  return fiber_in_slot(uintptr_t(w->slots + size_t(i) * SLOT));
}
const char* kname() { return g_L.k ? g_L.k->name : "?"; }

// ---- failure reports ---------------------------------------------------------------------

[[noreturn]] void die(int code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
[[noreturn]] void die(int code, const char* fmt, ...) {
  if (g_failing.exchange(1)) {
    for (;;) pause();
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_res->msg, sizeof g_res->msg, fmt, ap);
  va_end(ap);
  g_res->status = code;
  if (!g_in_signal) {
    fflush(stdout);
    fflush(stderr);
  }
  _exit(code);
}

struct Where {
  char s[96];
};
Where where(const Fiber* f) {
  Where w;
  snprintf(w.s, sizeof w.s, "thread (%u,%u,%u) of block (%u,%u,%u)", f->pub.tid.x, f->pub.tid.y,
           f->pub.tid.z, f->pub.bid.x, f->pub.bid.y, f->pub.bid.z);
  return w;
}
Where block_of(const Fiber* f) {
  Where w;
  snprintf(w.s, sizeof w.s, "block (%u,%u,%u)", f->pub.bid.x, f->pub.bid.y, f->pub.bid.z);
  return w;
}

const char* warp_op_name(int op) {
  switch (op) {
    case PF_W_SYNC: return "__syncwarp";
    case PF_W_SHFL: return "__shfl_sync";
    case PF_W_UP: return "__shfl_up_sync";
    case PF_W_DOWN: return "__shfl_down_sync";
    case PF_W_XOR: return "__shfl_xor_sync";
    case PF_W_BALLOT: return "__ballot_sync";
    case PF_W_ANY: return "__any_sync";
    case PF_W_ALL: return "__all_sync";
    case PF_W_MATCH: return "__match_any_sync";
    case PF_W_ACTIVE: return "__activemask";
  }
  return "warp operation";
}
const char* barrier_name(int kind) {
  static const char* names[] = {"__syncthreads", "__syncthreads_count", "__syncthreads_and",
                                "__syncthreads_or"};
  return names[kind & 3];
}

// Fiber whose stack holds address a, or nullptr.
Fiber* fiber_of_address(uintptr_t a, bool* in_guard) {
  for (Worker* w : g_workers) {
    if (!w || !w->slots) continue;
    uintptr_t lo = (uintptr_t)w->slots, hi = lo + size_t(w->ninit) * SLOT;
    if (a < lo || a >= hi) continue;
    uintptr_t base = a & ~(uintptr_t)(SLOT - 1);
    if (in_guard) *in_guard = a >= base + g_desc && a < base + g_desc + g_page;
    return fiber_in_slot(base);
  }
  return nullptr;
}

void on_signal(int sig, siginfo_t* si, void* uctx) {
  g_in_signal = 1;
  uintptr_t sp = 0;
#if defined(__x86_64__)
  sp = (uintptr_t)((ucontext_t*)uctx)->uc_mcontext.gregs[REG_RSP];
#elif defined(__aarch64__)
  sp = (uintptr_t)((ucontext_t*)uctx)->uc_mcontext.sp;
#else
  (void)uctx;
#endif
  bool guard = false;
  Fiber* f = sp ? fiber_of_address(sp, nullptr) : nullptr;
  Fiber* running = t_worker ? t_worker->running : nullptr;
  if (running && f != running) {  // the stack pointer left the running fiber's slot
    f = running;
    guard = true;
  }
  if (sig == SIGSEGV || sig == SIGBUS) {
    Fiber* g = fiber_of_address((uintptr_t)si->si_addr, &guard);
    if (g && guard) f = g;
    for (Worker* w : g_workers)
      if (w && (char*)si->si_addr >= w->arena_end && (char*)si->si_addr < w->arena_end + g_page)
        die(4, "kernel %s: out-of-bounds dynamic shared memory access (the launch gives %u "
            "bytes) in %s", kname(), g_L.shmem, f ? where(f).s : "a CUDA thread");
  }
  const char* what = sig == SIGSEGV   ? "segmentation fault"
                     : sig == SIGBUS  ? "bus error"
                     : sig == SIGFPE  ? "arithmetic exception (integer division by zero?)"
                     : sig == SIGILL  ? "illegal instruction (__trap or a compiler trap?)"
                     : sig == SIGABRT ? "abort (failed assert? see stderr)"
                                      : "fatal signal";
  if (guard)
    die(4, "kernel %s: stack overflow (more than %zu KiB of local memory) in %s", kname(),
        (SLOT - g_desc - g_page) / 1024, where(f).s);
  if (f && f->pub.magic == PF_FIBER_MAGIC) {
    if (sig == SIGSEGV || sig == SIGBUS)
      die(4, "kernel %s: %s at address %p in %s", kname(), what, si->si_addr, where(f).s);
    die(4, "kernel %s: %s in %s", kname(), what, where(f).s);
  }
  die(4, "kernel %s: %s (outside a CUDA thread)", kname(), what);
}

void install_altstack(Worker* w) {
  if (!w->altstack) w->altstack = static_cast<char*>(malloc(ALTSTACK));
  stack_t ss{};
  ss.ss_sp = w->altstack;
  ss.ss_size = ALTSTACK;
  sigaltstack(&ss, nullptr);
}

void install_handlers() {
  struct sigaction sa{};
  sa.sa_sigaction = on_signal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP}) sigaction(s, &sa, nullptr);
}

// ---- context switch --------------------------------------------------------------------------

extern "C" void pf_fiber_entry();

#ifndef PF_UCONTEXT
extern "C" void pf_ctx_switch(void** save_sp, void* new_sp);
asm(R"(
  .text
  .p2align 4
  .globl pf_ctx_switch
  .hidden pf_ctx_switch
  .type pf_ctx_switch,@function
pf_ctx_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size pf_ctx_switch, .-pf_ctx_switch
)");
#endif

// Run this round's fibers (w->ord) from the scheduler; returns when the last one blocks.
inline void run_round(Worker* w) {
  w->pos = 0;
  if (w->ord.empty()) return;
  Sched* first = &w->sched[w->ord[w->pos++]];
  w->running = first->f;
#ifndef PF_UCONTEXT
  pf_ctx_switch(&w->sched_sp, first->sp);
#else
  swapcontext(&w->sched_uc, &first->f->uc);
#endif
  w->running = nullptr;
}

// Called on a fiber that has blocked (its state is set) or exited: switch straight to the next
// fiber of the round, or back to the scheduler after the last one.
inline void yield(Fiber* f) {
  Worker* w = f->w;
  Sched* next = w->pos < w->ord.size() ? &w->sched[w->ord[w->pos++]] : nullptr;
  w->running = next ? next->f : nullptr;
#ifndef PF_UCONTEXT
  pf_ctx_switch(&f->s->sp, next ? next->sp : w->sched_sp);
#else
  swapcontext(&f->uc, next ? &next->f->uc : &w->sched_uc);
#endif
}

extern "C" __attribute__((visibility("hidden"))) void pf_fiber_entry() {
  Fiber* f = cur();
  g_L.k->thunk(g_L.args);
  f->s->state = DONE;
  f->w->ndone++;
  yield(f);
  __builtin_trap();
}

void start_fiber(Fiber* f, unsigned i) {
  // Stagger the stack tops so that the fibers' hot frames do not share cache sets.
  char* base = reinterpret_cast<char*>(uintptr_t(f) & ~uintptr_t(SLOT - 1));
  char* top = base + SLOT - 64 * (i % 64) - 64;
#ifndef PF_UCONTEXT
  uint64_t* sp = reinterpret_cast<uint64_t*>(top);
  *--sp = 0;                                     // fake return address of pf_fiber_entry
  *--sp = (uint64_t)(uintptr_t)&pf_fiber_entry;  // where pf_ctx_switch's ret goes
  for (int r = 0; r < 6; ++r) *--sp = 0;         // rbp rbx r12 r13 r14 r15
  f->s->sp = sp;
#else
  char* lo = base + g_desc + g_page;
  getcontext(&f->uc);
  f->uc.uc_stack.ss_sp = lo;
  f->uc.uc_stack.ss_size = size_t(top - lo);
  f->uc.uc_link = nullptr;
  makecontext(&f->uc, pf_fiber_entry, 0);
#endif
}

// ---- workers -----------------------------------------------------------------------------

void ensure_slots(Worker* w, unsigned n) {
  if (!w->slots) {
    size_t bytes = size_t(MAX_THREADS) * SLOT + SLOT;
    void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) die(3, "kernel %s: cannot reserve fiber stacks (errno %d)", kname(), errno);
    uintptr_t a = ((uintptr_t)m + SLOT - 1) & ~(uintptr_t)(SLOT - 1);
    w->slots = reinterpret_cast<char*>(a);
  }
  for (; w->ninit < n; ++w->ninit) {
    char* base = w->slots + size_t(w->ninit) * SLOT;
    if (mprotect(base + g_desc, g_page, PROT_NONE) != 0)
      die(3, "kernel %s: cannot protect a stack guard page (errno %d)", kname(), errno);
    Fiber* f = new (fiber_in_slot(uintptr_t(base))) Fiber();
    f->w = w;
    f->pub.magic = PF_FIBER_MAGIC;
  }
}

Worker* get_worker(unsigned i) {
  while (g_workers.size() <= i) g_workers.push_back(nullptr);
  if (!g_workers[i]) {
    Worker* w = new Worker();
    w->sched.resize(MAX_THREADS);
    w->ord.reserve(MAX_THREADS);
    w->blk = static_cast<pf_block_pub*>(calloc(1, sizeof(pf_block_pub)));
    size_t bytes = (SHARED_LIMIT + g_page - 1) & ~(g_page - 1);
    void* m = mmap(nullptr, bytes + g_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (m == MAP_FAILED || mprotect((char*)m + bytes, g_page, PROT_NONE) != 0)
      die(3, "kernel %s: cannot map shared memory arenas (errno %d)", kname(), errno);
    w->arena = static_cast<char*>(m);
    w->arena_end = w->arena + bytes;
    g_workers[i] = w;
  }
  return g_workers[i];
}

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Resolve every warp operation whose participating lanes have all arrived.
bool resolve_warps(Worker* w, unsigned n) {
  bool progress = false;
  Sched* S = w->sched.data();
  for (unsigned base = 0; base < n; base += 32) {
    unsigned m = std::min(32u, n - base);
    Sched* L = S + base;
    uint32_t live = 0, waiting = 0;
    for (unsigned l = 0; l < m; ++l) {
      if (L[l].state != DONE) live |= 1u << l;
      if (L[l].state == WARP) waiting |= 1u << l;
    }
    uint32_t todo = waiting;
    while (todo) {
      unsigned l = __builtin_ctz(todo);
      uint32_t group = (L[l].wmask | (1u << l)) & live;
      if (L[l].wop == PF_W_ACTIVE) {  // every lane waiting at this same __activemask
        group = 0;
        for (uint32_t g = waiting; g; g &= g - 1) {
          unsigned k = __builtin_ctz(g);
          if (L[k].wop == PF_W_ACTIVE && L[k].line == L[l].line) group |= 1u << k;
        }
      }
      todo &= ~(group | (1u << l));
      if (group & ~waiting) continue;  // some participant has not arrived yet
      waiting &= ~group;
      progress = true;
      uint32_t ballot = 0;
      for (uint32_t g = group; g; g &= g - 1) {
        unsigned j = __builtin_ctz(g);
        if (L[j].wval) ballot |= 1u << j;
      }
      for (uint32_t g = group; g; g &= g - 1) {
        unsigned j = __builtin_ctz(g);
        Sched& sj = L[j];
        unsigned width = unsigned(sj.wwidth), seg = j & ~(width - 1), lane = j & (width - 1);
        long src = -1;
        switch (sj.wop) {
          case PF_W_SHFL: src = seg + (unsigned(sj.warg) & (width - 1)); break;
          case PF_W_UP: src = lane >= unsigned(sj.warg) ? long(j) - sj.warg : -1; break;
          case PF_W_DOWN: src = lane + unsigned(sj.warg) < width ? long(j) + sj.warg : -1; break;
          case PF_W_XOR: {
            unsigned x = j ^ unsigned(sj.warg);
            src = (x <= (seg | (width - 1))) ? long(x) : -1;
            break;
          }
          default: break;
        }
        switch (sj.wop) {
          case PF_W_SYNC: sj.wres = 0; break;
          case PF_W_ACTIVE: sj.wres = group; break;
          case PF_W_BALLOT: sj.wres = ballot; break;
          case PF_W_ANY: sj.wres = ballot != 0; break;
          case PF_W_ALL: sj.wres = ballot == group; break;
          case PF_W_MATCH: {
            uint32_t eq = 0;
            for (uint32_t h = group; h; h &= h - 1) {
              unsigned k = __builtin_ctz(h);
              if (L[k].wval == sj.wval) eq |= 1u << k;
            }
            sj.wres = eq;
            break;
          }
          default:
            sj.wres = (src >= 0 && src < 32 && ((group >> src) & 1)) ? L[src].wval : sj.wval;
        }
      }
      for (uint32_t g = group; g; g &= g - 1) L[__builtin_ctz(g)].state = RUN;
      if (L[l].wop == PF_W_SYNC) w->wsync[base / 32]++;
    }
  }
  return progress;
}

[[noreturn]] void deadlock(Worker* w, unsigned n) {
  struct Group {
    int state, op, line;
    unsigned count;
    unsigned first;
  };
  Group groups[8];
  int ng = 0;
  unsigned more = 0;
  for (unsigned i = 0; i < n; ++i) {
    const Sched& f = w->sched[i];
    if (f.state == DONE) continue;
    int op = f.state == BAR ? f.bkind : f.wop;
    int k = 0;
    for (; k < ng; ++k)
      if (groups[k].state == f.state && groups[k].op == op && groups[k].line == f.line) break;
    if (k == ng) {
      if (ng == 8) {
        ++more;
        continue;
      }
      groups[ng++] = Group{f.state, op, f.line, 0, i};
    }
    groups[k].count++;
  }
  char buf[1200];
  int len = 0;
  for (int k = 0; k < ng && len < 1000; ++k) {
    const Group& g = groups[k];
    const char* name = g.state == BAR ? barrier_name(g.op) : warp_op_name(g.op);
    len += snprintf(buf + len, sizeof buf - len, "%s%u thread(s) wait at %s (line %d", k ? "; " : "",
                    g.count, name, g.line);
    if (g.state == WARP)
      len += snprintf(buf + len, sizeof buf - len, ", mask 0x%08x", w->sched[g.first].wmask);
    len += snprintf(buf + len, sizeof buf - len, ")");
  }
  die(3, "kernel %s: deadlock in %s: %s%s", kname(), block_of(fiber_at(w, 0)).s, buf,
      more ? "; ..." : "");
}

void run_block(Worker* w, uint64_t lin, unsigned order) {
  const unsigned bx = g_L.block[0], by = g_L.block[1], n = g_L.nthreads;
  const unsigned gx = g_L.grid[0], gy = g_L.grid[1];
  uint3 bid{unsigned(lin % gx), unsigned((lin / gx) % gy), unsigned(lin / (uint64_t(gx) * gy))};
  pf_block_pub* b = w->blk;
  b->gen++;
  b->arena = w->arena;
  b->dyn = w->arena_end - ((g_L.shmem + 15) & ~15u);
  b->dyn_bytes = g_L.shmem;
  memset(b->dyn, 0xFF, w->arena_end - b->dyn);
  w->bump = 0;
  w->epoch++;
  Sched* S = w->sched.data();
  for (unsigned i = 0; i < n; ++i) {
    Fiber* f = fiber_at(w, i);
    f->pub.tid = uint3{i % bx, (i / bx) % by, i / (bx * by)};
    f->pub.bid = bid;
    f->pub.bdim = dim3(g_L.block[0], g_L.block[1], g_L.block[2]);
    f->pub.gdim = dim3(g_L.grid[0], g_L.grid[1], g_L.grid[2]);
    f->pub.blk = b;
    f->pub.linear = i;
    f->s = &S[i];
    f->cp.clear();
    f->cp_committed = 0;
    S[i] = Sched{};
    S[i].f = f;
    S[i].state = RUN;
    start_fiber(f, i);
  }
  if (order == 2) w->rng = g_seed * 0x100000001b3ull ^ (uint64_t(g_launch) << 40) ^ lin;
  w->ndone = 0;
  std::vector<unsigned>& ord = w->ord;
  for (;;) {
    ord.clear();
    for (unsigned i = 0; i < n; ++i) {
      unsigned k = order == 1 ? n - 1 - i : i;
      if (S[k].state == RUN) ord.push_back(k);
    }
    if (order == 2)
      for (size_t i = ord.size(); i > 1; --i) std::swap(ord[i - 1], ord[splitmix(w->rng) % i]);
    run_round(w);
    if (w->ndone == n) break;
    if (resolve_warps(w, n)) continue;
    // Every live fiber is blocked and no warp operation can complete: a block barrier?
    unsigned nbar = 0, ndone = w->ndone;
    const Sched *first = nullptr, *other = nullptr;
    for (unsigned i = 0; i < n; ++i) {
      if (S[i].state != BAR) continue;
      ++nbar;
      if (!first) first = &S[i];
      else if (!other && (S[i].line != first->line || S[i].bkind != first->bkind)) other = &S[i];
    }
    if (nbar == 0 || nbar + ndone != n) deadlock(w, n);
    if (other) {
      const uint3 a = first->f->pub.tid, c = other->f->pub.tid;
      die(3, "kernel %s: divergent __syncthreads in %s: thread (%u,%u,%u) waits at line %d, "
          "thread (%u,%u,%u) at line %d", kname(), block_of(first->f).s, a.x, a.y, a.z,
          first->line, c.x, c.y, c.z, other->line);
    }
    if (ndone)
      die(3, "kernel %s: divergent __syncthreads in %s: %u thread(s) exited while %u wait at "
          "line %d", kname(), block_of(first->f).s, ndone, nbar, first->line);
    int count = 0;
    for (unsigned i = 0; i < n; ++i) count += S[i].bpred != 0;
    int res = first->bkind == 1 ? count : first->bkind == 2 ? count == int(n) : count > 0;
    w->epoch++;
    for (unsigned i = 0; i < n; ++i) {
      S[i].bres = res;
      S[i].state = RUN;
    }
  }
}

void bank_flush(Worker* w);  // the bank counter, below

void worker_main(Worker* w, bool own_thread) {
  if (own_thread) install_altstack(w);
  t_worker = w;
  ensure_slots(w, g_L.nthreads);
  const unsigned order = g_order;
  for (;;) {
    uint64_t lin = g_L.next.fetch_add(1, std::memory_order_relaxed);
    if (lin >= g_L.nblocks) break;
    run_block(w, lin, order);
    if (g_banks) bank_flush(w);
  }
}

// ---- shared-memory bank counter (race-check libraries, runs with a bank table) ------------
//
// Every plain shared access (and every cp.async write) of a thread is recorded with its site
// (pc) and the how-many-th execution of that site by that thread it is; the lanes of one warp
// with the same site and execution number form one warp-level request. At the end of a block
// each request is split into the phases the hardware serves together (a warp for accesses up
// to 4 bytes, half-warps for 8 bytes, quarter-warps for 16), and each phase costs as many
// wavefronts as the most distinct 32-bit words any of the 32 banks is asked for (lanes reading
// the same word share it). ``ideal`` counts one wavefront per phase: wavefronts - ideal is the
// conflicts' cost. The ldmatrix of pf_mma.h reads one 16-byte row per lane, so its eight-row
// matrices are the quarter-warp phases, as on the hardware.

struct BankKey {
  const void* pc;
  uint32_t warp, inst, access;
  bool operator==(const BankKey& o) const {
    return pc == o.pc && warp == o.warp && inst == o.inst && access == o.access;
  }
};
struct BankKeyHash {
  size_t operator()(const BankKey& k) const {
    return std::hash<const void*>()(k.pc) ^ (size_t(k.warp) << 40) ^ (size_t(k.inst) << 8) ^
           k.access;
  }
};
struct BankLane {
  uint32_t lane, size;
  uint64_t off;
};
struct SiteKey {
  const void* pc;
  uint32_t access, width;
  bool operator==(const SiteKey& o) const {
    return pc == o.pc && access == o.access && width == o.width;
  }
};
struct SiteKeyHash {
  size_t operator()(const SiteKey& k) const {
    return std::hash<const void*>()(k.pc) ^ (size_t(k.width) << 32) ^ k.access;
  }
};
struct BankSum {
  uint64_t requests = 0, wavefronts = 0, ideal = 0;
};
struct BankState {
  std::unordered_map<uint64_t, uint32_t> inst;  // (pc, thread) -> executions so far
  std::unordered_map<BankKey, std::vector<BankLane>, BankKeyHash> requests;
  std::unordered_map<SiteKey, BankSum, SiteKeyHash> sites;  // this launch
};

void bank_record(Worker* w, const Fiber* f, uint64_t off, uint64_t size, int access,
                 const void* pc) {
  if (!w->banks) w->banks = new BankState();
  BankState& b = *w->banks;
  const uint32_t t = f->pub.linear;
  uint32_t& n = b.inst[uint64_t(uintptr_t(pc)) * 1024 + t];  // t < MAX_THREADS = 1024
  b.requests[BankKey{pc, t / 32, n++, uint32_t(access)}].push_back(
      BankLane{t % 32, uint32_t(size), off});
}

// One warp-level request: its wavefronts and the phases (ideal wavefronts) it takes.
void bank_cost(const std::vector<BankLane>& lanes, uint32_t width, uint64_t& waves,
               uint64_t& phases) {
  const uint32_t per_phase = width >= 16 ? 8 : width == 8 ? 16 : 32;
  for (uint32_t ph = 0; ph < 32 / per_phase; ++ph) {
    uint64_t words[32][32];  // per bank, the distinct words asked for (at most 32 lanes)
    uint32_t count[32] = {};
    bool any = false;
    for (const BankLane& l : lanes) {
      if (l.lane / per_phase != ph) continue;
      any = true;
      for (uint64_t wd = l.off / 4; wd <= (l.off + l.size - 1) / 4; ++wd) {
        uint32_t bank = uint32_t(wd % 32), k = 0;
        while (k < count[bank] && words[bank][k] != wd) ++k;
        if (k == count[bank] && k < 32) words[bank][count[bank]++] = wd;
      }
    }
    if (!any) continue;
    uint32_t most = 1;
    for (uint32_t bank = 0; bank < 32; ++bank) most = std::max(most, count[bank]);
    waves += most;
    phases += 1;
  }
}

void bank_flush(Worker* w) {
  if (!w->banks) return;
  BankState& b = *w->banks;
  for (auto& [key, lanes] : b.requests) {
    uint32_t width = 0;
    for (const BankLane& l : lanes) width = std::max(width, l.size);
    BankSum& s = b.sites[SiteKey{key.pc, key.access, width}];
    s.requests += 1;
    bank_cost(lanes, width, s.wavefronts, s.ideal);
  }
  b.requests.clear();
  b.inst.clear();
}

uint64_t pc_offset(const void* pc);

// After a launch: every worker's sites into the run's table (entries past banks_cap are
// counted in overflow).
void bank_collect(uint32_t launch) {
  for (Worker* w : g_workers) {
    if (!w || !w->banks) continue;
    for (auto& [key, sum] : w->banks->sites) {
      const uint64_t pc = pc_offset(key.pc);
      uint32_t i = 0;
      while (i < g_banks->n && !(g_banks->e[i].pc == pc && g_banks->e[i].launch == launch &&
                                 g_banks->e[i].access == key.access &&
                                 g_banks->e[i].width == key.width))
        ++i;
      if (i == g_banks->n) {
        if (i >= g_banks_cap) {
          g_banks->overflow++;
          continue;
        }
        g_banks->e[i] = pf_bank_stat{pc, launch, key.access, key.width, 0, 0, 0, 0};
        g_banks->n++;
      }
      g_banks->e[i].requests += sum.requests;
      g_banks->e[i].wavefronts += sum.wavefronts;
      g_banks->e[i].ideal += sum.ideal;
    }
    w->banks->sites.clear();
  }
}

// ---- race detector (libraries built with PF_RACECHECK) ---------------------------------------
//
// Shared memory: one ShadowByte per byte of a worker's arena holds the last writer and up to
// two readers, each with the barrier epoch and its warp's __syncwarp epoch at the access. Two
// accesses by different threads conflict when at least one writes and no barrier separates
// them: same block epoch, and not (same warp with a __syncwarp in between). Global memory: one
// GlobalShadow per element of a buffer, reset after each launch, with the block too; accesses
// from different blocks of one launch always conflict. The first conflict ends the run with a
// pf_race_report (status 5); the Python side turns its addresses into source lines.

struct Access {
  uint32_t block;  // linear block index + 1 (0: none)
  uint32_t thread;
  uint32_t epoch, wsync;
  const void* pc;
};

struct ShadowByte {
  Access w, r1, r2;
};

struct GlobalShadow {
  Access w, r1, r2;  // last writer; two distinct readers, replaced only once ordered before now
};

struct GlobalShadows {
  GlobalShadow* s = nullptr;
  uint64_t bytes = 0;
};
std::vector<GlobalShadows> g_gshadow;
std::atomic<uint32_t> g_glocks[1024];  // striped locks over global shadow entries

inline Access access_now(Worker* w, const Fiber* f, const void* pc) {
  uint32_t t = f->pub.linear;
  uint64_t lin = f->pub.bid.x + uint64_t(g_L.grid[0]) * (f->pub.bid.y + uint64_t(g_L.grid[1]) * f->pub.bid.z);
  return Access{uint32_t(lin + 1), t, w->epoch, w->wsync[t / 32], pc};
}

// Whether an earlier access a and the current access c (of another or the same thread) race.
// Shared memory belongs to one block: an entry of an earlier block (older epoch) is stale.
inline bool conflict(const Access& a, const Access& c, bool shared) {
  if (!a.block || (a.thread == c.thread && a.block == c.block)) return false;
  if (a.block != c.block) return !shared;
  if (a.epoch != c.epoch) return false;
  return !(a.thread / 32 == c.thread / 32 && a.wsync != c.wsync);
}

void coords(uint32_t block, uint32_t thread, uint32_t out[6]) {
  uint64_t b = block - 1;
  out[0] = thread % g_L.block[0];
  out[1] = (thread / g_L.block[0]) % g_L.block[1];
  out[2] = thread / (g_L.block[0] * g_L.block[1]);
  out[3] = uint32_t(b % g_L.grid[0]);
  out[4] = uint32_t((b / g_L.grid[0]) % g_L.grid[1]);
  out[5] = uint32_t(b / (uint64_t(g_L.grid[0]) * g_L.grid[1]));
}

uint64_t pc_offset(const void* pc) {
  Dl_info info;
  // pc is a return address: pc - 1 lies in the call instruction, on the access's line.
  if (pc && dladdr(pc, &info) && info.dli_fbase)
    return uint64_t((const char*)pc - (const char*)info.dli_fbase) - 1;
  return 0;
}

[[noreturn]] void race(int kind, int space, int index, uint64_t offset, uint64_t size,
                       const Access& first, const Access& second) {
  if (g_failing.exchange(1)) {
    for (;;) pause();
  }
  pf_race_report r{};
  r.kind = kind;
  r.space = space;
  r.index = index;
  r.offset = offset;
  r.size = uint32_t(size);
  coords(first.block, first.thread, r.first);
  coords(second.block, second.thread, r.second);
  r.pc[0] = pc_offset(first.pc);
  r.pc[1] = pc_offset(second.pc);
  snprintf(r.kernel, sizeof r.kernel, "%s", kname());
  static_assert(sizeof(pf_race_report) <= sizeof(g_res->msg), "race report too large");
  memcpy(g_res->msg, &r, sizeof r);
  g_res->status = 5;
  _exit(5);
}

// Records read c in the two reader slots of a shared byte. A later write by thread x races
// with a reader of another warp, or of x's warp before x's last warp synchronisation; so the
// slots keep readers of two different warps whenever two warps have read in this interval, and
// of each warp its newest reader (an older one of the same warp adds nothing). Keeping just the
// last two readers lost a third warp's read: a missing barrier between the ldmatrix reads of a
// stage and the next cp.async writes to it went unreported in reverse thread order.
inline void keep_reader(ShadowByte& e, const Access& c) {
  auto live = [&](const Access& a) { return a.block == c.block && a.epoch == c.epoch; };
  auto warp = [](const Access& a) { return a.thread / 32; };
  if (!live(e.r1)) {
    e.r1 = c;
    e.r2 = Access{};
  } else if (e.r1.thread == c.thread) {
    e.r1 = c;
  } else if (!live(e.r2) || e.r2.thread == c.thread || warp(e.r2) == warp(e.r1) ||
             warp(e.r2) == warp(c)) {
    e.r2 = c;  // a new warp beside r1's, or the newest reader of r2's warp
  } else if (warp(e.r1) == warp(c)) {
    e.r1 = c;  // the newest reader of r1's warp; r2 keeps the other warp
  } else {
    e.r2 = c;  // a third warp: any two different warps serve
  }
}

void race_shared(Worker* w, const Fiber* f, const void* p, uint64_t size, int access,
                 const void* pc) {
  uint64_t off = uint64_t((const char*)p - w->arena), limit = uint64_t(w->arena_end - w->arena);
  if (off >= limit) return;
  if (size > limit - off) size = limit - off;
  if (!w->shadow) {
    void* m = mmap(nullptr, limit * sizeof(ShadowByte), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) die(3, "kernel %s: cannot map the race detector's shadow memory", kname());
    w->shadow = static_cast<ShadowByte*>(m);
  }
  if (g_banks) bank_record(w, f, off, size, access, pc);
  const Access c = access_now(w, f, pc);
  for (uint64_t i = off; i < off + size; ++i) {
    ShadowByte& e = w->shadow[i];
    int kind = -1;
    const Access* other = nullptr;
    if (conflict(e.w, c, true)) kind = access == PF_WRITE ? 2 : 0, other = &e.w;
    else if (access == PF_WRITE && conflict(e.r1, c, true)) kind = 1, other = &e.r1;
    else if (access == PF_WRITE && conflict(e.r2, c, true)) kind = 1, other = &e.r2;
    if (other) {
      const pf_block_pub* b = w->blk;
      int site = -1;
      uint64_t rel = uint64_t(w->arena + i - b->dyn);
      if (w->arena + i < b->dyn) {
        for (int s = 0; s < PF_MAX_SITES; ++s)
          if (b->site_gen[s] == b->gen && i >= b->site_off[s] && i < b->site_off[s] + w->site_size[s]) {
            site = s;
            rel = i - b->site_off[s];
            break;
          }
        if (site < 0) site = -2;  // not inside a live __shared__ variable
      }
      race(kind, 0, site, rel, size, *other, c);
    }
    if (access == PF_WRITE) e.w = c;
    else keep_reader(e, c);
  }
}

inline bool same_thread(const Access& a, const Access& c) {
  return a.block == c.block && a.thread == c.thread;
}
// Whether reader record a still matters to accesses from now on: it exists and no barrier of
// its own block has passed since (a reader of another block stays relevant all launch).
inline bool live(const Access& a, const Access& c) {
  return a.block && !(a.block == c.block && a.epoch != c.epoch);
}
inline bool needs_reader(const GlobalShadow& g, const Access& c) {
  return !live(g.r1, c) || (!same_thread(g.r1, c) && !live(g.r2, c));
}

void api_race_global(const pf_buf* b, uint64_t off, uint64_t size, int access, const void* pc) {
  Worker* w = t_worker;
  if (!w || !w->running) return;
  size_t bi = size_t(b - g_bufs.data());
  if (bi >= g_gshadow.size()) return;
  GlobalShadows& gs = g_gshadow[bi];
  uint64_t nel = b->nbytes >> b->shift;
  if (!gs.s) {
    static std::atomic<int> lock{0};
    while (lock.exchange(1, std::memory_order_acquire)) {
    }
    if (!gs.s) {
      gs.bytes = (nel * sizeof(GlobalShadow) + g_page - 1) & ~(g_page - 1);
      void* m = mmap(nullptr, gs.bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (m == MAP_FAILED) die(3, "kernel %s: cannot map the race detector's shadow memory", kname());
      __atomic_store_n(&gs.s, static_cast<GlobalShadow*>(m), __ATOMIC_RELEASE);
    }
    lock.store(0, std::memory_order_release);
  }
  GlobalShadow* sh = __atomic_load_n(&gs.s, __ATOMIC_ACQUIRE);
  const Access c = access_now(w, w->running, pc);
  for (uint64_t e = off >> b->shift, last = (off + size - 1) >> b->shift; e <= last && e < nel; ++e) {
    GlobalShadow& g = sh[e];
    // Reads of elements whose reader slots are taken and that no other thread wrote take no
    // lock and store nothing (many blocks reading one input would otherwise contend).
    if (access == PF_READ && !conflict(g.w, c, false) && !needs_reader(g, c)) continue;
    std::atomic<uint32_t>& l = g_glocks[e % 1024];
    while (l.exchange(1, std::memory_order_acquire)) {
    }
    int kind = -1;
    Access other{};
    if (conflict(g.w, c, false)) kind = access == PF_WRITE ? 2 : 0, other = g.w;
    else if (access == PF_WRITE && conflict(g.r1, c, false)) kind = 1, other = g.r1;
    else if (access == PF_WRITE && conflict(g.r2, c, false)) kind = 1, other = g.r2;
    if (access == PF_WRITE) {
      g.w = c;
    } else if (!live(g.r1, c)) {
      g.r1 = c;
      if (!live(g.r2, c)) g.r2 = Access{};
    } else if (!same_thread(g.r1, c) && !live(g.r2, c)) {
      g.r2 = c;
    }
    l.store(0, std::memory_order_release);
    if (kind >= 0) race(kind, 1, int(bi), e << b->shift, size, other, c);
  }
}

void race_reset(int32_t bi) {
  if (size_t(bi) < g_gshadow.size() && g_gshadow[bi].s)
    madvise(g_gshadow[bi].s, g_gshadow[bi].bytes, MADV_DONTNEED);
}

// ---- the API kernels call ------------------------------------------------------------------

int api_barrier(int kind, int line, int pred) {
  Fiber* f = cur();
  Sched* s = f->s;
  s->state = BAR;
  s->line = line;
  s->bkind = kind;
  s->bpred = pred;
  yield(f);
  return s->bres;
}

uint64_t api_warp(int op, unsigned mask, uint64_t val, int arg, int width, int line) {
  Fiber* f = cur();
  if (width < 1 || width > 32 || (width & (width - 1)))
    die(3, "kernel %s: %s width %d is not a power of two in [1, 32] (line %d, %s)", kname(),
        warp_op_name(op), width, line, where(f).s);
  Sched* s = f->s;
  s->state = WARP;
  s->line = line;
  s->wop = op;
  s->wmask = mask;
  s->wval = val;
  s->warg = arg;
  s->wwidth = width;
  yield(f);
  return s->wres;
}

void* api_shared_alloc(int site, uint64_t size, uint64_t align) {
  Fiber* f = cur();
  Worker* w = f->w;
  pf_block_pub* b = w->blk;
  if (site < 0 || site >= PF_MAX_SITES)
    die(3, "kernel %s: too many __shared__ declarations (at most %d)", kname(), PF_MAX_SITES);
  if (align < 16) align = 16;
  uint64_t off = (w->bump + align - 1) & ~(align - 1);
  if (off + size > uint64_t(b->dyn - b->arena) || off + size + g_L.shmem > SHARED_LIMIT)
    die(3, "kernel %s: shared memory of a block (%llu bytes static + %u dynamic) exceeds the "
        "%llu bytes any target GPU offers", kname(), (unsigned long long)(off + size), g_L.shmem,
        (unsigned long long)SHARED_LIMIT);
  memset(b->arena + off, 0xFF, size);
  w->site_size[site] = size;
  b->site_off[site] = uint32_t(off);
  b->site_gen[site] = b->gen;
  w->bump = off + size;
  return b->arena + off;
}

void api_cp_async(void* dst, const void* src, uint64_t size, uint64_t zfill) {
  Fiber* f = cur();
  if (size != 4 && size != 8 && size != 16)
    die(3, "kernel %s: __pipeline_memcpy_async of %llu bytes (must be 4, 8 or 16) in %s",
        kname(), (unsigned long long)size, where(f).s);
  if (zfill > size)
    die(3, "kernel %s: __pipeline_memcpy_async zero-fill %llu > size %llu in %s", kname(),
        (unsigned long long)zfill, (unsigned long long)size, where(f).s);
  if (((uintptr_t)dst | (uintptr_t)src) & (size - 1))
    die(3, "kernel %s: misaligned %llu-byte __pipeline_memcpy_async in %s", kname(),
        (unsigned long long)size, where(f).s);
  CpCopy c;
  c.group = f->cp_committed;
  c.dst = static_cast<char*>(dst);
  c.size = uint32_t(size);
  memcpy(c.data, src, size - zfill);
  memset(c.data + (size - zfill), 0, zfill);
  memset(dst, 0xFF, size);  // poisoned until the matching __pipeline_wait_prior
  race_shared(f->w, f, dst, size, PF_WRITE, __builtin_return_address(0));
  f->cp.push_back(c);
}

void api_cp_commit() { cur()->cp_committed++; }

void api_cp_wait(uint64_t n) {
  Fiber* f = cur();
  size_t keep = 0;
  for (size_t i = 0; i < f->cp.size(); ++i) {
    CpCopy& c = f->cp[i];
    if (c.group + n < f->cp_committed) memcpy(c.dst, c.data, c.size);
    else f->cp[keep++] = c;
  }
  f->cp.resize(keep);
}

void api_bad_access(const pf_buf* b, const void* p, uint64_t size, int access) {
  Fiber* f = cur();
  long long off = (long long)((const char*)p - b->base);
  long long n = (long long)(b->nbytes / b->itemsize);
  const char* what = access == PF_WRITE ? "write" : "read";
  if (off >= 0 && (unsigned long long)off < b->nbytes && b->nbytes - off >= size)
    die(3, "kernel %s: misaligned %llu-byte %s of buffer '%s' at byte offset %lld in %s",
        kname(), (unsigned long long)size, what, b->name, off, where(f).s);
  long long idx = off >= 0 ? off / (long long)b->itemsize
                           : -((-off + (long long)b->itemsize - 1) / (long long)b->itemsize);
  die(3, "kernel %s: out-of-bounds %s of buffer '%s' at index %lld (it has %lld elements) in %s",
      kname(), what, b->name, idx, n, where(f).s);
}

void api_fail(const char* msg) { die(3, "kernel %s: %s", kname(), msg); }

int api_launch(const pf_kernel_info* k, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
               unsigned by, unsigned bz, unsigned shmem, void** args) {
  g_L.k = k;
  unsigned long long threads = (unsigned long long)bx * by * bz;
  if (!gx || !gy || !gz || !bx || !by || !bz || threads > MAX_THREADS || bz > 64 || gy > 65535 ||
      gz > 65535)
    die(3, "kernel %s: invalid launch configuration grid (%u,%u,%u) block (%u,%u,%u)", k->name,
        gx, gy, gz, bx, by, bz);
  if (shmem > SHARED_LIMIT)
    die(3, "kernel %s: %u bytes of dynamic shared memory exceed %llu", k->name, shmem,
        (unsigned long long)SHARED_LIMIT);
  g_L.grid[0] = gx, g_L.grid[1] = gy, g_L.grid[2] = gz;
  g_L.block[0] = bx, g_L.block[1] = by, g_L.block[2] = bz;
  g_L.shmem = shmem;
  g_L.args = args;
  g_L.nthreads = unsigned(threads);
  g_L.nblocks = uint64_t(gx) * gy * gz;
  g_L.next.store(0);
  unsigned nw = unsigned(std::min<uint64_t>(std::max(1u, g_nworkers), g_L.nblocks));
  for (unsigned i = 0; i < nw; ++i) get_worker(i);
  std::vector<std::thread> threads_;
  threads_.reserve(nw);
  for (unsigned i = 1; i < nw; ++i) threads_.emplace_back(worker_main, g_workers[i], true);
  worker_main(g_workers[0], false);
  for (auto& t : threads_) t.join();
  return 0;
}

void api_race_mem(const void* p, uint64_t size, int access, const void* pc) {
  Worker* w = t_worker;
  if (w && w->running) race_shared(w, w->running, p, size, access, pc);
}

const pf_api_t g_api = {
    PF_ABI_VERSION, api_barrier,   api_warp,    api_shared_alloc, api_cp_async,
    api_cp_commit,  api_cp_wait,   api_bad_access, api_fail,      api_launch,
    api_race_mem,   api_race_global,
};

uint64_t count_marks(const uint8_t* m, uint64_t n) {
  uint64_t c = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v;
    memcpy(&v, m + i, 8);
    if (v) c += __builtin_popcountll(v);
  }
  for (; i < n; ++i) c += m[i];
  return c;
}

[[noreturn]] void child_main(char* shm, uint64_t shm_size, uint64_t spec_off,
                            const std::vector<const pf_module_desc*>& mods) {
  static pf_result dummy;
  g_res = &dummy;
  auto at = [&](uint64_t off, uint64_t bytes) -> char* {
    if (off > shm_size || shm_size - off < bytes) die(3, "emulator: corrupt run specification");
    return shm + off;
  };
  const pf_wire_spec* spec = reinterpret_cast<const pf_wire_spec*>(at(spec_off, sizeof(pf_wire_spec)));
  g_res = reinterpret_cast<pf_result*>(
      at(spec->result_off, sizeof(pf_result) + 16 * uint64_t(spec->nlaunch) * spec->nbuf));
  if (spec->abi != PF_ABI_VERSION || spec->module >= mods.size())
    die(3, "emulator: run specification does not match the server");
  const pf_module_desc* mod = mods[spec->module];
  g_seed = spec->seed;
  g_order = spec->order;
  g_nworkers = spec->workers;
  if (spec->banks_off) {
    g_banks_cap = spec->banks_cap;
    g_banks = reinterpret_cast<pf_bank_table*>(
        at(spec->banks_off, sizeof(pf_bank_table) + sizeof(pf_bank_stat) * g_banks_cap));
  }
  g_page = size_t(sysconf(_SC_PAGESIZE));
  g_desc = (63 * 64 + sizeof(Fiber) + g_page - 1) & ~(g_page - 1);  // staggered descriptor
  install_handlers();
  install_altstack(get_worker(0));
  const pf_wire_buf* wb =
      reinterpret_cast<const pf_wire_buf*>(at(spec->bufs_off, sizeof(pf_wire_buf) * spec->nbuf));
  g_bufs.resize(spec->nbuf);
  g_req.assign(size_t(spec->nbuf) * PF_REQ_SLOTS, ReqLine{});
  g_gshadow.assign(spec->nbuf, GlobalShadows{});
  std::vector<char> mapped(spec->nbuf, 0);
  for (uint32_t i = 0; i < spec->nbuf; ++i) {
    pf_buf& b = g_bufs[i];
    b.base = at(wb[i].data_off, wb[i].nbytes);
    b.nbytes = wb[i].nbytes;
    b.itemsize = wb[i].itemsize;
    if (!b.itemsize || (b.itemsize & (b.itemsize - 1))) die(3, "emulator: bad item size");
    b.shift = uint32_t(__builtin_ctz(b.itemsize));
    b.name = at(wb[i].name_off, 1);
    b.rmap = b.wmap = nullptr;
    b.req = reinterpret_cast<uint64_t(*)[8]>(g_req[size_t(i) * PF_REQ_SLOTS].v);
  }
  const pf_wire_launch* wl = reinterpret_cast<const pf_wire_launch*>(
      at(spec->launches_off, sizeof(pf_wire_launch) * spec->nlaunch));
  std::vector<pf_buf*> bufptr;
  std::vector<void*> argv;
  for (uint32_t li = 0; li < spec->nlaunch; ++li) {
    const pf_wire_launch& L = wl[li];
    if (L.kernel >= mod->nkernels) die(3, "emulator: kernel index out of range");
    const pf_kernel_desc& kd = mod->kernels[L.kernel];
    g_launch = int(li);
    g_res->current = int32_t(li);
    pf_wire_arg* wa = reinterpret_cast<pf_wire_arg*>(at(L.args_off, sizeof(pf_wire_arg) * L.nargs));
    bufptr.assign(L.nargs, nullptr);
    argv.assign(L.nargs, nullptr);
    for (uint32_t a = 0; a < L.nargs; ++a) {
      int32_t bi = wa[a].buf;
      if (bi < 0) {
        argv[a] = &wa[a].value;
        continue;
      }
      if (uint32_t(bi) >= spec->nbuf) die(3, "emulator: buffer index out of range");
      pf_buf& b = g_bufs[bi];
      uint64_t nel = b.nbytes >> b.shift;
      if (!mapped[bi] && nel) {
        void* m = mmap(nullptr, 2 * nel, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) die(3, "kernel %s: cannot map traffic maps", kd.name);
        b.rmap = static_cast<uint8_t*>(m);
        b.wmap = b.rmap + nel;
        mapped[bi] = 1;
      }
      bufptr[a] = &b;
      argv[a] = &bufptr[a];
    }
    using launch_fn = int (*)(unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, void**);
    reinterpret_cast<launch_fn>(kd.launch)(L.grid[0], L.grid[1], L.grid[2], L.block[0],
                                           L.block[1], L.block[2], L.shared, argv.data());
    if (g_banks) bank_collect(li);
    for (uint32_t a = 0; a < L.nargs; ++a) {
      int32_t bi = wa[a].buf;
      if (bi < 0) continue;
      pf_buf& b = g_bufs[bi];
      int64_t* c = &g_res->counts[(size_t(li) * spec->nbuf + bi) * 4];
      uint64_t nel = b.nbytes >> b.shift;
      if (c[0] >= 0) continue;  // already counted (buffer passed twice)
      uint64_t req[2] = {0, 0};
      for (int slot = 0; slot < PF_REQ_SLOTS; ++slot) {
        req[0] += b.req[slot][0];
        req[1] += b.req[slot][1];
        b.req[slot][0] = b.req[slot][1] = 0;
      }
      c[2] = int64_t(req[0]);
      c[3] = int64_t(req[1]);
      if (!b.rmap) {
        c[0] = c[1] = 0;
        continue;
      }
      c[0] = int64_t(count_marks(b.rmap, nel) * b.itemsize);
      c[1] = int64_t(count_marks(b.wmap, nel) * b.itemsize);
      size_t bytes = (2 * nel + g_page - 1) & ~(g_page - 1);
      madvise(b.rmap, bytes, MADV_DONTNEED);  // private anonymous pages read back as zeros
      race_reset(bi);
    }
  }
  g_res->status = 1;
  fflush(stdout);
  fflush(stderr);
  _exit(0);
}

bool send_msg(int sock, uint32_t type, int64_t a, int64_t b, const char* text = nullptr,
              size_t len = 0) {
  std::vector<char> buf(sizeof(pf_msg) + len);
  pf_msg m{type, 0, a, b};
  memcpy(buf.data(), &m, sizeof m);
  if (len) memcpy(buf.data() + sizeof m, text, len);
  return send(sock, buf.data(), buf.size(), MSG_NOSIGNAL) == ssize_t(buf.size());
}

}  // namespace

// The server: argv[1] is the socket's file descriptor. Requests are served one at a time.
int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s SOCKET_FD (started by polyfuse.cuda.emulator)\n", argv[0]);
    return 2;
  }
  int sock = atoi(argv[1]);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  std::vector<const pf_module_desc*> mods;
  char* shm = nullptr;
  uint64_t shm_size = 0;
  std::vector<char> in(sizeof(pf_msg) + 8192);
  for (;;) {
    char cbuf[CMSG_SPACE(sizeof(int))];
    iovec iov{in.data(), in.size() - 1};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = cbuf;
    mh.msg_controllen = sizeof cbuf;
    ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n < ssize_t(sizeof(pf_msg))) return 0;  // closed (or garbage): the caller is gone
    pf_msg m;
    memcpy(&m, in.data(), sizeof m);
    if (m.type == MSG_LOAD) {
      in[n] = 0;
      const char* path = in.data() + sizeof m;
      void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      auto fn = h ? reinterpret_cast<const pf_module_desc* (*)(const pf_api_t*)>(
                        dlsym(h, "pf_module"))
                  : nullptr;
      const pf_module_desc* d = fn ? fn(&g_api) : nullptr;
      if (!d || d->abi != PF_ABI_VERSION) {
        const char* err = h ? (d ? "ABI version mismatch" : "no pf_module in library") : dlerror();
        send_msg(sock, MSG_LOAD, -1, 0, err, strlen(err));
        continue;
      }
      std::string text;
      for (uint32_t k = 0; k < d->nkernels; ++k)
        text += std::string(d->kernels[k].name) + " " + d->kernels[k].sig + "\n";
      mods.push_back(d);
      send_msg(sock, MSG_LOAD, int64_t(mods.size() - 1), 0, text.data(), text.size());
    } else if (m.type == MSG_MAP) {
      cmsghdr* c = CMSG_FIRSTHDR(&mh);
      if (!c || c->cmsg_type != SCM_RIGHTS) {
        send_msg(sock, MSG_MAP, -EINVAL, 0);
        continue;
      }
      int fd;
      memcpy(&fd, CMSG_DATA(c), sizeof fd);
      if (shm) munmap(shm, shm_size);
      void* p = mmap(nullptr, uint64_t(m.a), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
      shm = p == MAP_FAILED ? nullptr : static_cast<char*>(p);
      shm_size = shm ? uint64_t(m.a) : 0;
      send_msg(sock, MSG_MAP, shm ? 0 : -errno, 0);
    } else if (m.type == MSG_RUN) {
      if (!shm) {
        send_msg(sock, MSG_RUN, -EINVAL, 0);
        continue;
      }
      fflush(nullptr);
      pid_t pid = fork();
      if (pid == 0) {
        close(sock);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        child_main(shm, shm_size, uint64_t(m.a), mods);
      }
      send_msg(sock, MSG_RUN, pid < 0 ? -errno : pid, 0);
      int status = 0;
      if (pid > 0)
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
      send_msg(sock, MSG_DONE, status, 0);
    } else {
      return 3;
    }
  }
}
