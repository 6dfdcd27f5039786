#include "compiler/Driver/JobProgress.h"

#include "analysis/Partition/Topology.h"

namespace pipec {

JobProgress::JobProgress(llvm::raw_ostream &os, bool terminal, int stages, uint64_t weightBytes)
    : os_(os), live_(terminal), logged_(terminal || weightBytes >= kLoggedJobBytes), stages_(stages),
      jobBytes_(weightBytes) {}

double JobProgress::seconds(Clock::time_point since) const {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

void JobProgress::beginStage(const std::string &name, uint64_t weightBytes) {
  ++index_;
  name_ = name;
  stageBytes_ = weightBytes;
  stageWritten_ = sourceBytes_ = 0;
  building_ = false;
  stageStart_ = weightsStart_ = weightsEnd_ = lastDraw_ = Clock::now();
}

void JobProgress::emitted(uint64_t bytes) {
  sourceBytes_ = bytes;
  weightsStart_ = weightsEnd_ = Clock::now();
  if (live_)
    draw(false);
}

void JobProgress::wrote(uint64_t bytes) {
  stageWritten_ += bytes;
  jobWritten_ += bytes;
  weightsEnd_ = Clock::now();
  // A terminal is redrawn four times a second at most.
  if (live_ && seconds(lastDraw_) >= 0.25)
    draw(false);
}

void JobProgress::building() {
  building_ = true;
  buildStart_ = Clock::now();
  if (live_)
    draw(false);
}

void JobProgress::endStage() {
  if (logged_)
    draw(true);
}

void JobProgress::draw(bool final) {
  using partition::formatBytes;
  lastDraw_ = Clock::now();
  const double weightSeconds = std::chrono::duration<double>(weightsEnd_ - weightsStart_).count();
  std::string line = "pipec: " + name_ + " (" + std::to_string(index_) + "/" + std::to_string(stages_) +
                     "): code " + formatBytes(static_cast<double>(sourceBytes_)) + ", weights " +
                     formatBytes(static_cast<double>(stageWritten_)) + " of " +
                     formatBytes(static_cast<double>(stageBytes_));
  if (weightSeconds > 0.05)
    line += " (" + formatBytes(static_cast<double>(stageWritten_) / weightSeconds) + "/s)";
  if (building_)
    line += final ? ", built in " + std::to_string(static_cast<int>(seconds(buildStart_) + 0.5)) + " s"
                  : ", building";
  line += "; job " + formatBytes(static_cast<double>(jobWritten_)) + " of " +
          formatBytes(static_cast<double>(jobBytes_)) + ", " +
          std::to_string(static_cast<int>(seconds(stageStart_) + 0.5)) + " s this stage";
  if (live_)
    os_ << "\r" << line << "\x1b[K" << (final ? "\n" : "");
  else
    os_ << line << "\n";
  os_.flush();
}

} // namespace pipec
