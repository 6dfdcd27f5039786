// libFuzzer target: piperun's NumPy data sets (runtime/src/NumpyArrays.cpp,
// pipec/npy.h): the input opened as an .npz archive and as the one .npy file
// of a folder, then reads of a few samples of every field the way the
// Executor reads micro-batches (including the wrap at the end). An accepted
// field has a known dtype and non-negative dimensions.
#include "FuzzSupport.h"

#include "NumpyArrays.h"

#include <filesystem>
#include <vector>

namespace {

void readAll(const std::string &path) {
  try {
    std::unique_ptr<pipec::io::DataSource> arrays = pipec::rt::openNumpyArrays(path, std::nullopt);
    const uint64_t samples = arrays->numSamples();
    if (samples == 0) pipec::fuzz::violated("arrays with no samples accepted");
    std::vector<char> buffer;
    for (size_t k = 0; k < arrays->fields().size(); ++k) {
      const pipec::io::FieldSpec &f = arrays->fields()[k];
      if (pipec::io::dtypeSize(f.dtype) == 0) pipec::fuzz::violated("an array with an unknown dtype accepted");
      for (int64_t d : f.shape)
        if (d < 0) pipec::fuzz::violated("an array with a negative dimension accepted");
      const uint64_t count = samples < 3 ? samples + 1 : 3; // wraps when samples < 3
      if (f.sampleBytes() > (64u << 20) / count) continue; // a huge sample of an accepted (large) array
      buffer.assign(f.sampleBytes() * count, 0);
      arrays->read(k, samples - 1, count, buffer.data());
    }
  } catch (const pipec::io::FormatError &) {
  } catch (const pipec::io::InputError &) {
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  readAll(pipec::fuzz::writeInput("data.npz", data, size));
  std::filesystem::create_directories(pipec::fuzz::scratchDir() / "folder");
  pipec::fuzz::writeInput("folder/x.npy", data, size);
  readAll((pipec::fuzz::scratchDir() / "folder").string());
  return 0;
}
