// What piperun and pipeseq are started with (docs/runtime.md): filled by the
// tools' one command-line parser (runtime/tools/CommandLine.h), read by the
// executor. pipeseq uses the options it shares with piperun.
#pragma once

#include "JobCheck.h"

#include <cstdint>
#include <optional>
#include <string>

namespace pipec::rt {

struct RunOptions {
  std::string planDir;
  int iters = 1;         // total iterations (optimizer steps of a synchronous schedule); resume continues to it
  int logEvery = 1;
  std::string dataFile;  // empty: synthetic data from runtime.data
  std::optional<TokenDtype> dataDtype; // set: dataFile is a token file of these ids (docs/dataset-format.md)
  // Validation (docs/runtime.md, "Validation"): forward-only passes over
  // held-out data, in the same format as --data (and --data-dtype).
  std::string evalDataFile; // empty: no validation
  int evalEvery = 0;        // every K iterations and at the end; 0: at the end only
  int evalIters = 0;        // rounds of m micro-batches per pass; 0: enough to cover the held-out set once
  std::string checkpointDir;
  int saveEvery = 0;
  std::string resumeDir;
  std::string traceFile, profileFile, exportDir;
  bool seedSet = false;
  uint64_t seed = 0;
  OptimizerOverrides optimizer; // --lr, --weight-decay, --momentum, --max-grad-norm; checked by resolveOptimizer
  double watchdogSeconds = -1; // > 0: fixed limit, 0: off, < 0: the default policy (Watchdog.h)
  bool allowNonFinite = false;  // --allow-nonfinite: a NaN/inf loss or gradient does not stop training
  bool noCudaGraphs = false;    // --no-cuda-graphs: stage calls issue their launches one by one (pipec_call.no_graphs)
  bool quiet = false;
};

} // namespace pipec::rt
