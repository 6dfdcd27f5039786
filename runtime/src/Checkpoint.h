// The files a run leaves besides its trace and profile: checkpoints
// (--checkpoint/--save-every, --resume; docs/checkpoint-format.md) and the
// trained weights (--export-weights; docs/weights-format.md). Writing is
// collective: replica 0 of every stage writes its chunks' stage_<vs>.bin,
// rank 0 the rest.
#pragma once

#include "Chunk.h"
#include "Transport.h"

#include <string>
#include <vector>

namespace pipec::rt {

// DIR/iter_<it>, complete or not at all, then DIR/latest names it.
void saveCheckpoint(Control &control, const Plan &plan, const std::vector<Chunk> &chunks, int replica,
                    const std::string &dir, int64_t it, uint64_t seed, bool quiet);
// The chunks' state from DIR (or DIR/latest), its manifest checked against
// the plan, --iters and the seed; returns the iteration it continues from.
int64_t loadCheckpoint(const Plan &plan, const std::string &dir, int iters, uint64_t seed, std::vector<Chunk> &chunks);
// --export-weights: DIR/stage_<vs>.bin per virtual stage, or with a path
// ending in .safetensors one safetensors file of every stage's weights
// (SafetensorsExport.h).
void exportWeights(Control &control, const Plan &plan, const std::vector<Chunk> &chunks, int replica,
                   const std::string &path);

} // namespace pipec::rt
