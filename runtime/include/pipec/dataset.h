// Data sets for piperun (docs/dataset-format.md): a reader and a writer of
// the binary format, and the synthetic data set used when no --data file is
// given. Header-only, plain C++17 (no MPI).
//
// Layout (little-endian):
//   "PIPECDS1"                     8-byte magic (format pipec.dataset/1)
//   u32 num_fields, u64 num_samples
//   num_fields times: u32 name_len, name, u32 dtype, u32 rank, i64 dims[rank]
//     (the shape of ONE sample, without the batch dimension)
//   then, field by field in header order, num_samples samples of that field,
//   each product(dims) * dtype-size bytes, row-major.
// Field-major storage lets a rank read only the fields its stage uses
// (stage 0 the inputs, the last stage the labels) with one read per field.
#pragma once

#include "pipec/synthetic_data.h" // mix64, the synthetic values
#include "pipec/tensor_file.h"
#include "pipec/vocabulary.h"

#include <cmath>
#include <memory>
#include <optional>
#include <vector>

namespace pipec::io {

struct FieldSpec {
  std::string name;
  int dtype = PIPEC_F32;
  std::vector<int64_t> shape; // one sample
  // Synthetic values: floats uniform in [low, high), integers uniform in
  // [low, high) (e.g. class labels [0, classes)), bools 0/1.
  double low = -1.0, high = 1.0;
  std::optional<DataRole> role; // the plan's; absent for a data set's own fields
  size_t sampleBytes() const { return (size_t)numElements(shape) * dtypeSize(dtype); }
};

inline constexpr char kDatasetMagic[8] = {'P', 'I', 'P', 'E', 'C', 'D', 'S', '1'};

// A source of samples; `read` copies samples [first, first+count) of field
// `field` (indices wrap modulo numSamples()) into dst.
class DataSource {
public:
  virtual ~DataSource() = default;
  virtual const std::vector<FieldSpec> &fields() const = 0;
  virtual uint64_t numSamples() const = 0;
  virtual void read(size_t field, uint64_t first, uint64_t count, void *dst) = 0;
  virtual std::string describe() const = 0;
  int fieldIndex(const std::string &name) const {
    for (size_t i = 0; i < fields().size(); ++i)
      if (fields()[i].name == name) return (int)i;
    return -1;
  }
};

class DatasetFile : public DataSource {
public:
  // Opens a data set (a regular file of bounded size, pipec/input_file.h),
  // checks its header against the file size before allocating anything
  // (name lengths, field count, ranks), computes each field's bytes with
  // overflow checks and requires the data to fill the file exactly.
  explicit DatasetFile(const std::string &path)
      : path_(path), file_(new InputFile(detail::openInput(path, "data set", kMaxTensorFileBytes))) {
    detail::FileCursor c{*file_};
    char magic[8];
    c.get(magic, 8, "the magic");
    if (std::memcmp(magic, kDatasetMagic, 8) != 0)
      throw FormatError(path + ": not a pipec data set (bad magic; expected PIPECDS1)");
    const uint32_t nf = c.getv<uint32_t>("the field count");
    samples_ = c.getv<uint64_t>("the sample count");
    if (nf == 0 || nf > 4096) throw FormatError(path + ": bad field count " + std::to_string(nf) + " (1..4096)");
    // A field header takes at least name_len + dtype + rank = 12 bytes.
    if (nf > c.remaining() / 12)
      throw FormatError(path + ": truncated file: " + std::to_string(nf) + " field headers need at least " +
                        std::to_string(uint64_t(nf) * 12) + " bytes, the file has " + std::to_string(c.remaining()) +
                        " left");
    if (samples_ == 0) throw FormatError(path + ": the data set has no samples");
    for (uint32_t i = 0; i < nf; ++i) {
      FieldSpec f;
      f.name = c.getString(c.getv<uint32_t>("a field name length"), ("the name of field #" + std::to_string(i)).c_str());
      for (const FieldSpec &o : fields_)
        if (o.name == f.name) throw FormatError(path + ": field " + f.name + " appears twice");
      f.dtype = (int)c.getv<uint32_t>("a field dtype");
      if (dtypeSize(f.dtype) == 0)
        throw FormatError(path + ": field " + f.name + ": unknown dtype " + std::to_string(f.dtype));
      const uint32_t rank = c.getv<uint32_t>("a field rank");
      if (rank > 16) throw FormatError(path + ": field " + f.name + ": rank " + std::to_string(rank) + " > 16");
      for (uint32_t d = 0; d < rank; ++d) {
        f.shape.push_back(c.getv<int64_t>("a field dimension"));
        if (f.shape.back() < 0)
          throw FormatError(path + ": field " + f.name + ": negative dimension " + std::to_string(f.shape.back()));
      }
      fields_.push_back(f);
    }
    // The data must fill the rest of the file exactly: every product checked
    // (sample bytes x samples may exceed 2^64 in a hostile header).
    const uint64_t dataStart = c.offset, dataBytes = c.remaining();
    uint64_t need = 0;
    for (const FieldSpec &f : fields_) {
      offsets_.push_back(dataStart + need);
      const auto elements = checkedElementCount(f.shape);
      const auto sampleBytes = elements ? checkedMul<uint64_t>((uint64_t)*elements, dtypeSize(f.dtype)) : std::nullopt;
      const auto fieldBytes = sampleBytes ? checkedMul<uint64_t>(*sampleBytes, samples_) : std::nullopt;
      const auto total = fieldBytes ? checkedAdd<uint64_t>(need, *fieldBytes) : std::nullopt;
      if (!total || *total > dataBytes)
        throw FormatError(path + ": field " + f.name + ": " + std::to_string(samples_) + " samples of " +
                          dtypeName(f.dtype) + shapeString(f.shape) + " need " +
                          (fieldBytes ? std::to_string(*fieldBytes) + " bytes" : std::string("over 2^64 bytes")) +
                          ", more than the " + std::to_string(dataBytes) + " data bytes after the header");
      need = *total;
    }
    if (need != dataBytes)
      throw FormatError(path + ": " + std::to_string(dataBytes) + " data bytes after the header, the fields need " +
                        std::to_string(need) + " for " + std::to_string(samples_) + " samples");
  }
  const std::vector<FieldSpec> &fields() const override { return fields_; }
  uint64_t numSamples() const override { return samples_; }
  std::string describe() const override { return path_; }
  void read(size_t field, uint64_t first, uint64_t count, void *dst) override {
    const uint64_t sb = fields_[field].sampleBytes(); // sb x samples_ fits in the file (constructor)
    char *out = (char *)dst;
    while (count > 0) { // one contiguous read per run of samples up to the wrap
      const uint64_t start = first % samples_, run = std::min<uint64_t>(count, samples_ - start);
      try {
        file_->readAt(offsets_[field] + start * sb, out, run * sb, ("field " + fields_[field].name).c_str());
      } catch (const InputError &e) {
        throw FormatError(e.what());
      }
      out += run * sb;
      first += run;
      count -= run;
    }
  }

private:
  std::string path_;
  std::unique_ptr<InputFile> file_;
  uint64_t samples_ = 0;
  std::vector<FieldSpec> fields_;
  std::vector<uint64_t> offsets_;
};

// Counter-based generator: the value of element e of sample s of field f
// depends only on (seed, f, s, e) (pipec/synthetic_data.h, shared with the
// CUDA kernel that fills a micro-batch on the device), so every rank
// produces the same sample without coordination, in any order.
class SyntheticData : public DataSource {
public:
  SyntheticData(std::vector<FieldSpec> fields, uint64_t samples, uint64_t seed)
      : fields_(std::move(fields)), samples_(samples), seed_(seed) {
    if (samples_ == 0) throw FormatError("synthetic data set: 0 samples");
  }
  const std::vector<FieldSpec> &fields() const override { return fields_; }
  uint64_t numSamples() const override { return samples_; }
  std::string describe() const override {
    return "synthetic data (" + std::to_string(samples_) + " samples, seed " + std::to_string(seed_) + ")";
  }
  // What field `field`'s values depend on (a CUDA rank generates them on the
  // device from it, docs/runtime.md "Data read ahead").
  SyntheticField valuesOf(size_t field) const {
    const FieldSpec &f = fields_[field];
    SyntheticField v;
    v.key = syntheticFieldKey(seed_, field);
    v.samples = samples_;
    v.sampleElements = numElements(f.shape);
    v.dtype = f.dtype;
    v.low = f.low, v.span = f.high - f.low;
    return v;
  }
  // Element e of sample s is a function of (seed, field, s, e) alone, so any
  // rank and a resumed run read the same values. The dtype dispatch stays
  // out of the element loop.
  void read(size_t field, uint64_t first, uint64_t count, void *dst) override {
    const SyntheticField v = valuesOf(field);
    for (uint64_t i = 0; i < count; ++i) {
      const uint64_t sampleKey = syntheticSampleKey(v, first + i);
      const size_t k = (size_t)(i * v.sampleElements);
      withSyntheticType(v.dtype, [&](auto zero) {
        using T = decltype(zero);
        fill<T>(static_cast<T *>(dst) + k, v, sampleKey);
      });
    }
  }

private:
  template <class T> static void fill(T *out, const SyntheticField &v, uint64_t sampleKey) {
    for (int64_t e = 0; e < v.sampleElements; ++e) out[e] = syntheticValue<T>(v, sampleKey, e);
  }

  std::vector<FieldSpec> fields_;
  uint64_t samples_;
  uint64_t seed_;
};

// Writes a data set; data[i] holds numSamples samples of fields[i].
inline void writeDataset(const std::string &path, const std::vector<FieldSpec> &fields, uint64_t numSamples,
                         const std::vector<std::vector<char>> &data) {
  if (fields.size() != data.size()) throw FormatError(path + ": one data array per field expected");
  std::string out;
  detail::put(out, kDatasetMagic, 8);
  detail::putv<uint32_t>(out, (uint32_t)fields.size());
  detail::putv<uint64_t>(out, numSamples);
  for (const FieldSpec &f : fields) {
    detail::putv<uint32_t>(out, (uint32_t)f.name.size());
    detail::put(out, f.name.data(), f.name.size());
    detail::putv<uint32_t>(out, (uint32_t)f.dtype);
    detail::putv<uint32_t>(out, (uint32_t)f.shape.size());
    for (int64_t d : f.shape) detail::putv<int64_t>(out, d);
  }
  for (size_t i = 0; i < fields.size(); ++i) {
    if (data[i].size() != fields[i].sampleBytes() * numSamples)
      throw FormatError(path + ": field " + fields[i].name + " has " + std::to_string(data[i].size()) +
                        " bytes, expected " + std::to_string(fields[i].sampleBytes() * numSamples));
    detail::put(out, data[i].data(), data[i].size());
  }
  detail::writeFileAtomically(path, out);
}

// A token file (docs/dataset-format.md, "Token files"): a flat array of
// little-endian uint16 or uint32 token ids, as nanoGPT's prepare.py writes
// them, feeding a language model whose plan has one integer input field and
// one label field of the same shape [T]. Sample i is the window of T tokens
// that starts at mix64(seed ^ mix64(i)) mod (N - T) (N tokens in the file);
// its input is the window, its labels the window shifted by one token. The
// start depends only on the seed and the sample index, so every rank, and a
// resumed run, read the same windows. Ids at or above the fields' `high`
// (the model's vocabulary) are an error naming the file and the position.
class TokenFile : public DataSource {
public:
  TokenFile(const std::string &path, TokenDtype dtype, const std::vector<FieldSpec> &planFields, uint64_t seed)
      : path_(path), tokenBytes_(dtype == TokenDtype::Uint16 ? 2 : 4), seed_(seed),
        file_(new InputFile(detail::openInput(path, "token file", kMaxTensorFileBytes))) {
    const FieldSpec *input = nullptr, *labels = nullptr;
    int inputs = 0, labelFields = 0;
    for (const FieldSpec &f : planFields) {
      if (f.role == DataRole::Input) input = &f, ++inputs;
      if (f.role == DataRole::Label) labels = &f, ++labelFields;
    }
    std::string fields;
    for (const FieldSpec &f : planFields)
      fields += (fields.empty() ? "" : ", ") + f.name + " " + dtypeName(f.dtype) + shapeString(f.shape) +
                (f.role ? std::string(" (") + choiceName(*f.role) + ")" : std::string(" (no role)"));
    auto integer1d = [](const FieldSpec *f) {
      return f && (f->dtype == PIPEC_I64 || f->dtype == PIPEC_I32) && f->shape.size() == 1 && f->shape[0] > 0;
    };
    if (inputs != 1 || labelFields != 1 || !integer1d(input) || !integer1d(labels) || input->shape != labels->shape)
      throw FormatError(path + ": a token file feeds a language model: one integer input and integer labels of "
                        "the same shape [T] per sample; the plan's data fields are " + fields +
                        " (plans compiled before the fields had roles: re-run pipec)");
    fields_ = {*input, *labels};
    window_ = static_cast<uint64_t>(input->shape[0]);
    if (file_->size() % tokenBytes_ != 0)
      throw FormatError(path + ": " + std::to_string(file_->size()) + " bytes is not a whole number of " +
                        choiceName(dtype) + " token ids");
    tokens_ = file_->size() / tokenBytes_;
    if (tokens_ < window_ + 1)
      throw FormatError(path + ": " + std::to_string(tokens_) + " tokens, fewer than the " +
                        std::to_string(window_ + 1) + " a window of " + std::to_string(window_) +
                        " and its shifted labels need");
    samples_ = tokens_ - window_;
  }
  const std::vector<FieldSpec> &fields() const override { return fields_; }
  uint64_t numSamples() const override { return samples_; }
  std::string describe() const override { return path_; }
  // The first token of sample i's window.
  uint64_t windowStart(uint64_t sample) const { return mix64(seed_ ^ mix64(sample % samples_)) % samples_; }
  void read(size_t field, uint64_t first, uint64_t count, void *dst) override {
    const FieldSpec &f = fields_[field];
    std::vector<unsigned char> raw(window_ * tokenBytes_);
    for (uint64_t k = 0; k < count; ++k) {
      const uint64_t start = windowStart(first + k) + (field == 1 ? 1 : 0);
      try {
        file_->readAt(start * tokenBytes_, raw.data(), raw.size(), "a window of tokens");
      } catch (const InputError &e) {
        throw FormatError(e.what());
      }
      for (uint64_t t = 0; t < window_; ++t) {
        uint32_t id = 0;
        if (tokenBytes_ == 2)
          id = uint32_t(raw[2 * t]) | uint32_t(raw[2 * t + 1]) << 8;
        else
          id = uint32_t(raw[4 * t]) | uint32_t(raw[4 * t + 1]) << 8 | uint32_t(raw[4 * t + 2]) << 16 |
               uint32_t(raw[4 * t + 3]) << 24;
        if (double(id) >= f.high)
          throw FormatError(path_ + ": token " + std::to_string(start + t) + " is " + std::to_string(id) +
                            ", not below the model's vocabulary size " + std::to_string((uint64_t)f.high) +
                            " (field " + f.name + ")");
        const uint64_t e = k * window_ + t;
        if (f.dtype == PIPEC_I64)
          static_cast<int64_t *>(dst)[e] = id;
        else
          static_cast<int32_t *>(dst)[e] = static_cast<int32_t>(id);
      }
    }
  }

private:
  std::string path_;
  uint64_t tokenBytes_, seed_;
  std::unique_ptr<InputFile> file_;
  std::vector<FieldSpec> fields_;
  uint64_t window_ = 0, tokens_ = 0, samples_ = 0;
};

} // namespace pipec::io
