// libFuzzer target: a schedule in PyTorch's CSV format, through
// runScheduleCommand as `pipec schedule --from-csv FILE --to-csv OUT` runs it
// (scheduleFromCsv, the validator, the simulator, toCsv). The command reports
// a bad file as "pipec schedule: ..." and returns 1; anything escaping it
// would terminate pipec, so it is a finding. A file it accepts must read
// back from the CSV it writes.
#include "FuzzSupport.h"

#include "analysis/Schedule/Schedule.h"

#include <sstream>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string path = pipec::fuzz::writeInput("schedule.csv", data, size);
  const std::string out = (pipec::fuzz::scratchDir() / "written.csv").string();
  pipec::schedule::ScheduleCliOptions options;
  pipec::schedule::applyScheduleTokens(options, {"--from-csv", path, "--to-csv", out, "--activation-limit", "64"});
  std::ostringstream stdoutText, stderrText;
  const int status = pipec::schedule::runScheduleCommand(options, stdoutText, stderrText);
  if (status != 0 && stderrText.str().find("pipec schedule: ") == std::string::npos)
    pipec::fuzz::violated("a refused file without a message");
  if (status == 0) {
    pipec::schedule::ScheduleCliOptions again;
    pipec::schedule::applyScheduleTokens(again, {"--from-csv", out});
    std::ostringstream o, e;
    if (pipec::schedule::runScheduleCommand(again, o, e) != 0)
      pipec::fuzz::violated("the CSV written from an accepted schedule does not read back");
  }
  return 0;
}
