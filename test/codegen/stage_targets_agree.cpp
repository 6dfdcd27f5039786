// Two builds of one stage, called with the same tensors, must compute the
// same training step: the CPU stage, and the CUDA stage of the same model
// translated for host emulation (cuda_stage_emulated.py): its generated
// fused kernels, memory plan and in-place GEMMs on the emulated CUDA kernel
// library. Five micro-batches of forward, backward_input and backward_weight
// (the later ones accumulate into the weight gradients; the last three at
// the next steps' dropout keys), then the optimizer step; after each call
// every tensor it wrote is compared. An emulated CUDA stage runs the first
// micro-batch launch by launch and replays CUDA graphs of its calls from the
// second on (docs/cuda-codegen.md, "CUDA graphs"): the third and fourth are
// replays, which must draw their own dropout masks; the fifth asks for no
// graphs (pipec_call.no_graphs, piperun --no-cuda-graphs) and gets none.
//
//   stage_targets_agree REFERENCE_LIB OTHER_LIB [--tolerance R]
//
// A tensor agrees when max |ref - other| <= R * max(max |ref|, 1e-3)
// (default R = 1e-4). Prints one line per compared tensor with its worst
// relative difference; exits 1 on any disagreement, 2 when a library
// cannot run.
#include "StageDriver.h"

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

using pipec::test::Buffers;
using pipec::test::StageBuffers;
using pipec::test::StageLibrary;

namespace {

/// The same descriptors on both sides: what the stage reads and writes.
bool sameDescriptors(const pipec_stage_desc &a, const pipec_stage_desc &b) {
  auto same = [](const pipec_tensor_desc &x, const pipec_tensor_desc &y) {
    return x.dtype == y.dtype && x.rank == y.rank && std::equal(x.shape, x.shape + x.rank, y.shape);
  };
  auto sameList = [&](int n, const pipec_tensor_desc *x, int m, const pipec_tensor_desc *y) {
    if (n != m)
      return false;
    for (int i = 0; i < n; ++i)
      if (!same(x[i], y[i]))
        return false;
    return true;
  };
  if (a.num_params != b.num_params || a.computes_loss != b.computes_loss || a.optimizer != b.optimizer ||
      a.optimizer_state_per_param != b.optimizer_state_per_param)
    return false;
  for (int i = 0; i < a.num_params; ++i)
    if (!same(a.params[i].tensor, b.params[i].tensor) || a.params[i].role != b.params[i].role)
      return false;
  return sameList(a.num_data, a.data, b.num_data, b.data) &&
         sameList(a.num_inputs, a.inputs, b.num_inputs, b.inputs) &&
         sameList(a.num_outputs, a.outputs, b.num_outputs, b.outputs);
}

/// Deterministic values in [lo, hi) (a 64-bit LCG), the same on both sides.
struct Values {
  uint64_t state;
  explicit Values(uint64_t seed) : state(seed * 6364136223846793005ull + 1442695040888963407ull) {}
  double next(double lo, double hi) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * static_cast<double>(state >> 11) / 9007199254740992.0;
  }
};

/// Fills a tensor: floats in [lo, hi); integers and booleans 0 or 1 (a valid
/// class, token or index for any model with two or more).
void fill(void *p, const pipec_tensor_desc &t, Values &values, double lo, double hi) {
  const size_t n = pipec::test::elementsOf(t);
  for (size_t i = 0; i < n; ++i) {
    switch (t.dtype) {
    case PIPEC_F32: static_cast<float *>(p)[i] = static_cast<float>(values.next(lo, hi)); break;
    case PIPEC_F64: static_cast<double *>(p)[i] = values.next(lo, hi); break;
    case PIPEC_I64: static_cast<int64_t *>(p)[i] = values.next(0, 1) < 0.5 ? 0 : 1; break;
    case PIPEC_I32: static_cast<int32_t *>(p)[i] = values.next(0, 1) < 0.5 ? 0 : 1; break;
    default: static_cast<uint8_t *>(p)[i] = values.next(0, 1) < 0.5 ? 0 : 1; break;
    }
  }
}

double valueAt(const void *p, pipec_dtype dtype, size_t i) {
  switch (dtype) {
  case PIPEC_F32: return static_cast<const float *>(p)[i];
  case PIPEC_F64: return static_cast<const double *>(p)[i];
  case PIPEC_I64: return static_cast<double>(static_cast<const int64_t *>(p)[i]);
  case PIPEC_I32: return static_cast<const int32_t *>(p)[i];
  default: return static_cast<const uint8_t *>(p)[i];
  }
}

struct Comparison {
  double tolerance;
  int compared = 0, failed = 0;

  void check(const std::string &what, const void *ref, const void *other, const pipec_tensor_desc &t) {
    const size_t n = pipec::test::elementsOf(t);
    double scale = 1e-3, worst = 0;
    size_t worstAt = 0;
    bool nan = false;
    for (size_t i = 0; i < n; ++i)
      scale = std::max(scale, std::fabs(valueAt(ref, t.dtype, i)));
    for (size_t i = 0; i < n; ++i) {
      const double a = valueAt(ref, t.dtype, i), b = valueAt(other, t.dtype, i);
      if (std::isnan(a) != std::isnan(b)) {
        nan = true;
        worstAt = i;
        break;
      }
      if (std::isnan(a))
        continue;
      if (std::fabs(a - b) / scale > worst) {
        worst = std::fabs(a - b) / scale;
        worstAt = i;
      }
    }
    const bool ok = !nan && worst <= tolerance;
    ++compared;
    failed += !ok;
    std::printf("%s %-44s %8zu elements  worst %.2e%s\n", ok ? "ok  " : "FAIL", what.c_str(), n, worst,
                ok ? "" : (" at " + std::to_string(worstAt)).c_str());
  }

  void check(const std::string &what, const Buffers &ref, const Buffers &other) {
    for (size_t i = 0; i < ref.pointers.size(); ++i)
      check(what + " " + (ref.tensors[i]->name ? ref.tensors[i]->name : std::to_string(i)), ref.pointers[i],
            other.pointers[i], *ref.tensors[i]);
  }
};

} // namespace

int main(int argc, char **argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: stage_targets_agree REFERENCE_LIB OTHER_LIB [--tolerance R]\n");
    return 2;
  }
  Comparison comparison{argc > 4 && std::string(argv[3]) == "--tolerance" ? std::atof(argv[4]) : 1e-4};
  StageLibrary ref(argv[1]), other(argv[2]);
  const pipec_stage_desc &desc = *ref.describe();
  if (!sameDescriptors(desc, *other.describe())) {
    std::fprintf(stderr, "FAIL the two stages describe different tensors\n");
    return 1;
  }
  StageBuffers a(desc), b(*other.describe());
  // Parameters in [-0.5, 0.5), buffers (running statistics) in [0.5, 1.5).
  for (StageBuffers *side : {&a, &b}) {
    Values values(1);
    for (int i = 0; i < desc.num_params; ++i) {
      const bool buffer = desc.params[i].role == PIPEC_BUFFER;
      fill(side->params.pointers[i], desc.params[i].tensor, values, buffer ? 0.5 : -0.5, buffer ? 1.5 : 0.5);
    }
  }
  // An emulated CUDA stage counts its device allocations: after the first
  // micro-batch (arena, kernel scratch, cuBLASLt workspace) there are none.
  auto deviceAllocations = reinterpret_cast<long (*)()>(dlsym(other.handle, "pipec_emu_device_allocations"));
  long allocationsAfterFirst = 0;
  auto emuCount = reinterpret_cast<long (*)(const char *)>(dlsym(other.handle, "pipec_emu_count"));
  for (int64_t microbatch = 0; microbatch < 5; ++microbatch) {
    if (microbatch == 1 && deviceAllocations) allocationsAfterFirst = deviceAllocations();
    const std::string mb = "micro-batch " + std::to_string(microbatch) + ":";
    for (StageBuffers *side : {&a, &b}) {
      Values values(100 + microbatch);
      for (size_t i = 0; i < side->data.pointers.size(); ++i)
        fill(side->data.pointers[i], *side->data.tensors[i], values, -1, 1);
      for (size_t i = 0; i < side->inputs.pointers.size(); ++i)
        fill(side->inputs.pointers[i], *side->inputs.tensors[i], values, -1, 1);
      for (size_t i = 0; i < side->gradOutputs.pointers.size(); ++i)
        fill(side->gradOutputs.pointers[i], *side->gradOutputs.tensors[i], values, -1, 1);
      side->call.step = microbatch / 2;
      side->call.microbatch = microbatch;
      side->call.no_graphs = microbatch == 4;
      side->call.seed = 7;
      side->call.loss_scale = 0.5f;
    }
    ref.run(ref.forward, a.call, "forward");
    other.run(other.forward, b.call, "forward");
    comparison.check(mb + " output", a.outputs, b.outputs);
    comparison.check(mb + " parameter after forward", a.params, b.params);
    if (desc.computes_loss) {
      static const int64_t scalar[1] = {1};
      const pipec_tensor_desc loss{"loss", PIPEC_F32, 1, scalar};
      comparison.check(mb + " loss", &a.loss, &b.loss, loss);
    }
    ref.run(ref.backwardInput, a.call, "backward_input");
    other.run(other.backwardInput, b.call, "backward_input");
    comparison.check(mb + " input gradient", a.gradInputs, b.gradInputs);
    ref.run(ref.backwardWeight, a.call, "backward_weight");
    other.run(other.backwardWeight, b.call, "backward_weight");
    comparison.check(mb + " weight gradient", a.grads, b.grads);
  }
  if (deviceAllocations) {
    const long more = deviceAllocations() - allocationsAfterFirst;
    std::printf("%s %ld device allocations after the first micro-batch of the other stage\n", more ? "FAIL" : "ok  ",
                more);
    if (more) ++comparison.failed;
  }
  if (emuCount) {
    const long graphs = emuCount("graph_launches");
    // Forward, backward_input and backward_weight of micro-batches 1-3; none of 4.
    std::printf("%s %ld CUDA graph launches in the other stage's micro-batches (9 expected)\n",
                graphs == 9 ? "ok  " : "FAIL", graphs);
    if (graphs != 9) ++comparison.failed;
  }
  for (StageBuffers *side : {&a, &b})
    side->optimizer.step = 1;
  ref.run(ref.step, a.optimizer, "step");
  other.run(other.step, b.optimizer, "step");
  comparison.check("after the step: parameter", a.params, b.params);
  comparison.check("after the step: optimizer state", a.state, b.state);
  // The runtime's verdict (pipec_step_control, in each stage's memory: the
  // emulated device's is the host's): a clipped step, then a skipped one,
  // which must leave parameters and state as they were.
  pipec_step_control clipped{0.375, 0.0}, skipped{1.0, 1.0};
  for (StageBuffers *side : {&a, &b})
    side->optimizer.step = 2, side->optimizer.control = &clipped;
  ref.run(ref.step, a.optimizer, "step");
  other.run(other.step, b.optimizer, "step");
  comparison.check("after a clipped step: parameter", a.params, b.params);
  comparison.check("after a clipped step: optimizer state", a.state, b.state);
  const auto before = [](StageBuffers &side) { return std::make_pair(side.params.storage, side.state.storage); };
  const auto aBefore = before(a), bBefore = before(b);
  for (StageBuffers *side : {&a, &b})
    side->optimizer.step = 3, side->optimizer.control = &skipped;
  ref.run(ref.step, a.optimizer, "step");
  other.run(other.step, b.optimizer, "step");
  const bool unchanged = before(a) == aBefore && before(b) == bBefore;
  std::printf("%s a skipped step leaves parameters and state as they were\n", unchanged ? "ok  " : "FAIL");
  if (!unchanged) ++comparison.failed;
  comparison.check("after a skipped step: parameter", a.params, b.params);
  std::printf("%d tensors compared, %d disagree (tolerance %.1e)\n", comparison.compared, comparison.failed,
              comparison.tolerance);
  return comparison.failed ? 1 : 0;
}
