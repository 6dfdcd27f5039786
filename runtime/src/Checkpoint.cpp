#include "Checkpoint.h"

#include "SafetensorsExport.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>

namespace pipec::rt {
namespace fs = std::filesystem;

namespace {
// Replicas hold the same weights: replica 0 writes each chunk's file.
void writeStageFiles(const fs::path &dir, const std::vector<Chunk> &chunks, int replica, bool checkpoint) {
  if (replica != 0) return;
  for (const Chunk &ch : chunks)
    ch.model->writeTensorFile((dir / ("stage_" + std::to_string(ch.vs) + ".bin")).string(), checkpoint);
}
} // namespace

void saveCheckpoint(Control &control, const Plan &plan, const std::vector<Chunk> &chunks, int replica,
                    const std::string &dir, int64_t it, uint64_t seed, bool quiet) {
  const fs::path root(dir);
  const fs::path tmp = root / ("iter_" + std::to_string(it) + ".tmp"), final = root / ("iter_" + std::to_string(it));
  if (control.rank() == 0) {
    fs::create_directories(root);
    fs::remove_all(tmp);
    fs::create_directories(tmp);
  }
  control.barrier();
  writeStageFiles(tmp, chunks, replica, true);
  control.barrier();
  if (control.rank() == 0) {
    ManifestFile manifest;
    manifest.iteration = it;
    manifest.schedule = choiceName(plan.schedule);
    manifest.virtualStages = plan.stages * plan.chunks;
    manifest.microbatches = plan.microbatches;
    manifest.microbatchSize = plan.microbatchSize;
    manifest.seed = seed;
    io::detail::writeFileAtomically((tmp / "manifest.json").string(), schema::encode(manifest).dump(1) + "\n");
    fs::remove_all(final);
    fs::rename(tmp, final); // the checkpoint appears complete or not at all
    io::detail::writeFileAtomically((root / "latest").string(), final.filename().string() + "\n");
    if (!quiet) std::printf("piperun: checkpoint %s\n", final.string().c_str()), std::fflush(stdout);
  }
  control.barrier();
}

int64_t loadCheckpoint(const Plan &plan, const std::string &dir, int iters, uint64_t seed, std::vector<Chunk> &chunks) {
  // The manifest checked against the plan, --iters and the seed (Plan.cpp).
  const CheckpointManifest m = readCheckpointManifest(dir, plan, iters, seed);
  const CheckpointTensors tensors(m, [&](const std::string &name) {
    return std::any_of(chunks.begin(), chunks.end(),
                       [&](const Chunk &ch) { return ch.model->holdsCheckpointTensor(name); });
  });
  for (Chunk &ch : chunks) ch.model->loadCheckpoint(tensors);
  return m.iteration;
}

void exportWeights(Control &control, const Plan &plan, const std::vector<Chunk> &chunks, int replica,
                   const std::string &path) {
  if (!isSafetensorsPath(path)) {
    if (control.rank() == 0) fs::create_directories(path);
    control.barrier();
    writeStageFiles(path, chunks, replica, false);
    control.barrier();
    return;
  }
  // One file: the stage files go to a folder beside it (ranks share the
  // file system, as for checkpoints), and rank 0 merges them.
  const fs::path parts = path + ".parts";
  if (control.rank() == 0) {
    if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path());
    fs::remove_all(parts);
    fs::create_directories(parts);
  }
  control.barrier();
  writeStageFiles(parts, chunks, replica, false);
  control.barrier();
  if (control.rank() == 0) {
    std::vector<std::vector<io::Tensor>> stages;
    for (int vs = 0; vs < plan.stages * plan.chunks; ++vs)
      stages.push_back(io::readTensorFile((parts / ("stage_" + std::to_string(vs) + ".bin")).string(), "weights file"));
    writeSafetensors(path, stages);
    fs::remove_all(parts);
  }
  control.barrier();
}

} // namespace pipec::rt
