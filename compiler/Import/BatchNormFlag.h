// The --batchnorm flag of every tool that imports a model (pipec,
// pipec-reference): its choices are spelled here once.
#ifndef PIPEC_COMPILER_IMPORT_BATCHNORMFLAG_H
#define PIPEC_COMPILER_IMPORT_BATCHNORMFLAG_H

#include "compiler/Import/OnnxImporter.h"

#include "llvm/Support/CommandLine.h"

namespace pipec::import {

inline constexpr const char *kBatchNormFlagHelp =
    "How BatchNormalization layers train, whatever form the file has";

inline llvm::cl::ValuesClass batchNormFlagValues() {
  return llvm::cl::values(
      clEnumValN(BatchNormStatistics::Batch, "batch-stats",
                 "batch statistics, running ones updated (PyTorch's train(); default)"),
      clEnumValN(BatchNormStatistics::Running, "running-stats",
                 "the running statistics, not updated (PyTorch's eval())"),
      clEnumValN(BatchNormStatistics::AsExported, "as-exported",
                 "as the file's form says (ONNX's semantics of the node)"));
}

} // namespace pipec::import

#endif // PIPEC_COMPILER_IMPORT_BATCHNORMFLAG_H
