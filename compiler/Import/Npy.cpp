#include "compiler/Import/Npy.h"
#include "pipec/input_file.h"
#include "pipec/npy.h"

#include <cassert>
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
  // A regular file of known size (a FIFO or device is refused without
  // blocking); every length in the header is checked against that size
  // before anything is allocated.
  try {
    pipec::io::InputFile file(path, ".npy file", pipec::io::kMaxTensorFileBytes);
    const pipec::io::NpyHeader header = pipec::io::readNpyHeader(
        path, file.size(), [&](uint64_t offset, void *dst, uint64_t n) { file.readAt(offset, dst, n, ".npy header"); });
    const Descriptor *descriptor = nullptr;
    for (const Descriptor &candidate : kDescriptors)
      if (header.descr == candidate.code)
        descriptor = &candidate;
    if (!descriptor) {
      error = path + ": unsupported element type '" + header.descr + "'";
      return std::nullopt;
    }
    HostTensor tensor;
    tensor.kind = descriptor->kind;
    tensor.shape = header.shape;
    const int64_t count = static_cast<int64_t>(header.dataBytes / header.itemBytes);
    std::string raw(static_cast<size_t>(header.dataBytes), '\0');
    file.readAt(header.dataOffset, raw.data(), raw.size(), "data");
    if (isFloating(descriptor->kind))
      tensor.floats.reserve(count);
    else
      tensor.ints.reserve(count);
    for (int64_t i = 0; i < count; ++i) {
      const char *at = raw.data() + i * descriptor->bytes;
      switch (descriptor->kind) {
      case ElementKind::Float32: { float v; std::memcpy(&v, at, 4); tensor.floats.push_back(v); break; }
      case ElementKind::Float64: { double v; std::memcpy(&v, at, 8); tensor.floats.push_back(v); break; }
      case ElementKind::Int64: { int64_t v; std::memcpy(&v, at, 8); tensor.ints.push_back(v); break; }
      case ElementKind::Int32: { int32_t v; std::memcpy(&v, at, 4); tensor.ints.push_back(v); break; }
      case ElementKind::Int8: tensor.ints.push_back(static_cast<int8_t>(*at)); break;
      case ElementKind::Bool: tensor.ints.push_back(*at != 0); break;
      case ElementKind::UInt8: tensor.ints.push_back(static_cast<uint8_t>(*at)); break;
      default: assert(false && "kDescriptors names no other element kind"); break;
      }
    }
    return tensor;
  } catch (const pipec::io::InputError &problem) {
    error = problem.what();
    return std::nullopt;
  }
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
    default: {
      // One byte: Int8, UInt8 and Bool, the other kinds of kDescriptors.
      assert(descriptor->bytes == 1 && "kDescriptors names no other element kind");
      char v = static_cast<char>(tensor.ints[i]);
      stream.write(&v, 1);
      break;
    }
    }
  }
  return static_cast<bool>(stream);
}

} // namespace pipec::import
