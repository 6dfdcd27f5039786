// libFuzzer target: piperun's and pipeseq's plan reader. The input is
// plan.json; loadPlan(DIR) reads DIR/plan.json exactly as piperun does, and
// the schedule-rank arithmetic piperun uses next must stay in range.
#include "FuzzSupport.h"

#include "pipec/input_file.h"

#include "Plan.h"

#include <filesystem>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  pipec::fuzz::writeInput("plan.json", data, size);
  const std::string dir = pipec::fuzz::scratchDir().string();
  try {
    const pipec::rt::Plan plan = pipec::rt::loadPlan(dir);
    // What loadPlan promises to its callers (Executor, pipeseq).
    if (plan.stages < 1 || (int)plan.ranks.size() != plan.stages) pipec::fuzz::violated("plan.stages/ranks");
    if ((int)plan.vstages.size() != plan.stages * plan.chunks) pipec::fuzz::violated("plan.vstages size");
    for (int s = 0; s < plan.stages; ++s)
      for (int c = 0; c < plan.chunks; ++c) {
        const int v = plan.virtualStage(s, c);
        if (v < 0 || v >= (int)plan.vstages.size()) pipec::fuzz::violated("virtualStage out of range");
      }
    const int ranks = plan.numRanks();
    for (int r = 0; r < ranks; ++r) {
      const int mpi = plan.mpiRankOf(r);
      if (mpi < 0 || mpi >= ranks) pipec::fuzz::violated("mpiRankOf out of range");
      (void)plan.scheduleFile(r);
    }
  } catch (const pipec::rt::Error &) {
  } catch (const pipec::io::FormatError &) {
  } catch (const pipec::io::InputError &) {
  }
  return 0;
}
