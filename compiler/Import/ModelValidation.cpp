// Strict model validation; see ModelValidation.h for what is checked and why.
#include "compiler/Import/ModelValidation.h"
#include "compiler/Import/HostTensor.h"
#include "compiler/Import/OnnxImporter.h"
#include "dialects/nn/NNDialect.h"
#include "runtime/include/pipec/input_file.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Location.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/ErrorHandling.h"

#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cctype>
#include <limits>
#include <optional>
#include <set>
#include <unordered_map>

namespace pipec::import {
namespace {

/// A hostile model can hold millions of broken names; report the first few.
constexpr size_t kMaxReported = 20;

class Reporter {
public:
  Reporter(const std::string &path, std::vector<std::string> &errors)
      : path(path), errors(errors) {}
  void add(const std::string &message) {
    if (count++ < kMaxReported)
      errors.push_back(path + ": " + message);
  }
  /// Ends the check; false when something was reported.
  bool finish() {
    if (count > kMaxReported)
      errors.push_back(path + ": ... and " + std::to_string(count - kMaxReported) +
                       " more problem(s) of this kind");
    return count == 0;
  }

private:
  const std::string &path;
  std::vector<std::string> &errors;
  size_t count = 0;
};

/// Control characters, NUL and backslashes escaped; no quotes.
std::string escaped(const std::string &text) {
  constexpr size_t kShown = 100;
  std::string out;
  for (size_t i = 0; i < text.size() && i < kShown; ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    switch (c) {
    case '\0': out += "\\0"; break;
    case '\n': out += "\\n"; break;
    case '\r': out += "\\r"; break;
    case '\t': out += "\\t"; break;
    case '\\': out += "\\\\"; break;
    default:
      if (c < 0x20 || c == 0x7f) {
        const char *hex = "0123456789abcdef";
        out += "\\x";
        out += hex[c >> 4];
        out += hex[c & 15];
      } else {
        out += static_cast<char>(c);
      }
    }
  }
  if (text.size() > kShown)
    out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

std::string nodeLabel(const onnx::NodeProto &node, int index) {
  std::string name = node.name().empty() ? "#" + std::to_string(index) + " (unnamed)"
                                         : displayName(node.name());
  std::string domain = node.domain().empty() || node.domain() == "ai.onnx"
                           ? ""
                           : escaped(node.domain()) + "::";
  return "node " + name + " (" + domain + escaped(node.op_type()) + ")";
}

bool isDefaultDomain(const std::string &domain) {
  return domain.empty() || domain == "ai.onnx";
}

//===----------------------------------------------------------------------===//
// Types and shapes as text
//===----------------------------------------------------------------------===//

std::string elementTypeName(int32_t onnxType) {
  if (onnxType == onnx::TensorProto_DataType_UNDEFINED)
    return "tensor";
  if (!onnx::TensorProto_DataType_IsValid(onnxType))
    return "type" + std::to_string(onnxType);
  std::string name = onnx::TensorProto_DataType_Name(
      static_cast<onnx::TensorProto_DataType>(onnxType));
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return name;
}

int64_t elementBytes(int32_t onnxType) {
  using T = onnx::TensorProto_DataType;
  switch (onnxType) {
  case T::TensorProto_DataType_DOUBLE: case T::TensorProto_DataType_INT64:
  case T::TensorProto_DataType_UINT64: case T::TensorProto_DataType_COMPLEX64:
    return 8;
  case T::TensorProto_DataType_COMPLEX128: return 16;
  case T::TensorProto_DataType_FLOAT: case T::TensorProto_DataType_INT32:
  case T::TensorProto_DataType_UINT32:
    return 4;
  case T::TensorProto_DataType_FLOAT16: case T::TensorProto_DataType_BFLOAT16:
  case T::TensorProto_DataType_INT16: case T::TensorProto_DataType_UINT16:
    return 2;
  default: return 1;
  }
}

int32_t onnxTypeOf(ElementKind kind) {
  using T = onnx::TensorProto_DataType;
  switch (kind) {
  case ElementKind::Float32: return T::TensorProto_DataType_FLOAT;
  case ElementKind::Float64: return T::TensorProto_DataType_DOUBLE;
  case ElementKind::Float16: return T::TensorProto_DataType_FLOAT16;
  case ElementKind::BFloat16: return T::TensorProto_DataType_BFLOAT16;
  case ElementKind::Int64: return T::TensorProto_DataType_INT64;
  case ElementKind::Int32: return T::TensorProto_DataType_INT32;
  case ElementKind::Int8: return T::TensorProto_DataType_INT8;
  case ElementKind::UInt8: return T::TensorProto_DataType_UINT8;
  case ElementKind::Bool: return T::TensorProto_DataType_BOOL;
  }
  llvm_unreachable("every ElementKind has its case in onnxTypeOf");
}

std::optional<int32_t> onnxTypeOf(mlir::Type type) {
  if (auto kind = elementKindOf(type))
    return onnxTypeOf(*kind);
  return std::nullopt;
}

/// A declared type in ONNX text syntax: float[2,batch,?].
std::string declaredTypeText(const onnx::TypeProto_Tensor &tensor) {
  std::string text = elementTypeName(tensor.elem_type());
  if (!tensor.has_shape())
    return text + "[any shape]";
  text += "[";
  for (int d = 0; d < tensor.shape().dim_size(); ++d) {
    const auto &dim = tensor.shape().dim(d);
    text += d ? "," : "";
    if (dim.has_dim_value() && dim.dim_value() >= 0)
      text += std::to_string(dim.dim_value());
    else if (dim.has_dim_param())
      text += escaped(dim.dim_param());
    else
      text += "?";
  }
  return text + "]";
}

/// A tensor's size in bytes, or nullopt when a dimension is negative or the
/// size overflows or exceeds kMaxTensorBytes.
template <typename Dims>
std::optional<int64_t> boundedBytes(const Dims &dims, int64_t elementSize) {
  auto count = io::checkedElementCount(dims, kMaxTensorBytes);
  if (!count)
    return std::nullopt;
  auto bytes = io::checkedMul<int64_t>(*count, elementSize);
  if (!bytes || *bytes > kMaxTensorBytes)
    return std::nullopt;
  return bytes;
}

std::string tooLarge() {
  return "more than " + std::to_string(kMaxTensorBytes) +
         " bytes (2^40, 1 TiB), pipec's limit for one tensor";
}

//===----------------------------------------------------------------------===//
// Before conversion
//===----------------------------------------------------------------------===//

using AttributeTypes = std::map<std::string, onnx::AttributeProto::AttributeType>;

/// The newest default-domain opset whose schemas the linked ONNX library
/// holds (17 for Debian's ONNX 1.12; pipec reads models up to opset 20).
int libraryOpsetLimit() {
  const auto &ranges = onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
  auto it = ranges.find(onnx::ONNX_DOMAIN);
  return it == ranges.end() ? 0 : it->second.second;
}

/// Attributes operators gained in opsets 18 to 20, which an older ONNX
/// library's schemas do not list (and Gelu, an operator new in opset 20).
struct NewerAttribute {
  const char *op;
  const char *name;
  onnx::AttributeProto::AttributeType type;
  int64_t since;
};
const NewerAttribute kNewerAttributes[] = {
    {"Split", "num_outputs", onnx::AttributeProto::INT, 18},
    {"ReduceMean", "noop_with_empty_axes", onnx::AttributeProto::INT, 18},
    {"ReduceMax", "noop_with_empty_axes", onnx::AttributeProto::INT, 18},
    {"ReduceMin", "noop_with_empty_axes", onnx::AttributeProto::INT, 18},
    {"ReduceProd", "noop_with_empty_axes", onnx::AttributeProto::INT, 18},
    {"ReduceL1", "noop_with_empty_axes", onnx::AttributeProto::INT, 18},
    {"ReduceL2", "noop_with_empty_axes", onnx::AttributeProto::INT, 18},
    {"ReduceLogSum", "noop_with_empty_axes", onnx::AttributeProto::INT, 18},
    {"ReduceLogSumExp", "noop_with_empty_axes", onnx::AttributeProto::INT, 18},
    {"ReduceSumSquare", "noop_with_empty_axes", onnx::AttributeProto::INT, 18},
    {"Resize", "antialias", onnx::AttributeProto::INT, 18},
    {"Resize", "axes", onnx::AttributeProto::INTS, 18},
    {"Resize", "keep_aspect_ratio_policy", onnx::AttributeProto::STRING, 18},
    {"LpPool", "ceil_mode", onnx::AttributeProto::INT, 18},
    {"Cast", "saturate", onnx::AttributeProto::INT, 19},
    {"CastLike", "saturate", onnx::AttributeProto::INT, 19},
    {"QuantizeLinear", "saturate", onnx::AttributeProto::INT, 19},
    {"AveragePool", "dilations", onnx::AttributeProto::INTS, 19},
    {"Gelu", "approximate", onnx::AttributeProto::STRING, 20},
};

class Validator {
public:
  Validator(const onnx::ModelProto &model, const std::string &path, int64_t opset,
            const std::map<std::string, std::vector<int64_t>> &inputShapes,
            std::vector<std::string> &errors)
      : graph(model.graph()), opset(opset), libraryOpset(libraryOpsetLimit()),
        inputShapes(inputShapes), report(path, errors) {}

  bool run() {
    checkNames();
    checkDefinitions();
    checkAttributes();
    checkDimensions();
    return report.finish();
  }

private:
  void noNul(const std::string &name, const std::string &what) {
    if (name.find('\0') != std::string::npos)
      report.add(what + " " + displayName(name) +
                 " contains a NUL byte; names must not (they are kept as C strings)");
  }

  void checkNames() {
    noNul(graph.name(), "the graph name");
    for (int i = 0; i < graph.initializer_size(); ++i)
      noNul(graph.initializer(i).name(), "initializer");
    for (const auto &input : graph.input())
      noNul(input.name(), "graph input");
    for (const auto &output : graph.output())
      noNul(output.name(), "graph output");
    for (const auto &info : graph.value_info())
      noNul(info.name(), "value_info entry");
    for (int i = 0; i < graph.node_size(); ++i) {
      const auto &node = graph.node(i);
      std::string label = nodeLabel(node, i);
      noNul(node.name(), "node name");
      noNul(node.op_type(), label + ": op type");
      noNul(node.domain(), label + ": domain");
      for (int j = 0; j < node.input_size(); ++j)
        noNul(node.input(j), label + ": input " + std::to_string(j));
      for (int j = 0; j < node.output_size(); ++j)
        noNul(node.output(j), label + ": output " + std::to_string(j));
      for (const auto &attribute : node.attribute())
        noNul(attribute.name(), label + ": attribute");
    }
  }

  /// Whether a graph input that shares an initializer's name declares the
  /// same type (then the initializer is its default value, as ONNX allows).
  std::optional<std::string> clash(const onnx::ValueInfoProto &input,
                                   const onnx::TensorProto &tensor) {
    if (!input.type().has_tensor_type())
      return "is not a tensor";
    const auto &declared = input.type().tensor_type();
    bool same = declared.elem_type() == 0 || declared.elem_type() == tensor.data_type();
    if (declared.has_shape()) {
      same &= declared.shape().dim_size() == tensor.dims_size();
      for (int d = 0; same && d < declared.shape().dim_size(); ++d) {
        const auto &dim = declared.shape().dim(d);
        same &= !(dim.has_dim_value() && dim.dim_value() >= 0 &&
                  dim.dim_value() != tensor.dims(d));
      }
    }
    if (same)
      return std::nullopt;
    return "declares " + declaredTypeText(declared) + " but the initializer is " +
           elementTypeName(tensor.data_type()) + shapeText(tensor.dims());
  }

  void checkDefinitions() {
    std::unordered_map<std::string, std::string> definedBy;
    std::unordered_map<std::string, int> initializerIndex;
    for (int i = 0; i < graph.initializer_size(); ++i) {
      const std::string &name = graph.initializer(i).name();
      if (name.empty()) {
        report.add("initializer #" + std::to_string(i) + " has an empty name");
        continue;
      }
      auto [it, fresh] = initializerIndex.emplace(name, i);
      if (!fresh)
        report.add("initializer " + displayName(name) + " is defined twice (initializers #" +
                   std::to_string(it->second) + " and #" + std::to_string(i) + ")");
      definedBy.emplace(name, "initializer #" + std::to_string(it->second));
    }
    std::set<std::string> inputs;
    for (int i = 0; i < graph.input_size(); ++i) {
      const auto &input = graph.input(i);
      if (input.name().empty()) {
        report.add("graph input #" + std::to_string(i) + " has an empty name");
        continue;
      }
      if (!inputs.insert(input.name()).second) {
        report.add("graph input " + displayName(input.name()) + " is listed twice");
        continue;
      }
      if (auto it = initializerIndex.find(input.name()); it != initializerIndex.end()) {
        if (auto problem = clash(input, graph.initializer(it->second)))
          report.add("graph input " + displayName(input.name()) +
                     " shares its name with an initializer but " + *problem);
        continue;
      }
      definedBy.emplace(input.name(), "graph input #" + std::to_string(i));
    }
    for (int i = 0; i < graph.node_size(); ++i) {
      const auto &node = graph.node(i);
      for (int j = 0; j < node.output_size(); ++j) {
        const std::string &name = node.output(j);
        if (name.empty())
          continue;
        std::string here = nodeLabel(node, i);
        auto [it, fresh] = definedBy.emplace(name, here + " (output " + std::to_string(j) + ")");
        if (!fresh)
          report.add(here + ": output " + std::to_string(j) + " " + displayName(name) +
                     " is already defined by " + it->second +
                     "; every value must have one definition");
      }
    }
    std::set<std::string> outputs;
    for (int i = 0; i < graph.output_size(); ++i) {
      const std::string &name = graph.output(i).name();
      if (name.empty())
        report.add("graph output #" + std::to_string(i) + " has an empty name");
      else if (!outputs.insert(name).second)
        report.add("graph output " + displayName(name) + " is listed twice");
    }
  }

  static onnx::AttributeProto::AttributeType typeOf(const onnx::AttributeProto &a) {
    using A = onnx::AttributeProto;
    if (a.type() != A::UNDEFINED) return a.type();
    // IR version 1 models may leave the type out; it follows from the field.
    if (a.has_f()) return A::FLOAT;
    if (a.has_i()) return A::INT;
    if (a.has_s()) return A::STRING;
    if (a.has_t()) return A::TENSOR;
    if (a.has_g()) return A::GRAPH;
    if (a.has_sparse_tensor()) return A::SPARSE_TENSOR;
    if (a.has_tp()) return A::TYPE_PROTO;
    if (a.floats_size()) return A::FLOATS;
    if (a.ints_size()) return A::INTS;
    if (a.strings_size()) return A::STRINGS;
    if (a.tensors_size()) return A::TENSORS;
    if (a.graphs_size()) return A::GRAPHS;
    if (a.sparse_tensors_size()) return A::SPARSE_TENSORS;
    if (a.type_protos_size()) return A::TYPE_PROTOS;
    return A::UNDEFINED;
  }

  static bool holdsValue(const onnx::AttributeProto &a, onnx::AttributeProto::AttributeType type) {
    using A = onnx::AttributeProto;
    switch (type) {
    case A::FLOAT: return a.has_f();
    case A::INT: return a.has_i();
    case A::STRING: return a.has_s();
    case A::TENSOR: return a.has_t();
    case A::GRAPH: return a.has_g();
    case A::SPARSE_TENSOR: return a.has_sparse_tensor();
    case A::TYPE_PROTO: return a.has_tp();
    default: return true; // lists may be empty
    }
  }

  static std::string typeName(onnx::AttributeProto::AttributeType type) {
    return onnx::AttributeProto_AttributeType_Name(type);
  }

  /// The schema attribute closest to a misspelt name, if any is close.
  static std::optional<std::string> closest(const std::string &name, const AttributeTypes &known) {
    std::optional<std::string> best;
    unsigned bestDistance = 0;
    for (const auto &[candidate, unused] : known) {
      (void)unused;
      if (llvm::StringRef(candidate).equals_insensitive(name))
        return candidate;
      unsigned distance = llvm::StringRef(name).edit_distance(candidate, true, 8);
      unsigned allowed = std::max<unsigned>(2, candidate.size() / 3);
      if (distance <= allowed && (!best || distance < bestDistance)) {
        best = candidate;
        bestDistance = distance;
      }
    }
    return best;
  }

  void checkTensorAttribute(const std::string &where, const onnx::TensorProto &tensor) {
    for (int64_t d : tensor.dims())
      if (d < 0) {
        report.add(where + " has a negative dimension in " + shapeText(tensor.dims()));
        return;
      }
    if (!boundedBytes(tensor.dims(), elementBytes(tensor.data_type())))
      report.add(where + " of shape " + shapeText(tensor.dims()) + " has " + tooLarge());
  }

  /// Input and output counts outside the schema's range (a Split without
  /// outputs, a Gemm with one input) are refused before any translation sees them.
  void checkArity(const std::string &label, const std::string &op, const char *what, int count,
                  int minimum, int maximum) {
    if (count >= minimum && count <= maximum)
      return;
    std::string range = maximum == std::numeric_limits<int>::max()
                            ? std::to_string(minimum) + " or more"
                        : minimum == maximum ? std::to_string(minimum)
                                             : std::to_string(minimum) + " to " + std::to_string(maximum);
    report.add(label + ": " + op + " takes " + range + " " + what + "s, but the node has " +
               std::to_string(count));
  }

  void checkAttributes() {
    for (int i = 0; i < graph.node_size(); ++i) {
      const auto &node = graph.node(i);
      if (!isDefaultDomain(node.domain()))
        continue; // other domains are reported as unsupported by the importer
      const onnx::OpSchema *schema =
          onnx::OpSchemaRegistry::Schema(node.op_type(), static_cast<int>(opset), "");
      AttributeTypes known;
      if (schema)
        for (const auto &[name, attribute] : schema->attributes())
          known.emplace(name, attribute.type);
      bool newer = false; // attributes from opsets newer than the library's
      for (const auto &extra : kNewerAttributes)
        if (node.op_type() == extra.op && extra.since <= opset) {
          known.emplace(extra.name, extra.type);
          newer = true;
        }
      if (!schema && !newer)
        continue; // unknown operator: reported by the importer
      // Beyond the library's newest opset a schema may lack attributes
      // added since; an unknown name is then refused only when it is a
      // likely misspelling of a known one.
      bool beyondLibrary = opset > libraryOpset;
      std::string label = nodeLabel(node, i);
      std::string op = escaped(node.op_type()) +
                       (beyondLibrary || !schema
                            ? " (opset " + std::to_string(opset) + ")"
                            : " (version " + std::to_string(schema->SinceVersion()) + ")");
      if (schema && !beyondLibrary) {
        checkArity(label, op, "input", node.input_size(), schema->min_input(), schema->max_input());
        checkArity(label, op, "output", node.output_size(), schema->min_output(), schema->max_output());
      }
      std::set<std::string> seen;
      for (const auto &attribute : node.attribute()) {
        std::string name = displayName(attribute.name());
        if (!seen.insert(attribute.name()).second) {
          report.add(label + ": attribute " + name + " is given twice");
          continue;
        }
        auto it = known.find(attribute.name());
        if (it == known.end()) {
          std::string hint;
          auto suggestion = closest(attribute.name(), known);
          if (beyondLibrary && !suggestion)
            continue;
          if (suggestion) {
            hint = "; did you mean '" + *suggestion + "'?";
          } else if (known.empty()) {
            hint = "; " + op + " takes no attributes";
          } else {
            hint = "; " + op + " takes:";
            for (const auto &[candidate, unused] : known)
              hint += " " + candidate;
          }
          report.add(label + ": unknown attribute " + name + " for " + op + hint);
          continue;
        }
        if (attribute.has_ref_attr_name()) {
          report.add(label + ": attribute " + name + " refers to a function attribute (" +
                     displayName(attribute.ref_attr_name()) +
                     "), which only function bodies may do");
          continue;
        }
        auto type = typeOf(attribute);
        if (type == onnx::AttributeProto::UNDEFINED) {
          report.add(label + ": attribute " + name + " has no type and no value");
          continue;
        }
        auto expected = it->second;
        if (expected != onnx::AttributeProto::UNDEFINED && type != expected) {
          report.add(label + ": attribute " + name + " is " + typeName(type) + " but " + op +
                     " expects " + typeName(expected));
          continue;
        }
        if (!holdsValue(attribute, type)) {
          report.add(label + ": attribute " + name + " is declared " + typeName(type) +
                     " but holds no value");
          continue;
        }
        if (attribute.has_t())
          checkTensorAttribute(label + ": tensor attribute " + name, attribute.t());
        for (const auto &tensor : attribute.tensors())
          checkTensorAttribute(label + ": tensor attribute " + name, tensor);
      }
    }
  }

  void checkDeclaredDims(const onnx::ValueInfoProto &info, const std::string &what) {
    if (!info.type().has_tensor_type() || !info.type().tensor_type().has_shape())
      return;
    const auto &dims = info.type().tensor_type().shape().dim();
    for (int d = 0; d < dims.size(); ++d)
      if (dims[d].has_dim_value() && dims[d].dim_value() < -1)
        report.add(what + " " + displayName(info.name()) + " declares dimension " +
                   std::to_string(d) + " as " + std::to_string(dims[d].dim_value()) +
                   "; dimensions are >= 0, or -1 or a name when unknown");
  }

  void checkDimensions() {
    std::set<std::string> initializerNames;
    for (const auto &tensor : graph.initializer()) {
      initializerNames.insert(tensor.name());
      std::string what = "initializer " + displayName(tensor.name());
      if (llvm::any_of(tensor.dims(), [](int64_t d) { return d < 0; }))
        report.add(what + " has a negative dimension in " + shapeText(tensor.dims()));
      else if (!boundedBytes(tensor.dims(), elementBytes(tensor.data_type())))
        report.add(what + " of shape " + shapeText(tensor.dims()) + " has " + tooLarge());
    }
    for (const auto &input : graph.input()) {
      checkDeclaredDims(input, "graph input");
      if (initializerNames.count(input.name()) || !input.type().has_tensor_type())
        continue;
      const auto &tensor = input.type().tensor_type();
      std::vector<int64_t> shape;
      if (auto given = inputShapes.find(input.name()); given != inputShapes.end())
        shape = given->second;
      else if (tensor.has_shape())
        for (const auto &dim : tensor.shape().dim())
          if (dim.has_dim_value() && dim.dim_value() >= 0)
            shape.push_back(dim.dim_value()); // unknown dims are asked for later
      if (!boundedBytes(shape, elementBytes(tensor.elem_type())))
        report.add("graph input " + displayName(input.name()) + " of shape " + shapeText(shape) +
                   " (" + elementTypeName(tensor.elem_type()) + ") has " + tooLarge());
    }
    for (const auto &output : graph.output())
      checkDeclaredDims(output, "graph output");
    for (const auto &info : graph.value_info())
      checkDeclaredDims(info, "value_info entry");
  }

  const onnx::GraphProto &graph;
  int64_t opset;
  int64_t libraryOpset;
  const std::map<std::string, std::vector<int64_t>> &inputShapes;
  Reporter report;
};

//===----------------------------------------------------------------------===//
// After inference
//===----------------------------------------------------------------------===//

struct Inferred {
  int32_t elementType;
  std::vector<int64_t> shape;
};

std::string inferredText(const Inferred &type) {
  return elementTypeName(type.elementType) + shapeText(type.shape);
}

bool matches(const onnx::TypeProto_Tensor &declared, const Inferred &inferred) {
  // A float16, bfloat16 or float64 value is computed in float32 (trainingKind).
  auto computed = [](int32_t type) {
    using T = onnx::TensorProto_DataType;
    return type == T::TensorProto_DataType_FLOAT16 || type == T::TensorProto_DataType_BFLOAT16 ||
                   type == T::TensorProto_DataType_DOUBLE
               ? static_cast<int32_t>(T::TensorProto_DataType_FLOAT)
               : type;
  };
  if (declared.elem_type() != 0 && computed(declared.elem_type()) != computed(inferred.elementType))
    return false;
  if (!declared.has_shape())
    return true;
  if (declared.shape().dim_size() != static_cast<int>(inferred.shape.size()))
    return false;
  for (int d = 0; d < declared.shape().dim_size(); ++d) {
    const auto &dim = declared.shape().dim(d);
    if (dim.has_dim_value() && dim.dim_value() >= 0 && dim.dim_value() != inferred.shape[d])
      return false;
  }
  return true;
}

} // namespace

std::string displayName(const std::string &name) { return "'" + escaped(name) + "'"; }

bool validateModel(const onnx::ModelProto &model, const std::string &path, int64_t opset,
                   const std::map<std::string, std::vector<int64_t>> &inputShapes,
                   std::vector<std::string> &errors) {
  return Validator(model, path, opset, inputShapes, errors).run();
}

bool checkInferredModel(const onnx::ModelProto &model, const std::string &path,
                        mlir::ModuleOp module, const std::map<std::string, mlir::Value> &values,
                        const std::map<std::string, HostTensor> &constants,
                        std::vector<std::string> &errors) {
  const onnx::GraphProto &graph = model.graph();
  Reporter report(path, errors);

  // Where a value comes from, for messages: the node of the op's location
  // (the importer locates each op at its node: name, then file:node+1).
  auto describe = [&](mlir::Location loc) -> std::string {
    std::string name;
    if (auto named = llvm::dyn_cast<mlir::NameLoc>(loc)) {
      name = named.getName().str();
      if (auto file = llvm::dyn_cast<mlir::FileLineColLoc>(named.getChildLoc())) {
        int64_t index = static_cast<int64_t>(file.getLine()) - 1;
        if (index >= 0 && index < graph.node_size())
          return nodeLabel(graph.node(static_cast<int>(index)), static_cast<int>(index));
      }
      return "value " + displayName(name);
    }
    return "the graph";
  };

  // Every tensor within the size limit; the first one over it is reported
  // (everything computed from it is over it too).
  bool oversized = false;
  auto checkSize = [&](mlir::Value value, const std::string &where) {
    auto type = llvm::dyn_cast<mlir::RankedTensorType>(value.getType());
    if (oversized || !type || !type.getElementType().isIntOrFloat())
      return;
    int64_t width = std::max<int64_t>(1, (type.getElementType().getIntOrFloatBitWidth() + 7) / 8);
    if (llvm::any_of(type.getShape(), [](int64_t d) { return d < 0; }))
      return; // dynamic: not produced by the importer
    if (!boundedBytes(type.getShape(), width)) {
      oversized = true;
      auto onnxType = onnxTypeOf(type.getElementType());
      report.add(where + ": tensor " + (onnxType ? elementTypeName(*onnxType) : "") +
                 shapeText(type.getShape()) + " has " + tooLarge());
    }
  };
  module.walk([&](mlir::func::FuncOp function) {
    for (auto argument : function.getArguments()) {
      auto name = function.getArgAttrOfType<mlir::StringAttr>(argument.getArgNumber(), nn::kNameAttrName);
      checkSize(argument, name ? "argument " + displayName(name.str()) : "an argument");
    }
    function.walk([&](mlir::Operation *op) {
      for (mlir::Value result : op->getResults())
        checkSize(result, describe(op->getLoc()));
    });
  });

  // Declared types against what the importer inferred.
  auto inferredOf = [&](const std::string &name) -> std::optional<Inferred> {
    if (auto it = values.find(name); it != values.end()) {
      auto type = llvm::dyn_cast<mlir::RankedTensorType>(it->second.getType());
      auto element = type ? onnxTypeOf(type.getElementType()) : std::nullopt;
      if (!element)
        return std::nullopt;
      return Inferred{*element, std::vector<int64_t>(type.getShape().begin(), type.getShape().end())};
    }
    if (auto it = constants.find(name); it != constants.end())
      return Inferred{onnxTypeOf(it->second.kind), it->second.shape};
    return std::nullopt;
  };
  std::unordered_map<std::string, int> producer;
  auto producedBy = [&](const std::string &name) -> std::string {
    if (producer.empty())
      for (int i = 0; i < graph.node_size(); ++i)
        for (const auto &output : graph.node(i).output())
          producer.emplace(output, i);
    auto it = producer.find(name);
    if (it == producer.end())
      return "";
    return " (from " + nodeLabel(graph.node(it->second), it->second) + ")";
  };
  auto compare = [&](const onnx::ValueInfoProto &info, const std::string &what) {
    if (!info.type().has_tensor_type())
      return;
    auto inferred = inferredOf(info.name());
    if (!inferred || matches(info.type().tensor_type(), *inferred))
      return;
    report.add(what + " " + displayName(info.name()) + producedBy(info.name()) +
               " is declared as " + declaredTypeText(info.type().tensor_type()) +
               " but pipec infers " + inferredText(*inferred));
  };
  for (const auto &output : graph.output())
    compare(output, "graph output");
  for (const auto &info : graph.value_info())
    compare(info, "value");
  return report.finish();
}

} // namespace pipec::import
