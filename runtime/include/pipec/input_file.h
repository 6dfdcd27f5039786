// Reading files that come from users (models, external data, plans, weights,
// checkpoints, data sets, cost tables, cluster files): regular files only,
// the size known and bounded before anything is read, and every offset and
// length checked with overflow-safe arithmetic (docs/security.md).
// Header-only, plain C++17 + POSIX: shared by the compiler and the runtime.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace pipec::io {

/// A user-supplied file that cannot be read safely: its message names the
/// file and the reason.
class InputError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// Ceilings on one input file, checked before reading. Text formats (JSON,
/// CSV, ONNX text) are small; a model is bounded by protobuf's own 2 GiB
/// message limit; binary tensor files (external data, weights, checkpoints,
/// data sets) may be large but never larger than the file system says.
inline constexpr uint64_t kMaxTextFileBytes = 256ull << 20;
inline constexpr uint64_t kMaxModelFileBytes = 2ull << 30;
inline constexpr uint64_t kMaxTensorFileBytes = 1ull << 40;

/// What a non-regular file is, for the error message.
inline const char *fileKindName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

/// An open regular file of known size, read with positioned reads.
class InputFile {
public:
  /// Opens `path` without blocking (a FIFO would otherwise wait for a
  /// writer), refuses anything that is not a regular file, and refuses files
  /// over `maxBytes`. `what` names the file's role in messages ("model",
  /// "weights file", ...).
  InputFile(const std::string &path, const char *what, uint64_t maxBytes) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd_ < 0)
      throw InputError(path + ": cannot open " + what + " (" + std::strerror(errno) + ")");
    struct stat st;
    if (::fstat(fd_, &st) != 0) {
      const std::string reason = std::strerror(errno);
      ::close(fd_);
      throw InputError(path + ": cannot stat " + what + " (" + reason + ")");
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd_);
      throw InputError(path + ": " + what + " is " + fileKindName(st.st_mode) +
                       ", not a regular file");
    }
    size_ = static_cast<uint64_t>(st.st_size);
    if (size_ > maxBytes) {
      ::close(fd_);
      throw InputError(path + ": " + what + " is " + std::to_string(size_) + " bytes, over the limit of " +
                       std::to_string(maxBytes) + " bytes");
    }
  }
  InputFile(const InputFile &) = delete;
  InputFile &operator=(const InputFile &) = delete;
  ~InputFile() {
    if (fd_ >= 0) ::close(fd_);
  }

  const std::string &path() const { return path_; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_; }

  /// Reads exactly `n` bytes at `offset`; the range must lie inside the file.
  void readAt(uint64_t offset, void *dst, uint64_t n, const char *what) const {
    if (offset > size_ || n > size_ - offset)
      throw InputError(path_ + ": " + what + " lies outside the file (offset " + std::to_string(offset) +
                       ", " + std::to_string(n) + " bytes, file size " + std::to_string(size_) + ")");
    char *out = static_cast<char *>(dst);
    while (n > 0) {
      const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, 1u << 30));
      const ssize_t got = ::pread(fd_, out, chunk, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0)
        throw InputError(path_ + ": read failed at offset " + std::to_string(offset) + " while reading " + what +
                         (got < 0 ? std::string(" (") + std::strerror(errno) + ")" : " (file shrank)"));
      out += got;
      offset += static_cast<uint64_t>(got);
      n -= static_cast<uint64_t>(got);
    }
  }

  std::string readAll(const char *what) const {
    std::string bytes(static_cast<size_t>(size_), '\0');
    readAt(0, bytes.data(), size_, what);
    return bytes;
  }

private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

/// The whole content of a bounded regular file.
inline std::string readInputFile(const std::string &path, const char *what, uint64_t maxBytes = kMaxTextFileBytes) {
  return InputFile(path, what, maxBytes).readAll(what);
}

/// The size of a bounded regular file, refusing anything else.
inline uint64_t checkInputFile(const std::string &path, const char *what, uint64_t maxBytes) {
  return InputFile(path, what, maxBytes).size();
}

// ---- overflow-safe arithmetic -------------------------------------------

/// a + b, or nullopt on overflow.
template <class T> std::optional<T> checkedAdd(T a, T b) {
  T out;
  if (__builtin_add_overflow(a, b, &out)) return std::nullopt;
  return out;
}

/// a * b, or nullopt on overflow.
template <class T> std::optional<T> checkedMul(T a, T b) {
  T out;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

/// Whether [offset, offset + length) lies inside a file of `size` bytes,
/// without computing offset + length (which may overflow).
inline bool rangeWithin(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

/// The number of elements of a shape when every dimension is non-negative
/// and the product stays within `limit`; nullopt otherwise.
template <class Dims>
std::optional<int64_t> checkedElementCount(const Dims &dims,
                                           int64_t limit = std::numeric_limits<int64_t>::max()) {
  int64_t count = 1;
  for (auto d : dims) {
    const int64_t dim = static_cast<int64_t>(d);
    if (dim < 0) return std::nullopt;
    auto product = checkedMul<int64_t>(count, dim);
    if (!product || *product > limit) return std::nullopt;
    count = *product;
  }
  return count;
}

} // namespace pipec::io
