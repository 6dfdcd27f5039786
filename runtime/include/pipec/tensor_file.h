// Named-tensor files: the weights of a stage (docs/weights-format.md), the
// per-stage files of a checkpoint (docs/checkpoint-format.md) and exported
// weights. Header-only, plain C++17 (no MPI, no MLIR): the compiler writes
// these files, piperun reads and writes them.
//
// Layout (little-endian):
//   "PIPECTS1"                       8-byte magic (format pipec.tensors/1)
//   u64 count
//   count times:
//     u32 name_len, name bytes (UTF-8, no terminator)
//     u32 dtype (pipec_dtype: 1 f32, 2 f64, 3 i64, 4 i32, 5 bool)
//     u32 rank, i64 dims[rank]
//     u64 nbytes (= product(dims) * dtype size), raw row-major data
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "pipec/stage_abi.h"

namespace pipec::io {

class FormatError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

inline size_t dtypeSize(int dtype) {
  switch (dtype) {
  case PIPEC_F32: return 4;
  case PIPEC_F64: return 8;
  case PIPEC_I64: return 8;
  case PIPEC_I32: return 4;
  case PIPEC_BOOL: return 1;
  default: return 0;
  }
}

inline const char *dtypeName(int dtype) {
  switch (dtype) {
  case PIPEC_F32: return "f32";
  case PIPEC_F64: return "f64";
  case PIPEC_I64: return "i64";
  case PIPEC_I32: return "i32";
  case PIPEC_BOOL: return "bool";
  default: return "?";
  }
}

// Accepts "f32"/"float32", "f64"/"float64", "i64"/"int64", "i32"/"int32", "bool"; 0 if unknown.
inline int dtypeFromName(const std::string &s) {
  if (s == "f32" || s == "float32") return PIPEC_F32;
  if (s == "f64" || s == "float64") return PIPEC_F64;
  if (s == "i64" || s == "int64") return PIPEC_I64;
  if (s == "i32" || s == "int32") return PIPEC_I32;
  if (s == "bool") return PIPEC_BOOL;
  return 0;
}

inline int64_t numElements(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

inline std::string shapeString(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "x" : "") + std::to_string(shape[i]);
  return s + "]";
}

struct Tensor {
  std::string name;
  int dtype = PIPEC_F32;
  std::vector<int64_t> shape;
  std::vector<char> data; // numElements(shape) * dtypeSize(dtype) bytes
  size_t bytes() const { return (size_t)numElements(shape) * dtypeSize(dtype); }
};

namespace detail {
inline void put(std::string &out, const void *p, size_t n) { out.append((const char *)p, n); }
template <class T> void putv(std::string &out, T v) { put(out, &v, sizeof v); }

struct Cursor {
  const std::string &path;
  std::ifstream &in;
  uint64_t remaining; // bytes left in the file; bounds every length read
  void get(void *p, size_t n, const char *what) {
    if (n > remaining || !in.read((char *)p, (std::streamsize)n))
      throw FormatError(path + ": truncated file while reading " + what);
    remaining -= n;
  }
  template <class T> T getv(const char *what) {
    T v;
    get(&v, sizeof v, what);
    return v;
  }
};

// Writes `bytes` to `path` atomically: a temporary file in the same
// directory, flushed, then renamed over the target (readers never see a
// half-written file, and a crash leaves the old file intact).
inline void writeFileAtomically(const std::string &path, const std::string &bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw FormatError(tmp + ": cannot open for writing");
    out.write(bytes.data(), (std::streamsize)bytes.size());
    out.flush();
    if (!out) throw FormatError(tmp + ": write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw FormatError(path + ": cannot rename " + tmp + " into place: " + std::strerror(errno));
}
} // namespace detail

inline constexpr char kTensorMagic[8] = {'P', 'I', 'P', 'E', 'C', 'T', 'S', '1'};

inline std::string encodeTensors(const std::vector<Tensor> &tensors) {
  std::string out;
  detail::put(out, kTensorMagic, 8);
  detail::putv<uint64_t>(out, tensors.size());
  for (const Tensor &t : tensors) {
    if (t.data.size() != t.bytes())
      throw FormatError("tensor " + t.name + ": " + std::to_string(t.data.size()) +
                        " data bytes for shape " + shapeString(t.shape) + " " + dtypeName(t.dtype));
    detail::putv<uint32_t>(out, (uint32_t)t.name.size());
    detail::put(out, t.name.data(), t.name.size());
    detail::putv<uint32_t>(out, (uint32_t)t.dtype);
    detail::putv<uint32_t>(out, (uint32_t)t.shape.size());
    for (int64_t d : t.shape) detail::putv<int64_t>(out, d);
    detail::putv<uint64_t>(out, t.data.size());
    detail::put(out, t.data.data(), t.data.size());
  }
  return out;
}

inline void writeTensorFile(const std::string &path, const std::vector<Tensor> &tensors) {
  detail::writeFileAtomically(path, encodeTensors(tensors));
}

inline std::vector<Tensor> readTensorFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw FormatError(path + ": cannot open (" + std::strerror(errno) + ")");
  const uint64_t size = (uint64_t)in.tellg();
  in.seekg(0);
  detail::Cursor c{path, in, size};
  char magic[8];
  c.get(magic, 8, "the magic");
  if (std::memcmp(magic, kTensorMagic, 8) != 0)
    throw FormatError(path + ": not a pipec tensor file (bad magic; expected PIPECTS1)");
  const uint64_t count = c.getv<uint64_t>("the tensor count");
  std::vector<Tensor> out;
  for (uint64_t i = 0; i < count; ++i) {
    Tensor t;
    const uint32_t nameLen = c.getv<uint32_t>("a name length");
    t.name.resize(nameLen);
    c.get(t.name.data(), nameLen, "a name");
    t.dtype = (int)c.getv<uint32_t>("a dtype");
    if (dtypeSize(t.dtype) == 0)
      throw FormatError(path + ": tensor " + t.name + ": unknown dtype " + std::to_string(t.dtype));
    const uint32_t rank = c.getv<uint32_t>("a rank");
    if (rank > 16) throw FormatError(path + ": tensor " + t.name + ": rank " + std::to_string(rank) + " > 16");
    for (uint32_t d = 0; d < rank; ++d) {
      t.shape.push_back(c.getv<int64_t>("a dimension"));
      if (t.shape.back() < 0) throw FormatError(path + ": tensor " + t.name + ": negative dimension");
    }
    const uint64_t nbytes = c.getv<uint64_t>("a byte count");
    if (nbytes != t.bytes())
      throw FormatError(path + ": tensor " + t.name + ": " + std::to_string(nbytes) + " bytes stored, shape " +
                        shapeString(t.shape) + " " + dtypeName(t.dtype) + " needs " + std::to_string(t.bytes()));
    t.data.resize(nbytes);
    c.get(t.data.data(), nbytes, ("the data of " + t.name).c_str());
    out.push_back(std::move(t));
  }
  if (c.remaining != 0)
    throw FormatError(path + ": " + std::to_string(c.remaining) + " trailing bytes after " + std::to_string(count) +
                      " tensors");
  return out;
}

} // namespace pipec::io
