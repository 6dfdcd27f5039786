#ifndef PIPEC_COMPILER_DRIVER_JOBPROGRESS_H
#define PIPEC_COMPILER_DRIVER_JOBPROGRESS_H

// What the job writer is doing, for a user compiling a model whose weights
// take minutes to write (docs/scale.md, "Progress"): on a terminal one line
// per stage, rewritten in place with the bytes written and the rate; in a
// log (not a terminal) one line per stage when it is done, and only for a
// job of at least kLoggedJobBytes of weights, so that small jobs' logs stay
// quiet.

#include "llvm/Support/raw_ostream.h"

#include <chrono>
#include <cstdint>
#include <string>

namespace pipec {

class JobProgress {
public:
  static constexpr uint64_t kLoggedJobBytes = uint64_t(256) << 20;

  /// `os` is where the lines go (standard error); `terminal` whether it is
  /// one; `stages` and `weightBytes` the job's totals.
  JobProgress(llvm::raw_ostream &os, bool terminal, int stages, uint64_t weightBytes);

  /// A stage begins: `name` ("stage_3") with `weightBytes` to write.
  void beginStage(const std::string &name, uint64_t weightBytes);
  /// Its code was emitted: `bytes` of source.
  void emitted(uint64_t bytes);
  /// `bytes` more of its weights were written.
  void wrote(uint64_t bytes);
  /// Its weights are written; its library is being built.
  void building();
  /// The stage is done (built when building() was called).
  void endStage();

private:
  using Clock = std::chrono::steady_clock;
  void draw(bool final);
  double seconds(Clock::time_point since) const;

  llvm::raw_ostream &os_;
  bool live_, logged_;
  int stages_, index_ = 0;
  uint64_t jobBytes_, jobWritten_ = 0;
  std::string name_;
  uint64_t stageBytes_ = 0, stageWritten_ = 0, sourceBytes_ = 0;
  bool building_ = false;
  Clock::time_point stageStart_, weightsStart_, weightsEnd_, buildStart_, lastDraw_;
};

} // namespace pipec

#endif
