// Strict validation of an ONNX model before and after import (docs/security.md):
// what ONNX itself forbids but a hand-made or hostile model may still contain,
// and what pipec could otherwise accept silently with a changed meaning.
//
// Before conversion (`validateModel`):
//  - names: no NUL byte in any graph, node, value, initializer, input or
//    output name (they could not round-trip through C strings); other control
//    characters are accepted (generated code escapes every name) and are
//    shown escaped in messages;
//  - uniqueness: every value is defined once (graph inputs, initializers and
//    node outputs, a node's own outputs included); a graph input may share
//    its name with an initializer only when both agree on the type (ONNX's
//    "default value" form); graph outputs are listed once;
//  - attributes: each node's attributes exist in the ONNX operator schema at
//    the model's opset ("did you mean ...?" otherwise), appear once, carry the
//    schema's type and hold a value of that type;
//  - dimensions: declared dims are >= 0, or -1 / symbolic for "unknown"; no
//    graph input (with --input-shape applied), initializer or tensor
//    attribute has more than kMaxTensorBytes bytes or an element count that
//    overflows.
// After inference (`checkInferredModel`):
//  - every tensor of the imported function is within kMaxTensorBytes;
//  - declared graph output types and value_info agree with the types pipec
//    inferred (symbolic or unknown declared dims match anything).
//
// Every problem becomes one line "<file>: <what> (node 'name' (Op)): reason"
// appended to `errors`; the functions return false when they added any.
#ifndef PIPEC_COMPILER_IMPORT_MODELVALIDATION_H
#define PIPEC_COMPILER_IMPORT_MODELVALIDATION_H

#include "compiler/Import/HostTensor.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Value.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace onnx {
class ModelProto;
} // namespace onnx

namespace pipec::import {

/// The largest tensor (in bytes) pipec accepts anywhere in a model: 1 TiB,
/// far beyond any real activation or weight, well inside int64 arithmetic.
inline constexpr int64_t kMaxTensorBytes = int64_t(1) << 40;

/// Checks the parsed model before anything is translated. `opset` is the
/// model's default-domain opset; `inputShapes` the --input-shape overrides.
bool validateModel(const onnx::ModelProto &model, const std::string &path, int64_t opset,
                   const std::map<std::string, std::vector<int64_t>> &inputShapes,
                   std::vector<std::string> &errors);

/// Checks the imported function against the model's declarations: `values`
/// and `constants` map ONNX value names to what the importer made of them.
bool checkInferredModel(const onnx::ModelProto &model, const std::string &path,
                        mlir::ModuleOp module, const std::map<std::string, mlir::Value> &values,
                        const std::map<std::string, HostTensor> &constants,
                        std::vector<std::string> &errors);

/// A name as shown in messages: quoted, control characters and NUL escaped,
/// very long names shortened.
std::string displayName(const std::string &name);

} // namespace pipec::import

#endif // PIPEC_COMPILER_IMPORT_MODELVALIDATION_H
