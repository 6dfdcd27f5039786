// The command line of piperun and pipeseq (docs/runtime.md): one parser,
// built on CLI11, for both tools. pipeseq takes the options of piperun that
// change what is computed; piperun adds those of a distributed run (logging,
// checkpoints, trace, profile, watchdog). Numbers are checked by JobCheck.h's
// parsers as they are read; the optimizer's values later, with plan.json's
// (resolveOptimizer).
#pragma once

#include "RunOptions.h"

#include <string>

namespace pipec::rt {

enum class Tool { Piperun, Pipeseq };

struct CommandLine {
  enum Outcome { Run, Help, Invalid } outcome = Run;
  std::string error; // Invalid: what is wrong, naming the option ("--iters: \"0\" is out of range ...")
  std::string help;  // the --help text (also shown after an error)
  int threads = 0;   // piperun's --threads N (1 .. kMaxThreads); 0: not given (docs/runtime.md, "Threads")
};

inline constexpr int kMaxThreads = 1024;

// Fills `opt` from argv; prints nothing and throws nothing.
CommandLine parseCommandLine(Tool tool, int argc, char **argv, RunOptions &opt);

} // namespace pipec::rt
