// Loading an ONNX model: the file (binary protobuf or ONNX text), the opset,
// and the data of initializers, external data included (docs/security.md);
// and the importer's error path.
#include "compiler/Import/ImporterImpl.h"
#include "pipec/input_file.h"

#include <onnx/defs/parser.h>

#include <cassert>
#include <cstring>

using namespace mlir;
namespace fs = std::filesystem;

namespace pipec::import::detail {
namespace {

// Models may declare any opset up to the newest one pipec knows; each node is
// then checked against the operator versions pipec translates (see
// the operator rows' versions in OnnxOps.cpp). 13 and newer are the exporters'
// usual choice. Opsets 21 to 24 changed the operators pipec translates only
// by adding element types (int4, float8, float4, bfloat16 in more ops),
// which the element-type checks refuse (docs/importer.md).
constexpr int64_t kMinOpset = 1;
constexpr int64_t kMaxOpset = 24;

int64_t byteWidth(ElementKind kind) {
  switch (kind) {
  case ElementKind::Float64: case ElementKind::Int64: return 8;
  case ElementKind::Float32: case ElementKind::Int32: return 4;
  case ElementKind::Float16: case ElementKind::BFloat16: return 2;
  default: return 1;
  }
}

float halfBitsToFloat(uint16_t bits, bool bfloat) {
  if (bfloat) {
    uint32_t word = static_cast<uint32_t>(bits) << 16;
    float value;
    std::memcpy(&value, &word, 4);
    return value;
  }
  llvm::APFloat value(llvm::APFloat::IEEEhalf(), llvm::APInt(16, bits));
  return value.convertToFloat();
}

} // namespace

std::optional<ElementKind> elementKindOf(int32_t onnxType) {
  using T = onnx::TensorProto_DataType;
  switch (onnxType) {
  case T::TensorProto_DataType_FLOAT: return ElementKind::Float32;
  case T::TensorProto_DataType_DOUBLE: return ElementKind::Float64;
  case T::TensorProto_DataType_FLOAT16: return ElementKind::Float16;
  case T::TensorProto_DataType_BFLOAT16: return ElementKind::BFloat16;
  case T::TensorProto_DataType_INT64: return ElementKind::Int64;
  case T::TensorProto_DataType_INT32: return ElementKind::Int32;
  case T::TensorProto_DataType_INT8: return ElementKind::Int8;
  case T::TensorProto_DataType_UINT8: return ElementKind::UInt8;
  case T::TensorProto_DataType_BOOL: return ElementKind::Bool;
  default: return std::nullopt;
  }
}

//===----------------------------------------------------------------------===//
// Errors
//===----------------------------------------------------------------------===//

std::string OnnxImporter::nodeLabel(const onnx::NodeProto &node) const {
  std::string name = node.name().empty()
                         ? "#" + std::to_string(currentNodeIndex) + " (unnamed)"
                         : "'" + node.name() + "'";
  return path + ": node " + name + " (" + node.op_type() + ")";
}

std::string OnnxImporter::nodeName(int index) const {
  const std::string &name = model.graph().node(index).name();
  return name.empty() ? "#" + std::to_string(index) : name;
}

void OnnxImporter::report(const std::string &problem) {
  errors.push_back(path + ": " + problem);
}

void OnnxImporter::abandon() { throw ImportAborted{}; }

void OnnxImporter::fail(const onnx::NodeProto &node, const std::string &reason) {
  // After a re-specialization the node sees the new sizes: say so.
  errors.push_back(nodeLabel(node) + ": " + reason +
                   (respecializedTo.empty() ? "" : " (at the sizes the export was re-specialized to: " + respecializedTo + ")"));
  abandon();
}

void OnnxImporter::failFile(const std::string &reason) {
  report(reason);
  abandon();
}

//===----------------------------------------------------------------------===//
// The model
//===----------------------------------------------------------------------===//

void OnnxImporter::loadModel() {
  std::error_code error;
  if (!fs::exists(path, error))
    failFile("no such file");
  if (fs::is_directory(path, error))
    failFile("is a directory, not an ONNX model");
  modelDirectory = fs::absolute(path).parent_path();
  bool text = llvm::StringRef(path).ends_with(".onnxtext");
  // A regular file of bounded size, opened without blocking: a FIFO, a device
  // such as /dev/zero or an oversized file is refused before anything is read.
  std::string bytes;
  try {
    bytes = pipec::io::readInputFile(path, text ? "ONNX text model" : "ONNX model",
                                     text ? pipec::io::kMaxTextFileBytes
                                          : pipec::io::kMaxModelFileBytes);
  } catch (const pipec::io::InputError &problem) {
    errors.push_back(problem.what()); // the message names the file
    abandon();
  }
  if (text) {
    onnx::OnnxParser parser(bytes.c_str());
    auto status = parser.Parse(model);
    if (!status.IsOK())
      failFile("is not valid ONNX text format: " + status.ErrorMessage());
  } else if (bytes.empty() || !model.ParseFromString(bytes)) {
    failFile(bytes.empty() ? "is empty, not an ONNX model"
                           : "is not a valid ONNX protobuf (truncated or corrupt file?)");
  }
  if (!model.has_graph() || model.graph().node_size() == 0)
    failFile("holds no graph (is it an ONNX model?)");
}

void OnnxImporter::checkOpsets() {
  bool found = false;
  for (const auto &entry : model.opset_import()) {
    if (!isDefaultDomain(entry.domain()))
      continue;
    found = true;
    opset = entry.version();
  }
  if (!found)
    failFile("imports no opset of the default ONNX domain");
  if (opset < kMinOpset || opset > kMaxOpset)
    failFile("uses opset " + std::to_string(opset) +
             " of the default ONNX domain, which pipec does not know; pipec supports "
             "opsets up to " + std::to_string(kMaxOpset) +
             " (re-export the model with an opset in that range)");
}

/// Decides, before translating anything, which initializers are trained
/// parameters, which are buffers (BatchNormalization statistics) and which
//===----------------------------------------------------------------------===//
// Initializer data
//===----------------------------------------------------------------------===//

std::string OnnxImporter::readExternalData(const onnx::TensorProto &tensor,
                                           const std::string &what, uint64_t expectedBytes,
                                           bool read,
                                           std::optional<std::pair<uint64_t, uint64_t>> window) {
  std::string location;
  std::optional<uint64_t> offset, length;
  for (const auto &entry : tensor.external_data()) {
    std::optional<uint64_t> *field = entry.key() == "offset" ? &offset
                                     : entry.key() == "length" ? &length
                                                               : nullptr;
    if (entry.key() == "location") {
      if (!location.empty())
        failFile(what + " names its external data location twice");
      location = entry.value();
    } else if (field) {
      // A non-negative decimal integer that fits int64 (ONNX stores it as text).
      const std::string &text = entry.value();
      bool digits = !text.empty() && text.size() <= 19 &&
                    llvm::all_of(text, [](char c) { return c >= '0' && c <= '9'; });
      unsigned long long value = digits ? std::strtoull(text.c_str(), nullptr, 10) : 0;
      if (!digits || value > static_cast<unsigned long long>(INT64_MAX))
        failFile(what + " has external data " + entry.key() + " '" + text +
                 "', which is not a non-negative 64-bit integer");
      if (*field)
        failFile(what + " gives its external data " + entry.key() + " twice");
      *field = value;
    }
  }
  if (location.empty())
    failFile(what + " is stored externally but names no location");
  fs::path relative(location);
  bool escapes = relative.is_absolute() ||
                 llvm::any_of(relative, [](const fs::path &part) { return part == ".."; });
  fs::path full = modelDirectory / relative;
  std::error_code error;
  if (!escapes && fs::exists(full, error)) {
    // Links must not lead out of the model's folder either.
    fs::path real = fs::canonical(full, error);
    fs::path root = fs::canonical(modelDirectory, error);
    auto mismatch = std::mismatch(root.begin(), root.end(), real.begin(), real.end());
    escapes = mismatch.first != root.end();
  }
  if (escapes)
    failFile(what + " refers to external data '" + location +
             "' outside the model's folder; only files in or below " +
             modelDirectory.string() + " are read");
  if (!fs::exists(full, error))
    failFile(what + " refers to external data file '" + location + "', which is missing");
  // A regular file only (a FIFO would block, a device never ends), opened
  // without blocking; offset and length checked without overflow.
  std::optional<pipec::io::InputFile> file;
  try {
    file.emplace(full.string(), "external data file", pipec::io::kMaxTensorFileBytes);
  } catch (const pipec::io::InputError &problem) {
    failFile(what + " refers to external data file '" + location + "': " + problem.what());
  }
  uint64_t size = file->size();
  uint64_t start = offset.value_or(0);
  auto describe = [&] {
    return what + " expects " + std::to_string(expectedBytes) + " bytes of external data at offset " +
           std::to_string(start) + " of '" + location + "' (" + std::to_string(size) + " bytes)";
  };
  if (start > size)
    failFile(describe() + ", but the offset lies past the end of the file");
  if (length && *length != expectedBytes)
    failFile(describe() + ", but its external data length is " + std::to_string(*length));
  // Without a length the data runs to the end of the file (as ONNX reads it).
  if (!length && size - start != expectedBytes)
    failFile(describe() + ", but it gives no length and the file holds " +
             std::to_string(size - start) + " bytes from that offset");
  if (!pipec::io::rangeWithin(start, expectedBytes, size))
    failFile(describe() + ", but the file ends " +
             std::to_string(expectedBytes - (size - start)) + " bytes short of that");
  if (!read)
    return {};
  const uint64_t from = window ? window->first : 0, count = window ? window->second : expectedBytes;
  assert(from <= expectedBytes && count <= expectedBytes - from && "a window inside the tensor's data");
  std::string bytes(static_cast<size_t>(count), '\0');
  try {
    file->readAt(start + from, bytes.data(), count, "external data");
  } catch (const pipec::io::InputError &problem) {
    failFile(what + ": " + problem.what());
  }
  return bytes;
}

std::optional<std::string> OnnxImporter::absentExternalData(const onnx::TensorProto &tensor) const {
  if (tensor.data_location() != onnx::TensorProto_DataLocation_EXTERNAL)
    return std::nullopt;
  for (const auto &entry : tensor.external_data()) {
    if (entry.key() != "location")
      continue;
    fs::path relative(entry.value());
    // A location outside the folder is refused by readExternalData, not probed.
    if (relative.empty() || relative.is_absolute() ||
        llvm::any_of(relative, [](const fs::path &part) { return part == ".."; }))
      return std::nullopt;
    std::error_code error;
    return fs::exists(modelDirectory / relative, error) ? std::nullopt
                                                          : std::optional<std::string>(entry.value());
  }
  return std::nullopt;
}

int64_t OnnxImporter::checkTensorData(const onnx::TensorProto &tensor, const std::string &what) {
  auto kind = elementKindOf(tensor.data_type());
  if (!kind)
    failFile(what + " has an unsupported element type (" + std::to_string(tensor.data_type()) +
             ")");
  std::vector<int64_t> dims(tensor.dims().begin(), tensor.dims().end());
  for (int64_t dim : dims)
    if (dim < 0)
      failFile(what + " has a negative dimension (shape [" + join(dims) + "])");
  auto count = pipec::io::checkedElementCount(dims);
  auto bytes = count ? pipec::io::checkedMul<int64_t>(*count, byteWidth(*kind)) : std::nullopt;
  if (!bytes)
    failFile(what + " has the shape [" + join(dims) + "], whose size overflows 64 bits");
  if (tensor.data_location() == onnx::TensorProto_DataLocation_EXTERNAL) {
    (void)readExternalData(tensor, what, static_cast<uint64_t>(*bytes), /*read=*/false);
    return *count;
  }
  if (tensor.has_raw_data()) {
    int64_t stored = static_cast<int64_t>(tensor.raw_data().size());
    if (stored != *bytes)
      failFile(what + " holds " + std::to_string(stored) + " bytes of data for " +
               std::to_string(*count) + " elements (" + std::to_string(*bytes) + " expected)");
    return *count;
  }
  // Typed fields: each element type has its own (float16 and the small
  // integers travel in int32_data).
  int64_t fields = 0;
  const char *field = "int32_data";
  switch (*kind) {
  case ElementKind::Float32: fields = tensor.float_data_size(); field = "float_data"; break;
  case ElementKind::Float64: fields = tensor.double_data_size(); field = "double_data"; break;
  case ElementKind::Int64: fields = tensor.int64_data_size(); field = "int64_data"; break;
  default: fields = tensor.int32_data_size(); break;
  }
  if (fields != *count)
    failFile(what + " holds " + std::to_string(fields) + " values in " + field + " for " +
             std::to_string(*count) + " elements of shape [" + join(dims) + "]");
  return *count;
}

HostTensor OnnxImporter::readTensor(const onnx::TensorProto &tensor, const std::string &what) {
  int64_t count = checkTensorData(tensor, what);
  ElementKind kind = *elementKindOf(tensor.data_type());
  std::string external;
  if (tensor.data_location() == onnx::TensorProto_DataLocation_EXTERNAL)
    external = readExternalData(tensor, what, static_cast<uint64_t>(count * byteWidth(kind)),
                                /*read=*/true);
  const char *raw = tensor.data_location() == onnx::TensorProto_DataLocation_EXTERNAL
                        ? external.data()
                        : tensor.raw_data().data();
  HostTensor out = decodeElements(tensor, kind, raw, 0, count);
  out.shape.assign(tensor.dims().begin(), tensor.dims().end());
  return out;
}

void OnnxImporter::readTensorChunks(const onnx::TensorProto &tensor, const std::string &what,
                                    int64_t chunkElements,
                                    const std::function<void(const HostTensor &)> &consume) {
  const int64_t count = checkTensorData(tensor, what);
  const ElementKind kind = *elementKindOf(tensor.data_type());
  const bool isExternal = tensor.data_location() == onnx::TensorProto_DataLocation_EXTERNAL;
  const uint64_t width = byteWidth(kind);
  for (int64_t begin = 0; begin < count; begin += chunkElements) {
    const int64_t n = std::min(chunkElements, count - begin);
    std::string window;
    if (isExternal)
      window = readExternalData(tensor, what, static_cast<uint64_t>(count) * width, /*read=*/true,
                                std::make_pair(static_cast<uint64_t>(begin) * width, static_cast<uint64_t>(n) * width));
    const char *raw = isExternal ? window.data() : tensor.raw_data().data() + begin * width;
    consume(decodeElements(tensor, kind, raw, begin, n));
  }
}

HostTensor OnnxImporter::decodeElements(const onnx::TensorProto &tensor, ElementKind kind,
                                        const char *raw, int64_t begin, int64_t count) {
  const bool fromBytes =
      tensor.has_raw_data() || tensor.data_location() == onnx::TensorProto_DataLocation_EXTERNAL;
  HostTensor out;
  out.kind = kind;
  out.shape = {count};
  if (isFloating(kind))
    out.floats.reserve(count);
  else
    out.ints.reserve(count);
  auto rawAt = [&](int64_t i, auto sample) {
    decltype(sample) value;
    std::memcpy(&value, raw + i * sizeof(value), sizeof(value));
    return value;
  };
  for (int64_t k = 0; k < count; ++k) {
    const int64_t i = begin + k; // the element's index in the typed fields
    switch (kind) {
    case ElementKind::Float32:
      out.floats.push_back(fromBytes ? rawAt(k, float()) : tensor.float_data(i));
      break;
    case ElementKind::Float64:
      out.floats.push_back(fromBytes ? rawAt(k, double()) : tensor.double_data(i));
      break;
    case ElementKind::Float16:
    case ElementKind::BFloat16: {
      uint16_t bits = fromBytes ? rawAt(k, uint16_t()) : tensor.int32_data(i);
      out.floats.push_back(halfBitsToFloat(bits, kind == ElementKind::BFloat16));
      break;
    }
    case ElementKind::Int64:
      out.ints.push_back(fromBytes ? rawAt(k, int64_t()) : tensor.int64_data(i));
      break;
    case ElementKind::Int32:
      out.ints.push_back(fromBytes ? rawAt(k, int32_t()) : tensor.int32_data(i));
      break;
    case ElementKind::Int8:
      out.ints.push_back(fromBytes ? rawAt(k, int8_t()) : tensor.int32_data(i));
      break;
    case ElementKind::UInt8:
    case ElementKind::Bool:
      out.ints.push_back(fromBytes ? rawAt(k, uint8_t()) : tensor.int32_data(i));
      break;
    }
  }
  return out;
}

} // namespace pipec::import::detail
