// One chunk of a rank: the virtual stage it runs, with the stage library,
// parameters and gradients (StageModel). The executor owns them, in chunk
// order; its parts (slots, weight stash, gradient sync, outputs) read them.
#pragma once

#include "StageModel.h"

#include <memory>

namespace pipec::rt {

struct Chunk {
  std::unique_ptr<StageModel> model;
  int vs = 0; // virtual stage
};

} // namespace pipec::rt
