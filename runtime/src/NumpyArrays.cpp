#include "NumpyArrays.h"

#include "pipec/npy.h"

#include <zip.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string_view>

namespace pipec::rt {
namespace {

namespace fs = std::filesystem;
using io::FormatError;
using io::InputError;
using io::InputFile;

/// A compressed member (np.savez_compressed) cannot be read at an offset
/// (libzip 1.7 seeks in stored members only), so it is inflated once when
/// the data set opens; this bounds that copy.
constexpr uint64_t kMaxInflatedArrayBytes = 4ull << 30;

constexpr std::string_view kSuffix = ".npy";

bool endsWithNpy(const std::string &name) {
  return name.size() > kSuffix.size() && name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0;
}
std::string withoutSuffix(const std::string &name) { return name.substr(0, name.size() - kSuffix.size()); }

/// One array: where its bytes are, and its header.
class ArrayBytes {
public:
  virtual ~ArrayBytes() = default;
  /// Reads [offset, offset + n) of the array's bytes (header included).
  virtual void readAt(uint64_t offset, void *dst, uint64_t n) = 0;
  virtual uint64_t size() const = 0;
};

class NpyFileBytes : public ArrayBytes {
public:
  explicit NpyFileBytes(const std::string &path)
      : file_(io::detail::openInput(path, ".npy array", io::kMaxTensorFileBytes)) {}
  void readAt(uint64_t offset, void *dst, uint64_t n) override {
    try {
      file_.readAt(offset, dst, n, "array data");
    } catch (const InputError &e) {
      throw FormatError(e.what());
    }
  }
  uint64_t size() const override { return file_.size(); }

private:
  InputFile file_;
};

class Archive {
public:
  explicit Archive(const std::string &path) {
    // A regular file of bounded size, as every input (pipec/input_file.h).
    io::detail::openInput(path, ".npz archive", io::kMaxTensorFileBytes);
    int code = 0;
    zip_ = zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &code);
    if (!zip_) {
      zip_error_t error;
      zip_error_init_with_code(&error, code);
      const std::string why = zip_error_strerror(&error);
      zip_error_fini(&error);
      throw FormatError(path + ": not a readable .npz (zip) archive: " + why);
    }
  }
  ~Archive() { zip_discard(zip_); }
  Archive(const Archive &) = delete;
  Archive &operator=(const Archive &) = delete;
  zip_t *get() const { return zip_; }
  std::string lastError() const { return zip_error_strerror(zip_get_error(zip_)); }

private:
  zip_t *zip_ = nullptr;
};

/// A stored member, read where asked (zip_fseek).
class StoredMemberBytes : public ArrayBytes {
public:
  StoredMemberBytes(std::shared_ptr<Archive> archive, zip_uint64_t index, uint64_t size, std::string where)
      : archive_(std::move(archive)), size_(size), where_(std::move(where)) {
    file_ = zip_fopen_index(archive_->get(), index, 0);
    if (!file_) throw FormatError(where_ + ": cannot open the member: " + archive_->lastError());
  }
  ~StoredMemberBytes() override { zip_fclose(file_); }
  void readAt(uint64_t offset, void *dst, uint64_t n) override {
    if (!io::rangeWithin(offset, n, size_)) throw FormatError(where_ + ": read past the member's end");
    if (zip_fseek(file_, static_cast<zip_int64_t>(offset), SEEK_SET) != 0)
      throw FormatError(where_ + ": cannot seek in the member: " + zip_error_strerror(zip_file_get_error(file_)));
    readExactly(file_, dst, n, where_);
  }
  uint64_t size() const override { return size_; }

  static void readExactly(zip_file_t *file, void *dst, uint64_t n, const std::string &where) {
    char *out = static_cast<char *>(dst);
    while (n > 0) {
      const zip_int64_t got = zip_fread(file, out, n);
      if (got <= 0)
        throw FormatError(where + ": " +
                          (got < 0 ? std::string("cannot read the member: ") + zip_error_strerror(zip_file_get_error(file))
                                   : std::string("the member ends early")));
      out += got;
      n -= static_cast<uint64_t>(got);
    }
  }

private:
  std::shared_ptr<Archive> archive_;
  zip_file_t *file_ = nullptr;
  uint64_t size_;
  std::string where_;
};

/// A compressed member, inflated when the data set opens; with `countOnly`
/// only as far as its .npy header can reach.
class InflatedMemberBytes : public ArrayBytes {
public:
  InflatedMemberBytes(const Archive &archive, zip_uint64_t index, uint64_t size, const std::string &where,
                      bool countOnly)
      : size_(size), where_(where) {
    if (size > kMaxInflatedArrayBytes)
      throw FormatError(where + ": a compressed array of " + std::to_string(size) + " bytes, over the " +
                        std::to_string(kMaxInflatedArrayBytes) +
                        " bytes piperun inflates into memory; save it with np.savez (uncompressed) or convert it "
                        "with pipec-data");
    zip_file_t *file = zip_fopen_index(archive.get(), index, 0);
    if (!file) throw FormatError(where + ": cannot open the member: " + archive.lastError());
    bytes_.resize(countOnly ? std::min<uint64_t>(size, 12 + io::kMaxNpyHeaderBytes) : size);
    try {
      StoredMemberBytes::readExactly(file, bytes_.data(), bytes_.size(), where);
      char extra;
      if (!countOnly && zip_fread(file, &extra, 1) != 0)
        throw FormatError(where + ": the member is longer than its directory says");
    } catch (...) {
      zip_fclose(file);
      throw;
    }
    zip_fclose(file);
  }
  void readAt(uint64_t offset, void *dst, uint64_t n) override {
    if (!io::rangeWithin(offset, n, bytes_.size()))
      throw FormatError(where_ + ": read past " + (bytes_.size() < size_ ? "the header (opened to count)" : "the end"));
    std::memcpy(dst, bytes_.data() + offset, n);
  }
  uint64_t size() const override { return size_; }

private:
  uint64_t size_;
  std::string where_;
  std::string bytes_; // all of it, or with countOnly its beginning
};

class NumpyArrays : public io::DataSource {
public:
  NumpyArrays(const std::string &path, const std::optional<std::set<std::string>> &wanted, bool countOnly)
      : path_(path) {
    struct Found {
      std::unique_ptr<ArrayBytes> bytes;
      std::string where; // the .npy file, or the archive and its member
    };
    std::map<std::string, Found> found; // by field name, sorted
    auto take = [&](const std::string &name, const std::string &where, auto make) {
      if (wanted && !wanted->count(name)) return;
      if (found.count(name)) throw FormatError(path + ": two arrays named " + name);
      found[name] = {make(), where};
    };
    std::error_code error;
    if (fs::is_directory(path, error)) {
      std::vector<fs::path> files;
      for (const auto &entry : fs::directory_iterator(path, error))
        if (endsWithNpy(entry.path().filename().string())) files.push_back(entry.path());
      if (error) throw FormatError(path + ": cannot list the folder (" + error.message() + ")");
      for (const fs::path &file : files) {
        const std::string name = file.filename().string();
        take(withoutSuffix(name), file.string(),
             [&] { return std::make_unique<NpyFileBytes>(file.string()); });
      }
    } else {
      auto archive = std::make_shared<Archive>(path);
      const zip_int64_t entries = zip_get_num_entries(archive->get(), 0);
      for (zip_int64_t i = 0; i < entries; ++i) {
        zip_stat_t st;
        zip_stat_init(&st);
        if (zip_stat_index(archive->get(), static_cast<zip_uint64_t>(i), 0, &st) != 0 || !(st.valid & ZIP_STAT_NAME) ||
            !(st.valid & ZIP_STAT_SIZE) || !(st.valid & ZIP_STAT_COMP_METHOD))
          throw FormatError(path + ": cannot read member #" + std::to_string(i) + ": " + archive->lastError());
        const std::string member = st.name;
        if (!endsWithNpy(member)) continue;
        const std::string where = path + ": " + member;
        take(withoutSuffix(member), where, [&]() -> std::unique_ptr<ArrayBytes> {
          if (st.comp_method == ZIP_CM_STORE)
            return std::make_unique<StoredMemberBytes>(archive, static_cast<zip_uint64_t>(i), st.size, where);
          return std::make_unique<InflatedMemberBytes>(*archive, static_cast<zip_uint64_t>(i), st.size, where,
                                                       countOnly);
        });
      }
    }
    if (found.empty())
      throw FormatError(path + ": no .npy arrays" +
                        (wanted ? " named after the model's data fields (" + joined(*wanted) + ")" : std::string()));
    for (auto &[name, array] : found) {
      const std::unique_ptr<ArrayBytes> &bytes = array.bytes;
      const std::string &where = array.where;
      const io::NpyHeader header = io::readNpyHeader(
          where, bytes->size(), [&](uint64_t offset, void *dst, uint64_t n) { bytes->readAt(offset, dst, n); });
      const int dtype = io::dtypeOfNumpyDescr(header.descr);
      if (dtype == 0)
        throw FormatError(where + ": dtype '" + header.descr +
                          "' is not one of <f4, <f8, <i8, <i4, |b1 (float32, float64, int64, int32, bool)");
      if (header.shape.empty())
        throw FormatError(where + ": a scalar; a field's array has the samples as its first dimension");
      io::FieldSpec field;
      field.name = name;
      field.dtype = dtype;
      field.shape.assign(header.shape.begin() + 1, header.shape.end());
      const uint64_t samples = static_cast<uint64_t>(header.shape[0]);
      if (samples == 0) throw FormatError(where + ": no samples (its first dimension is 0)");
      if (!fields_.empty() && samples != samples_)
        throw FormatError(path + ": array " + name + " has " + std::to_string(samples) + " samples, array " +
                          fields_.front().name + " " + std::to_string(samples_) +
                          " (every field's first dimension is the sample count)");
      samples_ = samples;
      fields_.push_back(field);
      arrays_.push_back({std::move(array.bytes), header.dataOffset});
    }
  }

  const std::vector<io::FieldSpec> &fields() const override { return fields_; }
  uint64_t numSamples() const override { return samples_; }
  std::string describe() const override { return path_; }
  void read(size_t field, uint64_t first, uint64_t count, void *dst) override {
    const uint64_t sampleBytes = fields_[field].sampleBytes(); // x samples_ is the array's data (parseNpyHeader)
    char *out = static_cast<char *>(dst);
    while (count > 0) { // one read per run of samples up to the wrap
      const uint64_t start = first % samples_, run = std::min<uint64_t>(count, samples_ - start);
      arrays_[field].bytes->readAt(arrays_[field].dataOffset + start * sampleBytes, out, run * sampleBytes);
      out += run * sampleBytes;
      first += run;
      count -= run;
    }
  }

private:
  static std::string joined(const std::set<std::string> &names) {
    std::string out;
    for (const std::string &n : names) out += (out.empty() ? "" : ", ") + n;
    return out;
  }

  struct Array {
    std::unique_ptr<ArrayBytes> bytes;
    uint64_t dataOffset;
  };
  std::string path_;
  std::vector<io::FieldSpec> fields_;
  std::vector<Array> arrays_;
  uint64_t samples_ = 0;
};

} // namespace

std::unique_ptr<io::DataSource> openNumpyArrays(const std::string &path,
                                                const std::optional<std::set<std::string>> &wanted, bool countOnly) {
  return std::make_unique<NumpyArrays>(path, wanted, countOnly);
}

bool isNumpyArrays(const std::string &path) {
  std::error_code error;
  if (fs::is_directory(path, error)) return true;
  if (!fs::is_regular_file(path, error)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  const bool zip = in.gcount() == 4 && (std::memcmp(magic, "PK\x03\x04", 4) == 0 ||
                                        std::memcmp(magic, "PK\x05\x06", 4) == 0); // an empty archive
  return zip || fs::path(path).extension() == ".npz";
}

} // namespace pipec::rt
