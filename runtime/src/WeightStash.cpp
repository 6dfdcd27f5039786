#include "WeightStash.h"

namespace pipec::rt {

void WeightStash::startIteration(const std::vector<Chunk> &chunks) {
  for (size_t c = 0; c < chunks.size(); ++c) chunks_[c].stepsAtIterationStart = chunks[c].model->steps;
}

void WeightStash::stash(const Instr &in, const std::vector<Chunk> &chunks, int replicas) {
  for (size_t c = 0; c < chunks.size(); ++c) {
    StageModel &model = *chunks[c].model;
    ChunkPins &cp = chunks_[c];
    Pin pin;
    pin.version = in.version;
    if (in.version >= 0) {
      // Vertical sync: pin the current version; micro-batches pinning the
      // same version share one copy.
      const int64_t current = (int64_t)replicas * (model.steps - cp.stepsAtIterationStart);
      if (in.version != current)
        throw Error(toString(in) + ": this rank is at weight version " + std::to_string(current));
      pin.params = cp.versionCopies[in.version].lock();
      if (!pin.params) {
        pin.params = std::make_shared<Buffer>(device_);
        pin.params->copyFrom(model.params());
        cp.versionCopies[in.version] = pin.params;
      }
    } else {
      pin.params = std::make_shared<Buffer>(device_);
      pin.params->copyFrom(model.params());
    }
    cp.pins[in.mb] = pin;
  }
}

void WeightStash::restore(const Instr &in) {
  for (ChunkPins &cp : chunks_) {
    auto p = cp.pins.find(in.mb);
    if (p == cp.pins.end()) throw Error(toString(in) + ": no weight version was stashed for this micro-batch");
    if (in.version >= 0 && p->second.version != in.version)
      throw Error(toString(in) + ": the micro-batch keeps version " + std::to_string(p->second.version));
    p->second.restored = true;
  }
}

void *WeightStash::paramsFor(int chunk, int mb, StageModel &model) {
  auto it = chunks_[chunk].pins.find(mb);
  if (it != chunks_[chunk].pins.end() && it->second.restored) return it->second.params->data();
  return model.params().data();
}

int WeightStash::firstKept(int chunk) const {
  const auto &pins = chunks_[chunk].pins;
  return pins.empty() ? -1 : pins.begin()->first;
}

} // namespace pipec::rt
