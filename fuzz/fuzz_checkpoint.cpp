// libFuzzer target: the checkpoint manifest reader behind `piperun --resume`
// (docs/checkpoint-format.md). The input is iter_1/manifest.json of a
// checkpoint directory whose `latest` names iter_1; readCheckpointManifest
// resolves it and checks it against a fixed two-micro-batch plan exactly as
// Executor does before loading any tensor. What it returns must be within
// the run it was checked against.
#include "FuzzSupport.h"

#include "pipec/input_file.h"

#include "Plan.h"

#include <filesystem>

namespace {
// The smallest valid plan (fuzz/corpus/fuzz_plan/job0-minimal-plan.json).
const char *const kPlan =
    R"({"format": "pipec-plan", "version": 2, "pipeline": {"schedule": "1f1b", "microbatches": 2},)"
    R"( "stages": [{"ranks": [0, 1]}], "runtime": {)"
    R"( "microbatch_size": 8, "stages": [{"id": 0, "library": "stages/libstage_0.so",)"
    R"( "weights": "weights/stage_0.bin"}], "optimizer": {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-08,)"
    R"( "lr": 0.001, "momentum": 0.0, "name": "adamw", "weight_decay": 0.01}}})";
constexpr int64_t kIters = 100;
constexpr uint64_t kSeed = 1;

const pipec::rt::Plan &fixedPlan() {
  static const pipec::rt::Plan plan = [] {
    std::filesystem::create_directories(pipec::fuzz::scratchDir() / "plan");
    pipec::fuzz::writeInput("plan/plan.json", kPlan);
    return pipec::rt::loadPlan((pipec::fuzz::scratchDir() / "plan").string());
  }();
  return plan;
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const pipec::rt::Plan &plan = fixedPlan();
  const std::filesystem::path checkpoint = pipec::fuzz::scratchDir() / "ckpt";
  std::filesystem::create_directories(checkpoint / "iter_1");
  pipec::fuzz::writeInput("ckpt/latest", "iter_1\n");
  pipec::fuzz::writeInput("ckpt/iter_1/manifest.json", data, size);
  try {
    const pipec::rt::CheckpointManifest m = pipec::rt::readCheckpointManifest(checkpoint.string(), plan, kIters, kSeed);
    if (m.iteration < 0 || m.iteration > kIters) pipec::fuzz::violated("manifest iteration outside 0..iters");
    (void)m.stageFile(0);
  } catch (const pipec::rt::Error &) {
  } catch (const pipec::io::FormatError &) {
  } catch (const pipec::io::InputError &) {
  }
  return 0;
}
