// Where a run's samples come from (docs/dataset-format.md).
#pragma once

#include "Plan.h"

#include "pipec/dataset.h"

#include <memory>
#include <optional>
#include <string>

namespace pipec::rt {

// The data source of a run: the --data file (a PIPECDS1 data set, an .npz
// archive or a folder of .npy arrays, or with --data-dtype a token file),
// else synthetic data from the plan; null when
// the plan has no data fields and no file is given. piperun and pipeseq
// both open their data here. Throws Error or io::FormatError naming the file.
// `countOnly`: the caller reads no sample, only the fields and their count
// (an .npz's compressed arrays are then not inflated, NumpyArrays.h).
std::unique_ptr<io::DataSource> openDataSource(const Plan &plan, const std::string &dataFile,
                                               std::optional<TokenDtype> dataDtype, uint64_t seed,
                                               bool countOnly = false);

// The held-out set of --eval-data (opened as --data is, --data-dtype
// included) and the rounds of m micro-batches a validation pass takes:
// --eval-iters, or enough to cover the set once (the last round wraps to
// its start). Without --eval-data, no source and 0 rounds; --eval-every or
// --eval-iters without it is an Error. Every rank opens it, so that all
// agree on the rounds; a rank that reads no data opens it `countOnly`.
struct Validation {
  std::unique_ptr<io::DataSource> source;
  int64_t rounds = 0;
};
Validation openValidation(const Plan &plan, const std::string &evalDataFile, int evalEvery, int evalIters,
                          std::optional<TokenDtype> dataDtype, uint64_t seed, bool countOnly = false);

} // namespace pipec::rt
