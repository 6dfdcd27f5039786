// Drives a generated stage library (libstage_<k>.so) outside piperun, for
// the tests that call its entry points directly: stage_allocations (heap
// allocations per call) and stage_targets_agree (the CUDA stage under host
// emulation against the CPU stage). One buffer per tensor the descriptor
// names, laid out as piperun would hand them over (stage_abi.h).
#pragma once

#include "pipec/stage_abi.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace pipec::test {

inline size_t elementsOf(const pipec_tensor_desc &tensor) {
  size_t count = 1;
  for (int i = 0; i < tensor.rank; ++i)
    count *= static_cast<size_t>(tensor.shape[i]);
  return count;
}

inline size_t bytesOf(const pipec_tensor_desc &tensor) {
  switch (tensor.dtype) {
  case PIPEC_F64:
  case PIPEC_I64: return elementsOf(tensor) * 8;
  case PIPEC_F32:
  case PIPEC_I32: return elementsOf(tensor) * 4;
  default: return elementsOf(tensor);
  }
}

/// A loaded stage library and its six entry points; exits with status 2
/// (naming the file) when it cannot be loaded or lacks one.
struct StageLibrary {
  std::string path;
  void *handle = nullptr;
  const pipec_stage_desc *(*describe)() = nullptr;
  int (*forward)(const pipec_call *) = nullptr;
  int (*backwardInput)(const pipec_call *) = nullptr;
  int (*backwardWeight)(const pipec_call *) = nullptr;
  int (*step)(const pipec_optimizer_call *) = nullptr;
  const char *(*lastError)() = nullptr;

  explicit StageLibrary(const std::string &file) : path(file) {
    handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      std::fprintf(stderr, "%s\n", dlerror());
      std::exit(2);
    }
    describe = symbol<const pipec_stage_desc *(*)()>("pipec_stage_describe");
    forward = symbol<int (*)(const pipec_call *)>("pipec_stage_forward");
    backwardInput = symbol<int (*)(const pipec_call *)>("pipec_stage_backward_input");
    backwardWeight = symbol<int (*)(const pipec_call *)>("pipec_stage_backward_weight");
    step = symbol<int (*)(const pipec_optimizer_call *)>("pipec_stage_step");
    lastError = symbol<const char *(*)()>("pipec_stage_last_error");
  }

  template <class F> F symbol(const char *name) {
    void *address = dlsym(handle, name);
    if (!address) {
      std::fprintf(stderr, "%s has no symbol %s\n", path.c_str(), name);
      std::exit(2);
    }
    return reinterpret_cast<F>(address);
  }

  /// Calls `entry`; on failure prints the stage's message and exits 2.
  template <class Call> void run(int (*entry)(const Call *), const Call &call, const char *what) {
    if (entry(&call) != 0) {
      std::fprintf(stderr, "%s: %s failed: %s\n", path.c_str(), what, lastError());
      std::exit(2);
    }
  }
};

/// Zeroed storage (valid indices and labels, finite floats) for a list of
/// tensors, 64 bytes of slack each.
struct Buffers {
  std::vector<std::vector<char>> storage;
  std::vector<void *> pointers;
  std::vector<const pipec_tensor_desc *> tensors;
  void add(const pipec_tensor_desc &tensor, size_t bytes) {
    storage.emplace_back(bytes + 64, 0);
    pointers.push_back(storage.back().data());
    tensors.push_back(&tensor);
  }
  void add(const pipec_tensor_desc &tensor) { add(tensor, bytesOf(tensor)); }
};

/// Every buffer of one micro-batch's calls and of the optimizer step, and
/// the two call structures pointing at them (stream NULL, no timer).
struct StageBuffers {
  Buffers params, grads, data, inputs, outputs, gradOutputs, gradInputs, state, workspace;
  pipec_tensor_desc workspaceTensor{"workspace", PIPEC_BOOL, 0, nullptr};
  float loss = 0.0f;
  pipec_call call{};
  pipec_optimizer_call optimizer{};

  explicit StageBuffers(const pipec_stage_desc &desc) {
    for (int i = 0; i < desc.num_params; ++i) {
      params.add(desc.params[i].tensor);
      grads.add(desc.params[i].tensor);
      if (desc.params[i].role == PIPEC_TRAINED)
        for (int s = 0; s < desc.optimizer_state_per_param; ++s)
          state.add(desc.params[i].tensor);
    }
    for (int i = 0; i < desc.num_data; ++i)
      data.add(desc.data[i]);
    for (int i = 0; i < desc.num_inputs; ++i) {
      inputs.add(desc.inputs[i]);
      gradInputs.add(desc.inputs[i]);
    }
    for (int i = 0; i < desc.num_outputs; ++i) {
      outputs.add(desc.outputs[i]);
      gradOutputs.add(desc.outputs[i]);
    }
    workspace.add(workspaceTensor, static_cast<size_t>(desc.workspace_bytes));
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
    optimizer.learning_rate = 1e-3f;
    optimizer.beta1 = 0.9f;
    optimizer.beta2 = 0.999f;
    optimizer.epsilon = 1e-8f;
    optimizer.params = params.pointers.data();
    optimizer.grads = grads.pointers.data();
    optimizer.state = state.pointers.data();
  }
  StageBuffers(const StageBuffers &) = delete;
  StageBuffers &operator=(const StageBuffers &) = delete;
};

} // namespace pipec::test
