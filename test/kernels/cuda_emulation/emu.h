// Host emulation of the CUDA execution model for pipec's CUDA kernels
// (force-included into the sources prep.py translates; see
// cuda_kernels_emulated_test.cpp for what this proves and what it cannot).
//
// Every CUDA thread of a block is a user-space fiber on the one OS thread
// (a register-saving stack switch on x86-64, ucontext elsewhere); blocks run one after another. A fiber runs its CUDA thread until it
// finishes or reaches a barrier (__syncthreads, or the warp rendezvous inside
// __shfl_down_sync and __shfl_sync); a finished fiber takes the next unstarted thread of the
// block, so kernels that never synchronize cost a function call per thread.
// Barriers really wait: a thread past __syncthreads sees every other thread's
// writes from before it, and none from after it. Fibers and their stacks are
// reused across blocks and launches. Deterministic schedules that vary by block
// and launch make hazards show: odd launches run their blocks in reverse; a
// block starts its threads in ascending or descending order, and threads a
// barrier releases are resumed either after everything already runnable
// (FIFO: every thread passes a barrier before any runs ahead) or first (LIFO:
// the released warp or block runs ahead of threads still on their way out of
// an earlier barrier), so a missing __syncthreads shows as a read-before-write
// or a write-before-read, whichever side of the race it is.
//
// Errors the emulation reports (abort with "EMU: ..."): bad launch
// configurations, work on a stream other than the scope's, a barrier that
// some threads of the block never reach (deadlock on hardware), threads of
// one block waiting at different __syncthreads calls, shuffles in partial
// warps.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#include <vector>
#include "cuda_runtime.h"

// Production sources poison reused kernel scratch under this macro, as
// fresh emulated device memory is (context.cu, detail::scratch).
#define PIPEC_CUDA_EMULATION 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Blocks run one after another, so one static array per __shared__
// declaration is the block's shared memory.
#define __shared__ static

struct uint3 { unsigned x = 0, y = 0, z = 0; };
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
// One OS thread runs everything: the scheduler sets threadIdx before it
// resumes a fiber.
inline uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

namespace emu {
[[noreturn]] inline void die(const char *msg) {
  std::fprintf(stderr, "EMU: %s (launch %d, block %u, thread %u)\n", msg, launches, blockIdx.x, threadIdx.x);
  std::fflush(stderr);
  std::abort();
}

#if defined(__x86_64__) && defined(__ELF__) && !defined(EMU_UCONTEXT)
#define EMU_ASM_SWITCH 1
// emu_switch(&save, to): saves the callee-saved registers, MXCSR and the x87
// control word on the current stack, stores its pointer in *save, and resumes
// the stack `to` (made by emu_switch itself or by Sched::makeFiber). No
// signal-mask system call, unlike swapcontext. Weak: every translation unit
// that includes emu.h defines it.
extern "C" void emu_switch(void **save, void *to);
asm(R"(
  .pushsection .text
  .p2align 4
  .weak emu_switch
  .type emu_switch, @function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch, .-emu_switch
  .popsection
)");
#endif

struct Fiber {
#ifdef EMU_ASM_SWITCH
  void *sp = nullptr;
#else
  ucontext_t ctx;
#endif
  unsigned tid = 0;
};

struct Barrier {
  unsigned count = 0, arrived = 0;
  const char *file = nullptr;
  int line = 0;
  std::vector<Fiber *> waiters;
  void reset(unsigned n) {
    count = n;
    arrived = 0;
    waiters.clear();
  }
  void wait(const char *f, int l);
};
struct Warp {
  Barrier bar;
  // Double-buffered by call parity: a lane released from one shuffle can
  // only run ahead to the next one (which waits for every lane), so it never
  // overwrites a value a slower lane has yet to read.
  alignas(8) unsigned char buf[2][32][8];
  unsigned char parity[32];
};

struct Sched {
  static constexpr size_t kStack = 256 * 1024;
#ifdef EMU_ASM_SWITCH
  void *mainSp = nullptr;
#else
  ucontext_t main;
#endif
  std::vector<Fiber *> idle;
  std::deque<Fiber *> ready; // released from a barrier, not yet resumed
  Fiber *cur = nullptr;
  const std::function<void()> *body = nullptr;
  unsigned nThreads = 0, nextStart = 0, finished = 0;
  bool reverse = false, lifo = false;
  Barrier block;
  std::vector<Warp> warps;
  long long threadsRun = 0, switches = 0;

  static void entry() { instance().loop(); }
  static Sched &instance() {
    static Sched *s = new Sched; // never destroyed: fibers may still point into it at exit
    return *s;
  }
  void loop() {
    for (;;) {
      while (nextStart < nThreads) {
        const unsigned k = nextStart++;
        cur->tid = reverse ? nThreads - 1 - k : k;
        threadIdx.x = cur->tid;
        (*body)();
        ++finished;
        ++threadsRun;
      }
      Fiber *self = cur;
      idle.push_back(self);
      toMain(self);
    }
  }
  void toMain(Fiber *self) {
#ifdef EMU_ASM_SWITCH
    emu_switch(&self->sp, mainSp);
#else
    swapcontext(&self->ctx, &main);
#endif
  }
  Fiber *makeFiber() {
    // A guard page below each stack turns an overflow into a crash.
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void *mem = mmap(nullptr, kStack + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) die("cannot map a fiber stack");
    mprotect(mem, page, PROT_NONE);
    Fiber *f = new Fiber;
#ifdef EMU_ASM_SWITCH
    // What emu_switch pops: MXCSR + x87 control word, r15..r12, rbx, rbp,
    // then the return address (entry), 16-byte aligned so that entry starts
    // as if called; above it a null return address entry never uses.
    uint64_t *top = (uint64_t *)((char *)mem + page + kStack);
    uint64_t *ret = top - 2;
    ret[1] = 0;
    ret[0] = (uint64_t)(void (*)())entry;
    for (int i = 1; i <= 6; ++i) ret[-i] = 0;
    uint64_t *csr = ret - 7;
    *csr = 0x1F80u | ((uint64_t)0x037Fu << 32);
    f->sp = csr;
#else
    getcontext(&f->ctx);
    f->ctx.uc_stack.ss_sp = (char *)mem + page;
    f->ctx.uc_stack.ss_size = kStack;
    f->ctx.uc_link = nullptr;
    makecontext(&f->ctx, (void (*)())entry, 0);
#endif
    return f;
  }
  void resume(Fiber *f) {
    cur = f;
    threadIdx.x = f->tid;
    ++switches;
#ifdef EMU_ASM_SWITCH
    emu_switch(&mainSp, f->sp);
#else
    swapcontext(&main, &f->ctx);
#endif
    cur = nullptr;
  }
  // Called on a fiber: park it until the scheduler resumes it.
  void park() {
    Fiber *self = cur;
    toMain(self);
    threadIdx.x = self->tid;
  }
  void runBlock(unsigned n, const std::function<void()> &f) {
    body = &f;
    nThreads = n;
    nextStart = finished = 0;
    block.reset(n);
    warps.resize((n + 31) / 32);
    for (auto &w : warps) {
      w.bar.reset(32);
      std::memset(w.parity, 0, sizeof w.parity);
    }
    ready.clear();
    while (finished < nThreads) {
      Fiber *next;
      if (!ready.empty()) {
        next = ready.front();
        ready.pop_front();
      } else if (nextStart < nThreads) {
        if (idle.empty()) idle.push_back(makeFiber());
        next = idle.back();
        idle.pop_back();
      } else {
        threadIdx.x = 0;
        std::fprintf(stderr, "EMU: %u of %u threads wait at the barrier at %s:%d that the others never reach\n",
                     block.arrived, nThreads, block.file ? block.file : "?", block.line);
        die("barrier deadlock");
      }
      resume(next);
    }
  }
};
inline Sched &sched() { return Sched::instance(); }

inline void Barrier::wait(const char *f, int l) {
  Sched &s = sched();
  if (arrived == 0) {
    file = f;
    line = l;
  } else if (line != l || std::strcmp(file, f) != 0) {
    std::fprintf(stderr, "EMU: threads of one block wait at different barriers: %s:%d and %s:%d\n", file, line, f, l);
    die("divergent barrier");
  }
  if (++arrived == count) {
    arrived = 0;
    if (s.lifo)
      s.ready.insert(s.ready.begin(), waiters.begin(), waiters.end());
    else
      s.ready.insert(s.ready.end(), waiters.begin(), waiters.end());
    waiters.clear();
    return;
  }
  waiters.push_back(s.cur);
  s.park();
}

struct Cfg {
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  Cfg(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = nullptr) : grid(g), block(b), smem(s), stream(st) {}
};
template <class F> void run(const Cfg &c, F f) {
  checkStream(c.stream);
  ++launches;
  if (replaying) ++graphWork;
  if (c.grid.x < 1 || c.grid.x > 0x7fffffffu || c.grid.y != 1 || c.grid.z != 1 || c.block.x < 1 || c.block.x > 1024 ||
      c.block.y != 1 || c.block.z != 1 || c.smem > 48 * 1024) {
    std::fprintf(stderr, "EMU: bad launch config grid %u block %u smem %zu\n", c.grid.x, c.block.x, c.smem);
    lastError = cudaErrorInvalidConfiguration;
    return;
  }
  if (countOnly) return;
  Sched &s = sched();
  const bool reverseBlocks = (launches & 1) != 0;
  blockDim = c.block;
  gridDim = c.grid;
  const std::function<void()> body = f;
  for (unsigned k = 0; k < c.grid.x; ++k) {
    blockIdx.x = reverseBlocks ? c.grid.x - 1 - k : k;
    const unsigned mode = (unsigned)launches / 2 + k;
    s.reverse = (mode & 1) != 0;
    s.lifo = (mode & 2) != 0;
    s.runBlock(c.block.x, body);
  }
}
// A launch while the stream captures is recorded with copies of its
// arguments (CUDA copies them at capture), and runs when the graph does.
template <class K> auto launch(Cfg c, K kernel) {
  return [c, kernel](auto... args) {
    checkStream(c.stream);
    if (recorded(c.stream, [c, kernel, args...] { run(c, [&] { kernel(args...); }); })) return;
    run(c, [&] { kernel(args...); });
  };
}
} // namespace emu

#define __syncthreads() (emu::sched().block.wait(__FILE__, __LINE__))
namespace emu {
/// One warp shuffle: this lane's v published to its warp, every lane waited
/// for, then the value lane `source(lane)` published (v itself when that is
/// past the warp).
template <class T, class Source> T warpShuffle(unsigned mask, T v, Source source) {
  static_assert(sizeof(T) <= 8, "");
  if (mask != 0xffffffffu || blockDim.x % 32) die("shuffle in a partial warp");
  const unsigned lane = threadIdx.x & 31;
  Warp &w = sched().warps[threadIdx.x / 32];
  const unsigned p = w.parity[lane];
  w.parity[lane] ^= 1;
  std::memcpy(w.buf[p][lane], &v, sizeof(T));
  w.bar.wait(__FILE__, __LINE__);
  T r = v;
  const unsigned from = source(lane);
  if (from < 32) std::memcpy(&r, w.buf[p][from], sizeof(T));
  return r;
}
} // namespace emu
/// A warp barrier: every lane waits for the others, and sees their writes
/// from before it (the row norms' lanes read what a joined loop stored).
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu || blockDim.x % 32) emu::die("__syncwarp in a partial warp");
  emu::sched().warps[threadIdx.x / 32].bar.wait(__FILE__, __LINE__);
}
template <class T> T __shfl_down_sync(unsigned mask, T v, int offset) {
  return emu::warpShuffle(mask, v, [&](unsigned lane) { return lane + (unsigned)offset; });
}
template <class T> T __shfl_sync(unsigned mask, T v, int srcLane) {
  return emu::warpShuffle(mask, v, [&](unsigned) { return (unsigned)srcLane & 31u; });
}
inline float atomicAdd(float *p, float v) {
  const float old = *p;
  *p = old + v;
  return old;
}
inline unsigned atomicAdd(unsigned *p, unsigned v) {
  const unsigned old = *p;
  *p = old + v;
  return old;
}
// One OS thread runs the blocks one after another, and a fiber switches
// only at a barrier: every write is seen by every later read, which is
// what the fence orders on a GPU (a "last block" reads the other blocks'
// writes after its atomic arrival). An L2-only load is a load.
inline void __threadfence() {}
template <class T> T __ldcg(const T *p) { return *p; }
inline int atomicCAS(int *p, int cmp, int val) {
  const int old = *p;
  if (old == cmp) *p = val;
  return old;
}
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dmul_rn(double a, double b) { return a * b; }
using std::max;
using std::min;
