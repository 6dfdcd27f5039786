#include "compiler/Import/Npy.h"
#include "pipec/input_file.h"

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
    const uint64_t size = file.size();
    unsigned char magic[8];
    if (size < 10 || (file.readAt(0, magic, 8, "magic"), std::memcmp(magic, "\x93NUMPY", 6) != 0)) {
      error = path + ": not a .npy file";
      return std::nullopt;
    }
    uint64_t headerLength = 0, headerStart = 0;
    if (magic[6] == 1) {
      unsigned char length[2];
      file.readAt(8, length, 2, "header length");
      headerLength = length[0] | (uint64_t(length[1]) << 8);
      headerStart = 10;
    } else if (magic[6] == 2 || magic[6] == 3) {
      unsigned char length[4];
      file.readAt(8, length, 4, "header length");
      headerLength = length[0] | (uint64_t(length[1]) << 8) | (uint64_t(length[2]) << 16) |
                     (uint64_t(length[3]) << 24);
      headerStart = 12;
    } else {
      error = path + ": unsupported .npy format version " + std::to_string(magic[6]);
      return std::nullopt;
    }
    constexpr uint64_t kMaxHeaderBytes = 1 << 20;
    if (headerLength > kMaxHeaderBytes || !pipec::io::rangeWithin(headerStart, headerLength, size)) {
      error = path + ": .npy header length " + std::to_string(headerLength) +
              " runs past the end of the file (" + std::to_string(size) + " bytes)";
      return std::nullopt;
    }
    std::string header(headerLength, '\0');
    file.readAt(headerStart, header.data(), headerLength, "header");
    if (header.find("'fortran_order': False") == std::string::npos) {
      error = path + ": only C-ordered arrays are supported";
      return std::nullopt;
    }
    const Descriptor *descriptor = nullptr;
    for (const Descriptor &candidate : kDescriptors)
      if (header.find(std::string("'descr': '") + candidate.code + "'") != std::string::npos)
        descriptor = &candidate;
    if (!descriptor) {
      error = path + ": unsupported element type in header " + header.substr(0, 200);
      return std::nullopt;
    }
    HostTensor tensor;
    tensor.kind = descriptor->kind;
    auto open = header.find("'shape': ("), close = header.find(')', open);
    if (open == std::string::npos || close == std::string::npos) {
      error = path + ": the .npy header has no shape";
      return std::nullopt;
    }
    std::stringstream dims(header.substr(open + 10, close - open - 10));
    std::string item;
    while (std::getline(dims, item, ',')) {
      auto first = item.find_first_not_of(' '), last = item.find_last_not_of(' ');
      if (first == std::string::npos)
        continue;
      item = item.substr(first, last - first + 1);
      bool digits = item.size() <= 19 &&
                    item.find_first_not_of("0123456789") == std::string::npos;
      unsigned long long value = digits ? std::strtoull(item.c_str(), nullptr, 10) : 0;
      if (!digits || value > static_cast<unsigned long long>(INT64_MAX)) {
        error = path + ": .npy shape entry '" + item.substr(0, 40) + "' is not a dimension";
        return std::nullopt;
      }
      tensor.shape.push_back(static_cast<int64_t>(value));
    }
    auto count = pipec::io::checkedElementCount(tensor.shape);
    auto bytes = count ? pipec::io::checkedMul<int64_t>(*count, descriptor->bytes) : std::nullopt;
    const uint64_t dataStart = headerStart + headerLength;
    if (!bytes || static_cast<uint64_t>(*bytes) != size - dataStart) {
      error = path + ": the .npy header's shape and type need " +
              (bytes ? std::to_string(*bytes) : std::string("more than 2^63")) +
              " bytes of data but the file holds " + std::to_string(size - dataStart);
      return std::nullopt;
    }
    std::string raw(static_cast<size_t>(*bytes), '\0');
    file.readAt(dataStart, raw.data(), raw.size(), "data");
    if (isFloating(descriptor->kind))
      tensor.floats.reserve(*count);
    else
      tensor.ints.reserve(*count);
    for (int64_t i = 0; i < *count; ++i) {
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
