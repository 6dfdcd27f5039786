#include "compiler/Driver/JobProgress.h"

#include "llvm/Support/raw_ostream.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

using pipec::JobProgress;

namespace {
constexpr uint64_t MiB = uint64_t(1) << 20;

/// Two stages of `perStage` bytes each, written in four pieces, the second built.
std::string run(bool terminal, uint64_t perStage) {
  std::string out;
  llvm::raw_string_ostream os(out);
  JobProgress progress(os, terminal, 2, 2 * perStage);
  for (int s = 0; s < 2; ++s) {
    progress.beginStage("stage_" + std::to_string(s), perStage);
    progress.emitted(2048);
    for (int piece = 0; piece < 4; ++piece)
      progress.wrote(perStage / 4);
    if (s == 1)
      progress.building();
    progress.endStage();
  }
  os.flush();
  return out;
}
} // namespace

TEST(JobProgress, ALogGetsOneLinePerStageOfABigJob) {
  const std::string log = run(false, 200 * MiB);
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 2) << log;
  EXPECT_EQ(log.find('\r'), std::string::npos) << log;
  EXPECT_NE(log.find("pipec: stage_0 (1/2): code 2.0 KiB, weights 200.0 MiB of 200.0 MiB"), std::string::npos) << log;
  EXPECT_NE(log.find("; job 200.0 MiB of 400.0 MiB"), std::string::npos) << log;
  EXPECT_NE(log.find("pipec: stage_1 (2/2): code 2.0 KiB, weights 200.0 MiB of 200.0 MiB"), std::string::npos) << log;
  EXPECT_NE(log.find(", built in "), std::string::npos) << log;
  EXPECT_NE(log.find("; job 400.0 MiB of 400.0 MiB"), std::string::npos) << log;
}

TEST(JobProgress, ASmallJobsLogStaysQuiet) {
  // Under JobProgress::kLoggedJobBytes in all: nothing in a log.
  EXPECT_EQ(run(false, JobProgress::kLoggedJobBytes / 4), "");
}

TEST(JobProgress, ATerminalLineIsRewrittenInPlace) {
  // Any job on a terminal: lines start with a carriage return, end by
  // clearing the rest of the line, and each stage ends with a newline.
  const std::string tty = run(true, MiB);
  EXPECT_EQ(tty.front(), '\r');
  EXPECT_EQ(std::count(tty.begin(), tty.end(), '\n'), 2) << tty;
  EXPECT_NE(tty.find(", building; job"), std::string::npos) << tty;
  EXPECT_NE(tty.find("\x1b[K"), std::string::npos);
}
