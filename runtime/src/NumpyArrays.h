// A data set of NumPy arrays (docs/dataset-format.md, "Arrays"): an .npz
// archive (np.savez or np.savez_compressed) or a folder of .npy files, one
// array per field, named after the model's inputs and labels, the first
// dimension the samples.
#pragma once

#include "pipec/dataset.h"

#include <memory>
#include <optional>
#include <set>
#include <string>

namespace pipec::rt {

/// The arrays of `path` (an .npz file or a folder of .npy files) as a data
/// source. With `wanted`, only the arrays of those names are fields (an
/// archive may hold others, which are not read); they must agree on the
/// number of samples. Throws io::FormatError naming the file and the array.
/// `countOnly`: the caller needs the fields and the sample count, never a
/// sample, so compressed members are not inflated (only their headers).
std::unique_ptr<io::DataSource> openNumpyArrays(const std::string &path,
                                                const std::optional<std::set<std::string>> &wanted,
                                                bool countOnly = false);

/// Whether `path` is a folder, an .npz file, or a file that starts as a zip
/// archive does: a data set for openNumpyArrays rather than a PIPECDS1 file.
bool isNumpyArrays(const std::string &path);

} // namespace pipec::rt
