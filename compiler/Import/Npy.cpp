#include "compiler/Import/Npy.h"

#include <cstring>
#include <fstream>
#include <sstream>

namespace pipec::import {
namespace {
struct Descriptor {
  const char *code;
  ElementKind kind;
  int bytes;
};
const Descriptor kDescriptors[] = {
    {"<f4", ElementKind::Float32, 4}, {"<f8", ElementKind::Float64, 8},
    {"<i8", ElementKind::Int64, 8},   {"<i4", ElementKind::Int32, 4},
    {"|b1", ElementKind::Bool, 1},    {"|u1", ElementKind::UInt8, 1},
    {"|i1", ElementKind::Int8, 1},
};
} // namespace

std::optional<HostTensor> readNpy(const std::string &path, std::string &error) {
  std::ifstream stream(path, std::ios::binary);
  if (!stream) {
    error = path + ": cannot be opened";
    return std::nullopt;
  }
  char magic[8];
  if (!stream.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) {
    error = path + ": not a .npy file";
    return std::nullopt;
  }
  uint32_t headerLength = 0;
  if (magic[6] == 1) {
    uint16_t length;
    stream.read(reinterpret_cast<char *>(&length), 2);
    headerLength = length;
  } else {
    stream.read(reinterpret_cast<char *>(&headerLength), 4);
  }
  std::string header(headerLength, '\0');
  stream.read(header.data(), headerLength);
  if (header.find("'fortran_order': False") == std::string::npos) {
    error = path + ": only C-ordered arrays are supported";
    return std::nullopt;
  }
  const Descriptor *descriptor = nullptr;
  for (const Descriptor &candidate : kDescriptors)
    if (header.find(std::string("'descr': '") + candidate.code + "'") != std::string::npos)
      descriptor = &candidate;
  if (!descriptor) {
    error = path + ": unsupported element type in header " + header;
    return std::nullopt;
  }
  HostTensor tensor;
  tensor.kind = descriptor->kind;
  auto open = header.find("'shape': ("), close = header.find(')', open);
  std::stringstream dims(header.substr(open + 10, close - open - 10));
  std::string item;
  while (std::getline(dims, item, ','))
    if (item.find_first_not_of(' ') != std::string::npos)
      tensor.shape.push_back(std::stoll(item));
  int64_t count = tensor.numElements();
  std::string raw(count * descriptor->bytes, '\0');
  if (!stream.read(raw.data(), raw.size())) {
    error = path + ": truncated data";
    return std::nullopt;
  }
  for (int64_t i = 0; i < count; ++i) {
    const char *at = raw.data() + i * descriptor->bytes;
    switch (descriptor->kind) {
    case ElementKind::Float32: { float v; std::memcpy(&v, at, 4); tensor.floats.push_back(v); break; }
    case ElementKind::Float64: { double v; std::memcpy(&v, at, 8); tensor.floats.push_back(v); break; }
    case ElementKind::Int64: { int64_t v; std::memcpy(&v, at, 8); tensor.ints.push_back(v); break; }
    case ElementKind::Int32: { int32_t v; std::memcpy(&v, at, 4); tensor.ints.push_back(v); break; }
    case ElementKind::Int8: tensor.ints.push_back(static_cast<int8_t>(*at)); break;
    default: tensor.ints.push_back(static_cast<uint8_t>(*at)); break;
    }
  }
  return tensor;
}

bool writeNpy(const std::string &path, const HostTensor &tensor, std::string &error) {
  const Descriptor *descriptor = nullptr;
  for (const Descriptor &candidate : kDescriptors)
    if (candidate.kind == tensor.kind)
      descriptor = &candidate;
  if (!descriptor) {
    error = path + ": cannot write " + elementKindName(tensor.kind) + " arrays";
    return false;
  }
  std::string shape;
  for (int64_t dim : tensor.shape)
    shape += std::to_string(dim) + ", ";
  if (tensor.shape.size() > 1)
    shape.erase(shape.size() - 2);
  std::string header = std::string("{'descr': '") + descriptor->code +
                       "', 'fortran_order': False, 'shape': (" + shape + "), }";
  // Pad so that the data starts at a multiple of 64 bytes, newline-terminated.
  while ((10 + header.size() + 1) % 64)
    header += ' ';
  header += '\n';
  std::ofstream stream(path, std::ios::binary);
  if (!stream) {
    error = path + ": cannot be written";
    return false;
  }
  stream.write("\x93NUMPY\x01\x00", 8);
  uint16_t length = static_cast<uint16_t>(header.size());
  stream.write(reinterpret_cast<const char *>(&length), 2);
  stream << header;
  for (int64_t i = 0; i < tensor.numElements(); ++i) {
    switch (tensor.kind) {
    case ElementKind::Float32: { float v = static_cast<float>(tensor.floats[i]); stream.write(reinterpret_cast<char *>(&v), 4); break; }
    case ElementKind::Float64: stream.write(reinterpret_cast<const char *>(&tensor.floats[i]), 8); break;
    case ElementKind::Int64: stream.write(reinterpret_cast<const char *>(&tensor.ints[i]), 8); break;
    case ElementKind::Int32: { int32_t v = static_cast<int32_t>(tensor.ints[i]); stream.write(reinterpret_cast<char *>(&v), 4); break; }
    default: { char v = static_cast<char>(tensor.ints[i]); stream.write(&v, 1); break; }
    }
  }
  return static_cast<bool>(stream);
}

} // namespace pipec::import
