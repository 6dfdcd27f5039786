// Re-specializes a static export to other input sizes (docs/importer.md,
// "Another batch or sequence length"): the batch and sequence dimensions
// are followed through the graph as polynomials in the sizes that change,
// and the constants that hold a traced size are rewritten at the new one.
#ifndef PIPEC_COMPILER_IMPORT_RESPECIALIZE_H
#define PIPEC_COMPILER_IMPORT_RESPECIALIZE_H

#include "compiler/Import/HostTensor.h"

#include <onnx/onnx_pb.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace pipec::import::detail {

/// What an import of the unchanged model at its traced sizes found: the
/// shape of every value it defined, and the values it knew at import.
struct TracedGraph {
  std::map<std::string, std::vector<int64_t>> shapes;
  std::map<std::string, HostTensor> constants;
  /// Reads an initializer or a Constant node's tensor (the importer's checks).
  std::function<HostTensor(const onnx::TensorProto &)> read;
};

/// Rewrites `model` so that its graph inputs have `newShapes` (by input name;
/// every graph input that is not an initializer): input types, the reshape
/// targets, slice bounds, ranges, expand shapes and the constants whose size
/// follows a changed dimension (extended when their values follow a pattern:
/// equal along the dimension, an arithmetic progression, or a band of a
/// triangular mask). Returns false with `problems` (each naming the node or
/// constant and the reason) when a traced size cannot be followed; `notes`
/// says what was rewritten.
bool respecializeModel(onnx::ModelProto &model,
                       const std::map<std::string, std::vector<int64_t>> &newShapes,
                       const TracedGraph &traced, std::vector<std::string> &problems,
                       std::vector<std::string> &notes);

} // namespace pipec::import::detail

#endif
