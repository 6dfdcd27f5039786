#include "SafetensorsExport.h"

#include "Plan.h"

#include "pipec/safetensors.h"

#include <map>

namespace pipec::rt {

bool isSafetensorsPath(const std::string &path) {
  const std::string suffix = ".safetensors";
  return path.size() > suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void writeSafetensors(const std::string &path, const std::vector<std::vector<io::Tensor>> &stages) {
  std::map<std::string, std::pair<const io::Tensor *, size_t>> byName; // tensor, first stage holding it
  for (size_t vs = 0; vs < stages.size(); ++vs)
    for (const io::Tensor &t : stages[vs]) {
      auto [it, inserted] = byName.emplace(t.name, std::make_pair(&t, vs));
      const io::Tensor &first = *it->second.first;
      if (!inserted && (first.dtype != t.dtype || first.shape != t.shape || first.data != t.data))
        throw Error(path + ": parameter " + t.name + " is held by stages " + std::to_string(it->second.second) +
                    " and " + std::to_string(vs) + " (tied) but the copies differ; not writing either");
    }
  std::vector<const io::Tensor *> tensors;
  for (const auto &[name, held] : byName) tensors.push_back(held.first);
  try {
    io::detail::writeFileAtomically(path, io::encodeSafetensors(tensors, {{"format", "pt"}}));
  } catch (const io::FormatError &e) {
    throw Error(path + ": " + e.what());
  }
}

} // namespace pipec::rt
