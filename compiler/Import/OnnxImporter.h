// Imports an ONNX model (binary .onnx or ONNX text format .onnxtext) into a
// module holding `func.func @forward` of `nn` ops on static shapes.
#ifndef PIPEC_COMPILER_IMPORT_ONNXIMPORTER_H
#define PIPEC_COMPILER_IMPORT_ONNXIMPORTER_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "compiler/Import/HostTensor.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace pipec::import {

/// How BatchNormalization layers train (`--batchnorm`, docs/importer.md).
enum class BatchNormStatistics {
  Batch,      ///< batch statistics, running ones updated (PyTorch's train())
  Running,    ///< the running statistics, not updated (PyTorch's eval(), frozen BN)
  AsExported, ///< as the file's form says (ONNX's own semantics of the node)
};

/// In an input shape, dimension 0 left to the micro-batch size
/// (`--input-shape name=b,d1,...`).
inline constexpr int64_t kMicrobatchDimension = -1;

struct ImportOptions {
  /// Static shapes for graph inputs (`--input-shape name=d0,d1,...`); they
  /// replace the model's symbolic or unknown dimensions. Dimension 0 may be
  /// kMicrobatchDimension: the micro-batch size's.
  std::map<std::string, std::vector<int64_t>> inputShapes;
  /// Regular expressions (each matching a whole initializer name) of
  /// parameters to keep constant (`--freeze REGEX`).
  std::vector<std::string> freeze;
  /// Every BatchNormalization trains this way, whatever form the file has.
  BatchNormStatistics batchNorm = BatchNormStatistics::Batch;
  /// The micro-batch size: the size of dimension 0 of every graph input
  /// whose dimension 0 the file leaves free (symbolic or unknown). An input
  /// that fixes it at another size, or an inputShapes entry that gives
  /// another, is an error.
  std::optional<int64_t> microbatchSize;
};

/// Whether every graph input of the model leaves its batch dimension
/// (dimension 0) free, in the file and in the inputShapes of `options`: the
/// micro-batch size is then the user's or the planner's to choose. Reads the
/// model (checked as importOnnxModel checks it); nullopt with `errors` set
/// on bad input.
std::optional<bool> batchDimensionIsFree(const std::string &path, const ImportOptions &options,
                                         std::vector<std::string> &errors);

/// Parses `name=d0,d1,...`; returns false and sets `error` when malformed.
bool parseInputShape(const std::string &text, ImportOptions &options, std::string &error);

/// Imports the model at `path`. On bad input, returns null and reports one
/// error paragraph per problem through `errors` (file, node, op type, reason).
/// Initializer data is not read beyond what folding needs (InitializerReader
/// reads the weights).
mlir::OwningOpRef<mlir::ModuleOp>
importOnnxModel(mlir::MLIRContext &context, const std::string &path, const ImportOptions &options,
                std::vector<std::string> &errors);

/// The values of every initializer of the model at `path` (external data
/// included, with the importer's checks): the initial weights for training
/// and for the reference evaluator. Returns false with `errors` set on bad input.
bool readInitializerValues(const std::string &path, std::map<std::string, HostTensor> &values,
                           std::vector<std::string> &errors);

namespace detail {
class OnnxImporter;
}

/// The initializers of the model at `path`, read one at a time in their
/// training kind (the checks of readInitializerValues): a job's weights are
/// written tensor by tensor, so the compiler holds one of them, never the
/// model's weights (docs/weights-format.md).
class InitializerReader {
public:
  /// Loads the model's graph (external data stays on disk); ok() is false
  /// and errors() says why on bad input.
  explicit InitializerReader(const std::string &path);
  ~InitializerReader();
  bool ok() const { return loaded; }
  /// Initializer `name`'s elements in order, in chunks of at most
  /// `chunkElements` (shape-less tensors in the training kind), each given
  /// to `consume`: a tensor is converted and written piece by piece, so
  /// that memory does not grow with the largest tensor either. False, with
  /// an error added to errors(), when the model has no such initializer or
  /// its data cannot be read.
  bool readChunks(const std::string &name, int64_t chunkElements,
                  const std::function<void(const HostTensor &)> &consume);
  /// One paragraph per problem (file, initializer, reason), as the importer's.
  const std::vector<std::string> &errors() const { return problems; }

private:
  std::unique_ptr<mlir::MLIRContext> context;
  ImportOptions options;
  std::vector<std::string> problems;
  std::unique_ptr<detail::OnnxImporter> importer;
  bool loaded = false;
};

/// The element kind of an MLIR element type the importer creates (nullopt
/// for any other type).
std::optional<ElementKind> elementKindOf(mlir::Type type);

/// Op types (default ONNX domain) the importer can translate, sorted.
std::vector<std::string> supportedOnnxOps();

} // namespace pipec::import

#endif // PIPEC_COMPILER_IMPORT_ONNXIMPORTER_H
