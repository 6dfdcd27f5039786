// NumPy's .npy header (NumPy's "format.py": versions 1.0, 2.0 and 3.0): the
// magic, the header length, and the header's Python dict literal
// {'descr': '<f4', 'fortran_order': False, 'shape': (N, ...), }, read into
// the type string, the shape and where the data starts
// (docs/dataset-format.md, "Arrays"). Header-only, plain C++17: the one .npy
// header reader of piperun's array data sets (.npz, folders of .npy), their
// fuzzer, and the compiler's .npy inputs (compiler/Import/Npy.cpp), each of
// which maps the type string to its own element types.
#pragma once

#include "pipec/tensor_file.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pipec::io {

inline constexpr unsigned char kNpyMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
/// NumPy writes headers under 64 KiB (version 1.0's limit) unless an array
/// has thousands of dimensions; this bounds what a reader allocates for one.
inline constexpr uint64_t kMaxNpyHeaderBytes = 1 << 20;

struct NpyHeader {
  std::string descr;           ///< the type string: '<f4', '|b1', ... (little-endian or byte-order-free)
  uint64_t itemBytes = 0;      ///< the size of one element, from the type string
  std::vector<int64_t> shape;  ///< the whole array's, row-major
  uint64_t dataOffset = 0;     ///< bytes from the file's start to the data
  uint64_t dataBytes = 0;      ///< product(shape) x itemBytes
};

/// The pipec dtype of a NumPy type string, 0 if none: little-endian (or
/// byte-order-free) f4, f8, i8, i4 and b1, the element types of the stage ABI.
inline int dtypeOfNumpyDescr(const std::string &descr) {
  if (descr.size() != 3 || (descr[0] != '<' && descr[0] != '|' && descr[0] != '='))
    return 0;
  const std::string type = descr.substr(1);
  if (type == "f4") return PIPEC_F32;
  if (type == "f8") return PIPEC_F64;
  if (type == "i8") return PIPEC_I64;
  if (type == "i4") return PIPEC_I32;
  if (type == "b1") return PIPEC_BOOL;
  return 0;
}

namespace detail {

/// The header's dict: a Python literal with string keys, whose values are a
/// string, True/False, or a tuple of non-negative integers.
class NpyDictParser {
public:
  NpyDictParser(const std::string &where, const std::string &text) : where_(where), text_(text) {}

  NpyHeader parse() {
    std::optional<std::string> descr;
    std::optional<bool> fortranOrder;
    std::optional<std::vector<int64_t>> shape;
    expect('{');
    while (true) {
      skipSpace();
      if (peek() == '}') break;
      const std::string key = string();
      expect(':');
      skipSpace();
      if (key == "descr") {
        if (peek() != '\'' && peek() != '"')
          fail("the .npy header's 'descr' is not a type string (a structured dtype)");
        descr = string();
      } else if (key == "fortran_order") {
        fortranOrder = boolean();
      } else if (key == "shape") {
        shape = tuple();
      } else {
        fail("the .npy header has an unknown key '" + key + "'");
      }
      skipSpace();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect('}');
      --pos_;
    }
    if (!descr || !fortranOrder || !shape)
      fail(std::string("the .npy header has no ") + (!descr ? "descr" : !fortranOrder ? "fortran_order" : "shape"));
    if (*fortranOrder)
      fail("the .npy array is in Fortran (column-major) order; save np.ascontiguousarray(a)");
    // A plain type: byte order, kind, size in bytes ('<f4').
    const std::string &type = *descr;
    if (type.size() < 3 || type.size() > 4 || !std::isalpha(static_cast<unsigned char>(type[1])) ||
        type.find_first_not_of("0123456789", 2) != std::string::npos)
      fail("the .npy dtype '" + type + "' is not a plain numeric type");
    if (type[0] == '>')
      fail("the .npy dtype '" + type + "' is big-endian; save a.astype('<" + type.substr(1) + "')");
    if (type[0] != '<' && type[0] != '|' && type[0] != '=')
      fail("the .npy dtype '" + type + "' has an unknown byte order");
    NpyHeader header;
    header.descr = type;
    header.itemBytes = std::stoull(type.substr(2));
    header.shape = *shape;
    return header;
  }

private:
  [[noreturn]] void fail(const std::string &why) const { throw FormatError(where_ + ": " + why); }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void skipSpace() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  void expect(char c) {
    skipSpace();
    if (peek() != c) fail(std::string("the .npy header has no '") + c + "' at byte " + std::to_string(pos_));
    ++pos_;
  }
  std::string string() {
    skipSpace();
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail("the .npy header has no quoted key at byte " + std::to_string(pos_));
    const size_t end = text_.find(quote, pos_ + 1);
    if (end == std::string::npos) fail("the .npy header has an unterminated string");
    std::string s = text_.substr(pos_ + 1, end - pos_ - 1);
    pos_ = end + 1;
    return s;
  }
  bool boolean() {
    if (text_.compare(pos_, 4, "True") == 0) return pos_ += 4, true;
    if (text_.compare(pos_, 5, "False") == 0) return pos_ += 5, false;
    fail("the .npy header's fortran_order is not True or False");
  }
  std::vector<int64_t> tuple() {
    expect('(');
    std::vector<int64_t> dims;
    while (true) {
      skipSpace();
      if (peek() == ')') break;
      const size_t end = std::min(text_.find_first_of(",)", pos_), pos_ + 40);
      const std::string entry = text_.substr(pos_, end == std::string::npos ? 40 : end - pos_);
      const size_t digits = entry.find_first_not_of("0123456789");
      const std::string number = entry.substr(0, digits);
      const bool blankAfter = digits == std::string::npos ||
                              entry.find_first_not_of(" L", digits) == std::string::npos; // Python 2's 10L
      if (number.empty() || number.size() > 18 || !blankAfter)
        fail("the .npy shape entry '" + entry + "' is not a dimension");
      if (dims.size() == 32) fail("the .npy shape has more than 32 dimensions");
      const int64_t value = std::stoll(number);
      pos_ += number.size();
      dims.push_back(value);
      skipSpace();
      if (peek() == 'L') ++pos_;
      skipSpace();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != ')') fail("the .npy shape has no ',' or ')' at byte " + std::to_string(pos_));
    }
    ++pos_;
    return dims;
  }

  const std::string &where_;
  const std::string &text_;
  size_t pos_ = 0;
};

} // namespace detail

/// The header of an array of `totalBytes` bytes whose bytes `readAt(offset,
/// dst, n)` reads (a file, an archive's member). Throws FormatError naming
/// `where` unless the header is well formed and the data fills the rest of
/// the array exactly.
template <class ReadAt> NpyHeader readNpyHeader(const std::string &where, uint64_t totalBytes, ReadAt &&readAt) {
  std::string prefix(std::min<uint64_t>(totalBytes, 12), '\0');
  readAt(0, prefix.data(), prefix.size());
  if (prefix.size() < 10 || std::memcmp(prefix.data(), kNpyMagic, 6) != 0)
    throw FormatError(where + ": not a .npy file (bad magic; expected \\x93NUMPY)");
  const unsigned major = static_cast<unsigned char>(prefix[6]);
  if (major < 1 || major > 3)
    throw FormatError(where + ": unsupported .npy format version " + std::to_string(major) + " (1, 2 and 3 are read)");
  const size_t lengthBytes = major == 1 ? 2 : 4;
  if (prefix.size() < 8 + lengthBytes)
    throw FormatError(where + ": truncated .npy header");
  uint64_t headerLength = 0;
  for (size_t i = 0; i < lengthBytes; ++i)
    headerLength |= uint64_t(static_cast<unsigned char>(prefix[8 + i])) << (8 * i);
  const uint64_t dataOffset = 8 + lengthBytes + headerLength;
  if (headerLength > kMaxNpyHeaderBytes || dataOffset > totalBytes)
    throw FormatError(where + ": .npy header length " + std::to_string(headerLength) + " runs past the end of the file (" +
                      std::to_string(totalBytes) + " bytes)");
  std::string text(headerLength, '\0');
  readAt(8 + lengthBytes, text.data(), text.size());
  NpyHeader header = detail::NpyDictParser(where, text).parse();
  header.dataOffset = dataOffset;
  const auto elements = checkedElementCount(header.shape);
  const auto bytes = elements ? checkedMul<uint64_t>(static_cast<uint64_t>(*elements), header.itemBytes)
                              : std::nullopt;
  if (!bytes || *bytes != totalBytes - dataOffset)
    throw FormatError(where + ": the .npy header's shape " + shapeString(header.shape) + " and type " + header.descr +
                      " need " + (bytes ? std::to_string(*bytes) : std::string("more than 2^63")) +
                      " bytes of data but the file holds " + std::to_string(totalBytes - dataOffset));
  header.dataBytes = *bytes;
  return header;
}

} // namespace pipec::io
