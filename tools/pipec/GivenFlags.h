// What `pipec partition` and `pipec schedule` (and the top level's shared
// flags) do after llvm::cl has parsed: hand each flag that was given to the
// analysis library's one checker of its value.
#ifndef PIPEC_TOOLS_PIPEC_GIVENFLAGS_H
#define PIPEC_TOOLS_PIPEC_GIVENFLAGS_H

#include "llvm/Support/CommandLine.h"

#include <string>
#include <vector>

namespace pipec::tools {

/// Calls apply("--name", text) for every given option: its value, or "" for
/// a bare flag.
template <class Apply>
void applyGivenFlags(const std::vector<llvm::cl::opt<std::string> *> &valued,
                     const std::vector<llvm::cl::opt<bool> *> &bare, Apply apply) {
  for (llvm::cl::opt<std::string> *option : valued)
    if (option->getNumOccurrences() > 0)
      apply("--" + option->ArgStr.str(), *option);
  for (llvm::cl::opt<bool> *option : bare)
    if (option->getNumOccurrences() > 0)
      apply("--" + option->ArgStr.str(), std::string());
}

} // namespace pipec::tools

#endif
