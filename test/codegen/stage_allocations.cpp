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
#include "pipec/stage_abi.h"

#include <dlfcn.h>

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

namespace {

size_t bytesOf(const pipec_tensor_desc &tensor) {
  size_t count = 1;
  for (int i = 0; i < tensor.rank; ++i)
    count *= static_cast<size_t>(tensor.shape[i]);
  switch (tensor.dtype) {
  case PIPEC_F64:
  case PIPEC_I64: return count * 8;
  case PIPEC_F32:
  case PIPEC_I32: return count * 4;
  default: return count;
  }
}

/// Zeroed storage for every tensor: valid indices and labels (0), finite floats.
struct Buffers {
  std::vector<std::vector<char>> storage;
  std::vector<void *> pointers;
  void add(size_t bytes) {
    storage.emplace_back(bytes + 64, 0);
    pointers.push_back(storage.back().data());
  }
};

template <class F> F symbol(void *library, const char *name) {
  void *address = dlsym(library, name);
  if (!address) {
    std::fprintf(stderr, "stage_allocations: %s has no symbol %s\n", "the library", name);
    std::exit(2);
  }
  return reinterpret_cast<F>(address);
}

} // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: stage_allocations LIB [--expect-none | --expect-some]\n");
    return 2;
  }
  std::string expect = argc > 2 ? argv[2] : "";
  void *library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    std::fprintf(stderr, "stage_allocations: %s\n", dlerror());
    return 2;
  }
  auto describe = symbol<const pipec_stage_desc *(*)()>(library, "pipec_stage_describe");
  auto forward = symbol<int (*)(const pipec_call *)>(library, "pipec_stage_forward");
  auto backwardInput = symbol<int (*)(const pipec_call *)>(library, "pipec_stage_backward_input");
  auto backwardWeight = symbol<int (*)(const pipec_call *)>(library, "pipec_stage_backward_weight");
  auto step = symbol<int (*)(const pipec_optimizer_call *)>(library, "pipec_stage_step");
  auto lastError = symbol<const char *(*)()>(library, "pipec_stage_last_error");
  const pipec_stage_desc &desc = *describe();

  Buffers params, grads, data, inputs, outputs, gradOutputs, gradInputs, state, workspace;
  for (int i = 0; i < desc.num_params; ++i) {
    params.add(bytesOf(desc.params[i].tensor));
    grads.add(bytesOf(desc.params[i].tensor));
    if (desc.params[i].role == PIPEC_TRAINED)
      for (int s = 0; s < desc.optimizer_state_per_param; ++s)
        state.add(bytesOf(desc.params[i].tensor));
  }
  for (int i = 0; i < desc.num_data; ++i)
    data.add(bytesOf(desc.data[i]));
  for (int i = 0; i < desc.num_inputs; ++i) {
    inputs.add(bytesOf(desc.inputs[i]));
    gradInputs.add(bytesOf(desc.inputs[i]));
  }
  for (int i = 0; i < desc.num_outputs; ++i) {
    outputs.add(bytesOf(desc.outputs[i]));
    gradOutputs.add(bytesOf(desc.outputs[i]));
  }
  workspace.add(static_cast<size_t>(desc.workspace_bytes));
  float loss = 0.0f;
  pipec_call call{};
  call.params = params.pointers.data();
  call.data = data.pointers.data();
  call.inputs = inputs.pointers.data();
  call.outputs = outputs.pointers.data();
  call.grad_outputs = desc.num_outputs ? gradOutputs.pointers.data() : nullptr;
  call.grad_inputs = gradInputs.pointers.data();
  call.grad_params = grads.pointers.data();
  call.workspace = workspace.pointers[0];
  call.loss = desc.computes_loss ? &loss : nullptr;
  call.loss_scale = 1.0f;
  pipec_optimizer_call opt{};
  opt.learning_rate = 1e-3f;
  opt.beta1 = 0.9f;
  opt.beta2 = 0.999f;
  opt.epsilon = 1e-8f;
  opt.params = params.pointers.data();
  opt.grads = grads.pointers.data();
  opt.state = state.pointers.data();

  auto round = [&](int64_t index) {
    call.step = index;
    call.microbatch = index;
    opt.step = index + 1;
    for (auto entry : {forward, backwardInput, backwardWeight})
      if (entry(&call) != 0) {
        std::fprintf(stderr, "stage_allocations: a call failed: %s\n", lastError());
        std::exit(2);
      }
    if (step(&opt) != 0) {
      std::fprintf(stderr, "stage_allocations: step failed: %s\n", lastError());
      std::exit(2);
    }
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
