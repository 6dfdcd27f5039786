// libFuzzer target: the named-tensor file reader (runtime/include/pipec/
// tensor_file.h) behind stage weights, checkpoint tensors and exported
// weights: readTensorFile(path) as StageModel::loadWeights/loadCheckpoint
// call it. A tensor it returns must hold exactly shape x dtype bytes, and no
// more data than the file had.
#include "FuzzSupport.h"

#include "pipec/input_file.h"

#include "pipec/tensor_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string path = pipec::fuzz::writeInput("weights.bin", data, size);
  try {
    const std::vector<pipec::io::Tensor> tensors = pipec::io::readTensorFile(path);
    unsigned __int128 total = 0;
    for (const pipec::io::Tensor &t : tensors) {
      if (pipec::io::dtypeSize(t.dtype) == 0) pipec::fuzz::violated("tensor with an unknown dtype accepted");
      unsigned __int128 elements = 1;
      for (int64_t d : t.shape) {
        if (d < 0) pipec::fuzz::violated("tensor with a negative dimension accepted");
        elements *= (unsigned __int128)d;
        if (elements > ((unsigned __int128)1 << 64)) break;
      }
      if (elements * pipec::io::dtypeSize(t.dtype) != t.data.size())
        pipec::fuzz::violated("tensor data size disagrees with its shape and dtype");
      total += t.data.size();
    }
    if (total > size) pipec::fuzz::violated("more tensor data than file bytes");
  } catch (const pipec::io::FormatError &) {
  } catch (const pipec::io::InputError &) {
  }
  return 0;
}
