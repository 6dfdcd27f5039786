// libFuzzer target: piperun's --data reader (runtime/include/pipec/
// dataset.h): the DatasetFile constructor, then reads of a few samples of
// every field the way the Executor reads micro-batches (including the wrap
// at the end of the data set). An accepted data set must fit in its file.
#include "FuzzSupport.h"

#include "pipec/input_file.h"

#include "pipec/dataset.h"

#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string path = pipec::fuzz::writeInput("data.bin", data, size);
  try {
    pipec::io::DatasetFile file(path);
    const uint64_t samples = file.numSamples();
    if (samples == 0) pipec::fuzz::violated("a data set with no samples accepted");
    unsigned __int128 total = 0;
    for (const pipec::io::FieldSpec &f : file.fields()) {
      if (pipec::io::dtypeSize(f.dtype) == 0) pipec::fuzz::violated("a field with an unknown dtype accepted");
      unsigned __int128 elements = 1;
      for (int64_t d : f.shape) {
        if (d < 0) pipec::fuzz::violated("a field with a negative dimension accepted");
        elements *= (unsigned __int128)d;
        if (elements > ((unsigned __int128)1 << 64)) break;
      }
      total += elements * pipec::io::dtypeSize(f.dtype) * samples;
    }
    if (total > size) pipec::fuzz::violated("the fields need more bytes than the data set file holds");
    std::vector<char> buffer;
    for (size_t k = 0; k < file.fields().size(); ++k) {
      const size_t sampleBytes = file.fields()[k].sampleBytes();
      const uint64_t count = samples < 3 ? samples + 1 : 3; // wraps when samples < 3
      buffer.assign(sampleBytes * count, 0);
      file.read(k, samples - 1, count, buffer.data());
    }
  } catch (const pipec::io::FormatError &) {
  } catch (const pipec::io::InputError &) {
  }
  return 0;
}
