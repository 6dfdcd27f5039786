// Counts the heap allocations a generated stage library makes per call
// (docs/optimization.md): loads libstage_<k>.so, calls every entry point
// once to warm up (the arena, kernel scratch and BLAS buffers are allocated
// then), then counts malloc-family calls over three more rounds of forward,
// backward_input, backward_weight and step.
//
//   stage_allocations LIB [--expect-none | --expect-some]
//
// Prints "allocations per round: N" and exits 1 when the expectation fails.
// With STAGE_ALLOCATIONS_TRAP set, the first counted allocation raises
// SIGTRAP, so that `gdb -ex run -ex bt` shows who made it.
#include "StageDriver.h"

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
void *__libc_malloc(size_t);
void *__libc_calloc(size_t, size_t);
void *__libc_realloc(void *, size_t);
void *__libc_memalign(size_t, size_t);
}

namespace {
std::atomic<bool> counting{false};
std::atomic<long> allocations{0};
bool trap = false; // STAGE_ALLOCATIONS_TRAP set: SIGTRAP at the first one (run under gdb)
void count() {
  if (counting.load(std::memory_order_relaxed)) {
    allocations.fetch_add(1, std::memory_order_relaxed);
    if (trap)
      std::raise(SIGTRAP);
  }
}
} // namespace

// The executable's definitions come first in symbol lookup, so calls from
// the stage library, the kernels and libstdc++ (operator new) land here.
extern "C" void *malloc(size_t size) {
  count();
  return __libc_malloc(size);
}
extern "C" void *calloc(size_t n, size_t size) {
  count();
  return __libc_calloc(n, size);
}
extern "C" void *realloc(void *pointer, size_t size) {
  count();
  return __libc_realloc(pointer, size);
}
extern "C" void *memalign(size_t alignment, size_t size) {
  count();
  return __libc_memalign(alignment, size);
}
extern "C" void *aligned_alloc(size_t alignment, size_t size) {
  count();
  return __libc_memalign(alignment, size);
}
extern "C" int posix_memalign(void **out, size_t alignment, size_t size) {
  count();
  *out = __libc_memalign(alignment, size);
  return *out ? 0 : 12 /* ENOMEM */;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: stage_allocations LIB [--expect-none | --expect-some]\n");
    return 2;
  }
  std::string expect = argc > 2 ? argv[2] : "";
  pipec::test::StageLibrary library(argv[1]);
  pipec::test::StageBuffers buffers(*library.describe());
  pipec_call &call = buffers.call;
  pipec_optimizer_call &opt = buffers.optimizer;

  auto round = [&](int64_t index) {
    call.step = index;
    call.microbatch = index;
    opt.step = index + 1;
    library.run(library.forward, call, "forward");
    library.run(library.backwardInput, call, "backward_input");
    library.run(library.backwardWeight, call, "backward_weight");
    library.run(library.step, opt, "step");
  };
  round(0);
  trap = std::getenv("STAGE_ALLOCATIONS_TRAP") != nullptr;
  constexpr int kRounds = 3;
  counting = true;
  for (int i = 1; i <= kRounds; ++i)
    round(i);
  counting = false;
  long perRound = allocations.load() / kRounds;
  std::printf("allocations per round: %ld (%ld over %d rounds)\n", perRound, allocations.load(),
              kRounds);
  if (expect == "--expect-none" && allocations.load() != 0)
    return 1;
  if (expect == "--expect-some" && allocations.load() == 0)
    return 1;
  return 0;
}
