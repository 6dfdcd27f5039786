// NumPy .npy files (format version 1.0, little-endian, C order) to and from
// HostTensor: how the reference tools exchange tensors with Python oracles.
#ifndef PIPEC_COMPILER_IMPORT_NPY_H
#define PIPEC_COMPILER_IMPORT_NPY_H

#include "compiler/Import/HostTensor.h"

#include <optional>
#include <string>

namespace pipec::import {

/// Reads <f4, <f8, <i8, <i4, |b1, |u1 and |i1 arrays; nullopt with `error` set otherwise.
std::optional<HostTensor> readNpy(const std::string &path, std::string &error);
/// Writes the tensor in its element type (float32 as <f4, ...).
bool writeNpy(const std::string &path, const HostTensor &tensor, std::string &error);

} // namespace pipec::import

#endif // PIPEC_COMPILER_IMPORT_NPY_H
