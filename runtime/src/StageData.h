// The data fields a rank's chunks read (docs/dataset-format.md): from
// --data FILE, else synthetic data from plan.json's runtime.data.
#pragma once

#include "Chunk.h"
#include "DataSource.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace pipec::rt {

class StageData {
public:
  // Checks that every field a chunk reads exists with the stage's dtype and
  // per-sample shape (the stage's shape without the micro-batch dimension);
  // throws Error.
  StageData(const Plan &plan, const std::string &dataFile, std::optional<TokenDtype> dataDtype, uint64_t seed,
            const std::vector<Chunk> &chunks);
  // The same over an opened source (the held-out set of --eval-data); a rank
  // whose chunks read no data keeps none.
  StageData(const Plan &plan, std::unique_ptr<io::DataSource> source, const std::vector<Chunk> &chunks);
  // The fields of `chunk` for micro-batch `mb` of iteration `it` (its
  // samples follow those of every earlier micro-batch), each at its offset
  // of the chunk's data layout in `dst` (host memory).
  void read(int chunk, int64_t it, int mb, char *dst);

private:
  void matchFields();

  const Plan &plan_;
  const std::vector<Chunk> &chunks_;
  std::unique_ptr<io::DataSource> source_;
  std::vector<std::vector<int>> fieldIndex_; // per chunk: data-source field of each desc.data
};

} // namespace pipec::rt
