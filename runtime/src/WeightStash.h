// The weight versions STASH keeps and RESTORE selects for a micro-batch
// (asynchronous schedules, docs/runtime.md "How a rank executes its
// stream"): the backward of a micro-batch uses the weights its forward used.
#pragma once

#include "Chunk.h"

#include <map>
#include <memory>
#include <vector>

namespace pipec::rt {

class WeightStash {
public:
  WeightStash(Device &device, int chunks) : device_(device), chunks_(chunks) {}

  // Vertical-sync versions in a stream count from the start of its iteration.
  void startIteration(const std::vector<Chunk> &chunks);
  // STASH: keeps every chunk's current weights for micro-batch in.mb (with
  // vertical sync, the version in.version, which must be the current one;
  // `replicas` of this stage step once per micro-batch each).
  void stash(const Instr &in, const std::vector<Chunk> &chunks, int replicas);
  // RESTORE: the micro-batch's computes use its kept weights from now on.
  void restore(const Instr &in);
  // The weights the computes of micro-batch `mb` on `chunk` use.
  void *paramsFor(int chunk, int mb, StageModel &model);
  // The backward is done: the micro-batch's kept version goes.
  void release(int chunk, int mb) { chunks_[chunk].pins.erase(mb); }
  // The lowest micro-batch of `chunk` with a kept version, or -1.
  int firstKept(int chunk) const;

private:
  struct Pin {
    int version;
    std::shared_ptr<Buffer> params;
    bool restored = false;
  };
  struct ChunkPins {
    std::map<int, Pin> pins;                            // by micro-batch
    std::map<int, std::weak_ptr<Buffer>> versionCopies; // vertical sync: one copy per version
    int64_t stepsAtIterationStart = 0;
  };
  Device &device_;
  std::vector<ChunkPins> chunks_;
};

} // namespace pipec::rt
