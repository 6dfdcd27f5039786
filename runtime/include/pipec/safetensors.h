// Hugging Face's safetensors format (docs/weights-format.md, "safetensors"):
// an 8-byte little-endian header length N, N bytes of JSON
// {"NAME": {"dtype": "F32", "shape": [...], "data_offsets": [BEGIN, END]},
//  ..., "__metadata__": {"format": "pt"}}, padded with spaces to a multiple
// of 8, then the tensors' bytes back to back (offsets from the data's
// start). The writer of `piperun --export-weights OUT.safetensors`; files
// load with safetensors' load_file and, keyed by ONNX initializer names, into
// the PyTorch model the ONNX came from. Header-only, plain C++17.
#pragma once

#include "pipec/tensor_file.h"

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

namespace pipec::io {

inline const char *safetensorsDtype(int dtype) {
  switch (dtype) {
  case PIPEC_F32: return "F32";
  case PIPEC_F64: return "F64";
  case PIPEC_I64: return "I64";
  case PIPEC_I32: return "I32";
  case PIPEC_BOOL: return "BOOL";
  case PIPEC_BF16: return "BF16";
  default: throw FormatError("no safetensors dtype for pipec dtype " + std::to_string(dtype));
  }
}

/// The file's bytes: tensors in name order (their names must differ),
/// `metadata` as the header's "__metadata__" (string to string, as the
/// format requires; "format": "pt" tells transformers the layout is
/// PyTorch's).
inline std::string encodeSafetensors(std::vector<const Tensor *> tensors,
                                     const std::map<std::string, std::string> &metadata) {
  std::sort(tensors.begin(), tensors.end(), [](const Tensor *a, const Tensor *b) { return a->name < b->name; });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor &t = *tensors[i];
    if (i > 0 && tensors[i - 1]->name == t.name) throw FormatError("two tensors named " + t.name);
    if (t.name == "__metadata__") throw FormatError("a tensor named __metadata__, the format's own key");
    if (t.data.size() != t.bytes())
      throw FormatError("tensor " + t.name + ": " + std::to_string(t.data.size()) + " data bytes for shape " +
                        shapeString(t.shape) + " " + dtypeName(t.dtype));
    header[t.name] = {{"dtype", safetensorsDtype(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out;
  detail::putv<uint64_t>(out, text.size());
  out += text;
  out.reserve(out.size() + offset);
  for (const Tensor *t : tensors) detail::put(out, t->data.data(), t->data.size());
  return out;
}

} // namespace pipec::io
