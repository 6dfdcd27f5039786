// How the job directory is written (docs/codegen.md): the settings of the
// job writer, which `pipec MODEL --out DIR` and the `pipec-write-job` pass
// share (docs/settings.md). The directory itself is the planner's --out for
// pipec, the pass's out= for pipec-opt.
#ifndef PIPEC_COMPILER_DRIVER_JOBOPTIONS_H
#define PIPEC_COMPILER_DRIVER_JOBOPTIONS_H

#include "analysis/Settings/Settings.h"

#include <cstdint>
#include <string>
#include <vector>

namespace pipec {

struct JobOptions {
  /// Compile the generated stages into DIR/stages/libstage_<k>.so.
  bool build = false;
  /// Stage code target; it must be the one the memory plan was made for.
  Target target = Target::Cpu;
  /// Precision of the CUDA stages' matrix products (the cost model's).
  Precision precision = Precision::F32;
  /// GPU architectures of the CUDA stages, e.g. "sm_80": each checked when
  /// given (sm_ and two or three digits).
  std::vector<std::string> cudaArchs = {"sm_80", "sm_90"};
  /// Seed of dropout masks and synthetic data, recorded in plan.json.
  uint64_t seed = 0;

  bool cudaTarget() const { return target == Target::Cuda; }
  void bind(settings::Binder &binder);
};

} // namespace pipec

#endif
