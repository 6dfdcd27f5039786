// The trained weights as one safetensors file (`--export-weights
// OUT.safetensors`, docs/weights-format.md): every virtual stage's
// parameters and buffers, keyed by their ONNX initializer names.
#pragma once

#include "pipec/tensor_file.h"

#include <string>
#include <vector>

namespace pipec::rt {

/// Whether --export-weights names one safetensors file (it ends in
/// .safetensors) rather than a folder of stage files.
bool isSafetensorsPath(const std::string &path);

/// Writes `stages[vs]` (each virtual stage's weight tensors) as one file at
/// `path`, atomically. A tensor several stages hold (a tied parameter) is
/// written once, after checking that the copies are equal. Throws Error.
void writeSafetensors(const std::string &path, const std::vector<std::vector<io::Tensor>> &stages);

} // namespace pipec::rt
