// A job's initial weights (docs/weights-format.md): each stage's parameters
// and buffers from the model's initializers, in the stage ABI's dtypes.
#ifndef PIPEC_COMPILER_DRIVER_JOBWEIGHTS_H
#define PIPEC_COMPILER_DRIVER_JOBWEIGHTS_H

#include "compiler/Import/OnnxImporter.h"
#include "dialects/pipe/PipeDialect.h"

#include "mlir/Support/LLVM.h"

#include <filesystem>
#include <cstdint>
#include <vector>
#include <functional>
#include <string>

namespace pipec {

/// The stage ABI's dtype of an IR element type: its code and its name in
/// data-set specs (docs/dataset-format.md). The IR's tensors are f32, f64,
/// i64, i32 or i1 (the importer's training kinds).
struct AbiDtype {
  int code;
  const char *name;
};
AbiDtype abiDtype(mlir::Type element);

/// Writes `file`: every parameter and buffer the stage's functions read,
/// from `initial` (the model's initializers, read one at a time and written
/// as read: the writer holds one tensor, never the stage's weights), floats
/// rounded once to the IR's element type, integers exact.
/// `wrote`, if given, hears of each piece of data written (its bytes).
mlir::LogicalResult writeStageWeights(pipe::StageOp stage, import::InitializerReader &initial,
                                      const std::filesystem::path &file, llvm::raw_ostream &errs,
                                      const std::function<void(uint64_t)> &wrote = nullptr);
/// The parameters and buffers the stage's functions read, once each, in the
/// order its weights file holds them, and their bytes in that file.
std::vector<std::pair<std::string, mlir::RankedTensorType>> stageWeightTensors(pipe::StageOp stage);
uint64_t stageWeightBytes(pipe::StageOp stage);

} // namespace pipec

#endif // PIPEC_COMPILER_DRIVER_JOBWEIGHTS_H
