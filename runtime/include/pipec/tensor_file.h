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
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "pipec/input_file.h"
#include "pipec/stage_abi.h"

namespace pipec::io {

// A malformed file (and, through detail::openInput, one that is not a
// regular file of bounded size): the message names the file and the reason.
class FormatError : public InputError {
public:
  using InputError::InputError;
};

inline size_t dtypeSize(int dtype) {
  switch (dtype) {
  case PIPEC_F32: return 4;
  case PIPEC_F64: return 8;
  case PIPEC_I64: return 8;
  case PIPEC_I32: return 4;
  case PIPEC_BOOL: return 1;
  case PIPEC_BF16: return 2;
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
  case PIPEC_BF16: return "bf16";
  default: return "?";
  }
}

// Accepts "f32"/"float32", "f64"/"float64", "i64"/"int64", "i32"/"int32", "bool"; 0 if unknown (bf16 lives only
// between CUDA stages, never in a file).
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

// Opens a user-supplied binary file (regular, bounded: pipec/input_file.h);
// its refusals become FormatError, the error of these readers.
inline InputFile openInput(const std::string &path, const char *what, uint64_t maxBytes) {
  try {
    return InputFile(path, what, maxBytes);
  } catch (const FormatError &) {
    throw;
  } catch (const InputError &e) {
    throw FormatError(e.what());
  }
}

// Sequential reads of an InputFile; every length is checked against the bytes
// left before the caller allocates for it.
struct FileCursor {
  const InputFile &file;
  uint64_t offset = 0;
  uint64_t remaining() const { return file.size() - offset; }
  void get(void *p, uint64_t n, const char *what) {
    if (n > remaining())
      throw FormatError(file.path() + ": truncated file while reading " + what + " (" + std::to_string(n) +
                        " bytes at offset " + std::to_string(offset) + ", " + std::to_string(remaining()) + " left)");
    try {
      file.readAt(offset, p, n, what);
    } catch (const InputError &e) {
      throw FormatError(e.what());
    }
    offset += n;
  }
  template <class T> T getv(const char *what) {
    T v;
    get(&v, sizeof v, what);
    return v;
  }
  // A length-prefixed string: the length is checked before allocating.
  std::string getString(uint32_t len, const char *what) {
    if (len > remaining())
      throw FormatError(file.path() + ": truncated file: " + what + " is " + std::to_string(len) +
                        " bytes long, the file has " + std::to_string(remaining()) + " left");
    std::string s(len, '\0');
    get(s.data(), len, what);
    return s;
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

// Writes a tensor file one tensor at a time, so that a writer holds one
// tensor, never the file (a job's weights: docs/weights-format.md). The
// file is written beside `path` and renamed into place by finish(), as
// detail::writeFileAtomically does: readers never see a half-written file.
class TensorFileWriter {
public:
  TensorFileWriter(std::string path, uint64_t count)
      : path(std::move(path)), tmp(this->path + ".tmp"), expected(count),
        out(tmp, std::ios::binary | std::ios::trunc) {
    if (!out) throw FormatError(tmp + ": cannot open for writing");
    std::string header;
    detail::put(header, kTensorMagic, 8);
    detail::putv<uint64_t>(header, count);
    write(header);
  }
  TensorFileWriter(const TensorFileWriter &) = delete;
  TensorFileWriter &operator=(const TensorFileWriter &) = delete;
  ~TensorFileWriter() {
    if (!finished) {
      out.close();
      std::remove(tmp.c_str());
    }
  }

  void add(const Tensor &t) {
    if (t.data.size() != t.bytes())
      throw FormatError("tensor " + t.name + ": " + std::to_string(t.data.size()) +
                        " data bytes for shape " + shapeString(t.shape) + " " + dtypeName(t.dtype));
    begin(t.name, t.dtype, t.shape);
    data(t.data.data(), t.data.size());
    end();
  }

  /// One tensor in pieces: its header, then data() until its bytes are
  /// written, then end() (which checks that they all were).
  void begin(const std::string &name, int dtype, const std::vector<int64_t> &shape) {
    if (open_) throw FormatError(path + ": tensor " + name + " begun inside " + current);
    if (written == expected)
      throw FormatError(path + ": more tensors than the " + std::to_string(expected) + " announced");
    const uint64_t bytes = (uint64_t)numElements(shape) * dtypeSize(dtype);
    std::string header;
    detail::putv<uint32_t>(header, (uint32_t)name.size());
    detail::put(header, name.data(), name.size());
    detail::putv<uint32_t>(header, (uint32_t)dtype);
    detail::putv<uint32_t>(header, (uint32_t)shape.size());
    for (int64_t d : shape) detail::putv<int64_t>(header, d);
    detail::putv<uint64_t>(header, bytes);
    write(header);
    open_ = true;
    current = name;
    left = bytes;
  }
  void data(const char *bytes, size_t size) {
    if (!open_ || size > left)
      throw FormatError(path + ": tensor " + current + ": more data than its shape holds");
    out.write(bytes, (std::streamsize)size);
    if (!out) throw FormatError(tmp + ": write failed");
    left -= size;
  }
  void end() {
    if (!open_ || left != 0)
      throw FormatError(path + ": tensor " + current + ": " + std::to_string(left) + " data bytes missing");
    open_ = false;
    ++written;
  }

  /// Checks that every announced tensor was added, then renames into place.
  void finish() {
    if (open_) throw FormatError(path + ": tensor " + current + " not ended");
    if (written != expected)
      throw FormatError(path + ": " + std::to_string(written) + " tensors written of the " +
                        std::to_string(expected) + " announced");
    out.flush();
    if (!out) throw FormatError(tmp + ": write failed");
    out.close();
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw FormatError(path + ": cannot rename " + tmp + " into place: " + std::strerror(errno));
    finished = true;
  }

private:
  void write(const std::string &bytes) {
    out.write(bytes.data(), (std::streamsize)bytes.size());
    if (!out) throw FormatError(tmp + ": write failed");
  }
  std::string path, tmp;
  uint64_t expected, written = 0;
  std::ofstream out;
  bool finished = false;
  bool open_ = false; // a tensor begun and not ended
  std::string current;
  uint64_t left = 0;  // its data bytes still to write
};

inline void writeTensorFile(const std::string &path, const std::vector<Tensor> &tensors) {
  TensorFileWriter writer(path, tensors.size());
  for (const Tensor &t : tensors) writer.add(t);
  writer.finish();
}

// One tensor's header in a tensor file, as forEachTensor hands it over.
struct TensorHeader {
  std::string name;
  int dtype = PIPEC_F32;
  std::vector<int64_t> shape;
  uint64_t bytes = 0; // numElements(shape) * dtypeSize(dtype), checked
};

// Reads the data of the tensor being visited: read() calls add up to at most
// its bytes, in any pieces (a reader of a 10 GB file holds one piece at a
// time); what is left unread is skipped.
class TensorDataReader {
public:
  TensorDataReader(detail::FileCursor &cursor, const TensorHeader &header) : c_(cursor), h_(header) {}
  uint64_t left() const { return left_; }
  // Where in the file the next read() starts (the data's start before any).
  uint64_t offset() const { return c_.offset; }
  void read(void *dst, uint64_t n) {
    if (n > left_)
      throw FormatError(c_.file.path() + ": tensor " + h_.name + ": reading " + std::to_string(n) + " bytes, " +
                        std::to_string(left_) + " of its data left");
    c_.get(dst, n, ("the data of " + h_.name).c_str());
    left_ -= n;
  }

private:
  detail::FileCursor &c_;
  const TensorHeader &h_;
  uint64_t left_ = h_.bytes;
};

// Reads a tensor file tensor by tensor: a regular file of bounded size
// (pipec/input_file.h), every header length and count checked against the
// bytes left in the file before anything is allocated, element counts and
// byte counts computed with overflow checks; `visit(header, reader)` for each
// tensor in file order, which reads as much of its data as it wants.
// `what` names the file's role in messages ("weights file", "checkpoint
// file"). Throws FormatError naming the file (and the tensor).
template <class Visit> void forEachTensor(const std::string &path, const char *what, Visit visit) {
  const InputFile file = detail::openInput(path, what, kMaxTensorFileBytes);
  detail::FileCursor c{file};
  char magic[8];
  c.get(magic, 8, "the magic");
  if (std::memcmp(magic, kTensorMagic, 8) != 0)
    throw FormatError(path + ": not a pipec tensor file (bad magic; expected PIPECTS1)");
  const uint64_t count = c.getv<uint64_t>("the tensor count");
  // Each tensor takes at least name_len + dtype + rank + nbytes = 20 bytes.
  if (count > c.remaining() / 20)
    throw FormatError(path + ": truncated file: the tensor count " + std::to_string(count) + " needs at least " +
                      (count > UINT64_MAX / 20 ? std::string("2^64") : std::to_string(count * 20)) +
                      " more bytes, the file has " + std::to_string(c.remaining()) + " left");
  std::set<std::string> names;
  for (uint64_t i = 0; i < count; ++i) {
    TensorHeader t;
    const std::string index = "tensor #" + std::to_string(i);
    t.name = c.getString(c.getv<uint32_t>("a name length"), ("the name of " + index).c_str());
    if (!names.insert(t.name).second) throw FormatError(path + ": tensor " + t.name + " appears twice");
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
    const auto elements = checkedElementCount(t.shape);
    const auto need = elements ? checkedMul<uint64_t>((uint64_t)*elements, dtypeSize(t.dtype)) : std::nullopt;
    if (!need)
      throw FormatError(path + ": tensor " + t.name + ": shape " + shapeString(t.shape) + " " + dtypeName(t.dtype) +
                        " has more than 2^63 elements or bytes");
    if (nbytes != *need)
      throw FormatError(path + ": tensor " + t.name + ": " + std::to_string(nbytes) + " bytes stored, shape " +
                        shapeString(t.shape) + " " + dtypeName(t.dtype) + " needs " + std::to_string(*need));
    if (nbytes > c.remaining())
      throw FormatError(path + ": truncated file: tensor " + t.name + " needs " + std::to_string(nbytes) +
                        " data bytes, the file has " + std::to_string(c.remaining()) + " left");
    t.bytes = nbytes;
    TensorDataReader reader(c, t);
    visit(static_cast<const TensorHeader &>(t), reader);
    c.offset += reader.left(); // within the file: checked above
  }
  if (c.remaining() != 0)
    throw FormatError(path + ": " + std::to_string(c.remaining()) + " trailing bytes after " + std::to_string(count) +
                      " tensors");
}

// Reads a whole tensor file into memory (forEachTensor).
inline std::vector<Tensor> readTensorFile(const std::string &path, const char *what = "tensor file") {
  std::vector<Tensor> out;
  forEachTensor(path, what, [&](const TensorHeader &h, TensorDataReader &reader) {
    Tensor t;
    t.name = h.name;
    t.dtype = h.dtype;
    t.shape = h.shape;
    t.data.resize(static_cast<size_t>(h.bytes));
    reader.read(t.data.data(), h.bytes);
    out.push_back(std::move(t));
  });
  return out;
}

} // namespace pipec::io
